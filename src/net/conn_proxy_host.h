// ConnProxy's hooks bound to sbxd's NetworkHost: the sandbox of a pool address, its live rules,
// the NameTable, the DenialLog, and the destinations the host must never connect to for a
// sandbox (the forward chain's refusals, which the proxy's own connections do not pass).
#pragma once

#include <optional>
#include <string>

#include "net/conn_proxy.h"
#include "net/sandbox_net.h"

namespace sbx::net {

// `host` outlives the proxy.
ProxyHooks ProxyHooksFor(NetworkHost* host);

// The reason the host refuses to connect to `dest` on a sandbox's behalf: the pool
// (other_sandbox), an always-blocked range not exempted (its reason; metadata always), the
// operator's deny list (deny_rule), one of the host's own addresses (host). nullopt: none.
std::optional<std::string> ForbiddenDestination(const NetPolicyConfig& cfg, const IpPrefix& dest);

}  // namespace sbx::net

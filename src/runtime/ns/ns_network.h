// The network step of a networked sandbox's create (docs/isolation.md §2.2 step 12b): its veth,
// addresses and nftables elements, built by sbxd's NetworkHost (src/net) in the network
// namespace the sandbox is about to be launched into. `none` never comes here: it keeps the
// loopback-only namespace of §2.3a, exactly as before.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "net/sandbox_net.h"
#include "runtime/ns/netns_pool.h"
#include "runtime/backend.h"

namespace sbx::runtime::ns {

// `egress`: SandboxSpec::egress (net::ResolvedEgress::ToJson()). FailedPrecondition when this
// sbxd has networking off (`host` null): the sandbox was stored as networked by an sbxd that
// had it on, and must not silently come up without the rules it asked for.
// Sets `*netns` to the sandbox's network namespace: a networked one of `pool` (null: none)
// claimed for `id` when it has one ready, else a loopback-only one of the pool or a new one,
// with the network built in it.
absl::StatusOr<std::unique_ptr<net::SandboxNetwork>> AttachNetwork(net::NetworkHost* host,
                                                                   const std::string& id,
                                                                   const nlohmann::json& egress,
                                                                   NetnsPool* pool, UniqueFd* netns);

// A network-ready warm-pool member's (SandboxSpec::network_ready): a networked namespace of
// `pool` when it has one ready, else one built now (BuildNetworkedNetns), its network claimed by
// no sandbox: it passes nothing until ClaimNetwork. FailedPrecondition when networking is off.
absl::StatusOr<std::unique_ptr<net::SandboxNetwork>> PrebuildNetwork(net::NetworkHost* host,
                                                                     const std::string& id,
                                                                     NetnsPool* pool,
                                                                     UniqueFd* netns);

// Gives the unclaimed `network` of a network-ready sandbox to sandbox `id` with `egress`
// (NetworkHost::Claim: its nftables elements in one transaction, then the veth's alias).
absl::Status ClaimNetwork(net::NetworkHost* host, const std::string& id,
                          const nlohmann::json& egress, net::SandboxNetwork& network);

// After a restart: the network sandbox `id` still has, or null when it has none (a `none`
// sandbox, or networking off). `egress`: what NetworkPolicyJson persisted (null when the record
// predates it: the network comes back without its rules by name, so no name resolves for it).
std::unique_ptr<net::SandboxNetwork> AdoptNetwork(net::NetworkHost* host, const std::string& id,
                                                  const nlohmann::json& egress = nullptr);

// The policy a live network's rules are read from, for the instance's persisted record (null
// without a network or a known policy).
nlohmann::json NetworkPolicyJson(const net::SandboxNetwork* network);

// A networked sandbox's own /etc/resolv.conf, naming sbxd's resolver (net/dns_server.h): the
// file <dir>/resolv.conf, made empty here (step 7 plans its bind, and the plan stats its
// source) and written by WriteResolvConf once the veth's addresses exist (step 12b, before the
// launch mounts it). Bound read-only over the template's /etc/resolv.conf, or over the file a
// symbolic link there names (systemd-resolved's /run/systemd/resolve/stub-resolv.conf): the
// bind cannot sit on a link.
absl::StatusOr<BindMount> PlanResolvConf(const TemplateSpec& tmpl, const std::string& dir);
absl::Status WriteResolvConf(const std::string& dir, const net::SandboxNetwork& network);

}  // namespace sbx::runtime::ns

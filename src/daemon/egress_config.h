// The egress keys of the configuration turned into what src/net reads: the host's policy
// (NetworkHost::Start) and the profile catalog (create, GET /v1/egress-profiles).
#pragma once

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "net/dns_policy.h"
#include "net/nft_ruleset.h"
#include "net/profiles.h"

namespace sbx::daemon {

struct EgressSetup {
  net::NetPolicyConfig policy;
  net::ProfileCatalog catalog;
  // egress.dns_upstream parsed (empty when the key is: the caller reads the host's resolv.conf).
  std::vector<net::DnsUpstream> dns_upstreams;
};

// InvalidArgument naming each bad key (egress.pool_v4, egress.exempt, egress.profiles.NAME...),
// every problem joined by "; ". Checked whether or not egress.enabled is set, so a mistake shows
// before the day networking is turned on.
absl::StatusOr<EgressSetup> EgressFromConfig(const Config& c);

}  // namespace sbx::daemon

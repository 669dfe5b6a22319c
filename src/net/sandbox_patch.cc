// NetworkHost's part of a PATCH of egress rules and of the limits (issue 16): kept apart from
// sandbox_net.cc, whose create and teardown steps it only hooks into.
#include <netinet/in.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "net/conntrack.h"
#include "net/limits.h"
#include "net/sandbox_net.h"

namespace sbx::net {
namespace {

bool RuleMatchesFlow(const EgressRule& r, const Flow& f) {
  // A domain rule is judged by name (PatchAllow), never by address.
  if (r.is_domain()) return false;
  if (r.dest.family != f.dst.family || !r.dest.Contains(f.dst)) return false;
  const bool has_ports = f.proto == IPPROTO_TCP || f.proto == IPPROTO_UDP;
  if (r.any_port()) {
    if (r.protocol == Protocol::kAny) return true;
    return f.proto == (r.protocol == Protocol::kTcp ? IPPROTO_TCP : IPPROTO_UDP);
  }
  // A port range with protocol "any" means TCP and UDP (egress_rules.h), as the nft rules say.
  if (!has_ports) return false;
  if (r.protocol == Protocol::kTcp && f.proto != IPPROTO_TCP) return false;
  if (r.protocol == Protocol::kUdp && f.proto != IPPROTO_UDP) return false;
  return f.dport >= r.port_lo && f.dport <= r.port_hi;
}

}  // namespace

bool RulesAllowFlow(const std::vector<EgressRule>& deny, const std::vector<EgressRule>& allow,
                    const Flow& f) {
  for (const auto& d : deny) {
    if (RuleMatchesFlow(d, f)) return false;
  }
  for (const auto& a : allow) {
    if (RuleMatchesFlow(a, f)) return true;
  }
  return false;
}

absl::Status NetworkHost::LimitRate(const std::string& id, int host_ifindex, int netns_fd,
                                    int sandbox_ifindex) {
  if (cfg_.rate_mbit == 0) return absl::OkStatus();
  SBX_ASSIGN_OR_RETURN(TrafficControl host, TrafficControl::Open());
  SBX_RETURN_IF_ERROR(Annotate(host.LimitRate(host_ifindex, cfg_.rate_mbit),
                               fmt::format("sandbox {}: bandwidth limit toward it", id)));
  if (sandbox_ifindex == 0) return absl::OkStatus();  // a tap: no sandbox end on this host
  SBX_ASSIGN_OR_RETURN(TrafficControl inside, TrafficControl::Open(netns_fd));
  return Annotate(inside.LimitRate(sandbox_ifindex, cfg_.rate_mbit),
                  fmt::format("sandbox {}: bandwidth limit from it", id));
}

absl::StatusOr<int> NetworkHost::PatchAllow(const std::string& id, const std::string& profile,
                                            const std::vector<EgressRule>& allow) {
  // One PATCH at a time: two interleaved ones could leave the chain of the first and the
  // conntrack cut of the second.
  std::lock_guard patch_lock(patch_mu_);
  if (!IsSafeName(id)) return absl::InvalidArgumentError(fmt::format("network: '{}' is not a sandbox id", id));
  std::string veth;
  SandboxAddrs addrs;
  bool own_chain = false;
  {
    std::lock_guard lock(mu_);
    auto it = net_of_id_.find(id);
    if (it == net_of_id_.end()) return absl::NotFoundError(fmt::format("sandbox {}: no network", id));
    veth = it->second->veth_;
    addrs = it->second->addrs_;
    own_chain = it->second->narrowed_;
  }
  SBX_RETURN_IF_ERROR(nft_->Run(PatchSandboxRuleset(id, veth, cfg_, profile, allow, own_chain),
                                fmt::format("sandbox {}: replace its egress rules", id)));
  const SandboxPolicy policy{.profile = profile, .narrowed = allow};
  {
    // The teardown must now delete the chain; the network may be gone meanwhile (then the
    // sweep finds the chain, named after the id, and removes it).
    std::lock_guard lock(mu_);
    auto it = net_of_id_.find(id);
    if (it != net_of_id_.end()) it->second->narrowed_ = true;
  }
  // The resolver and the Host/SNI proxy read the rules from here (RulesOf).
  (void)SetPolicy(id, policy);
  const EffectiveRules rules = RulesOfPolicy(policy);
  if (cut_hook_) cut_hook_(id, rules);
  SBX_ASSIGN_OR_RETURN(Conntrack ct, Conntrack::Open());
  auto keep = [&](const Flow& f) {
    if (RulesAllowFlow(rules.deny, rules.allow, f)) return true;
    // Under domain rules: a TCP flow to an address an allowed name resolved to for this
    // sandbox stays (the Host/SNI check judged it by that name when it began).
    if (f.proto != IPPROTO_TCP || !HasDomainRules(rules.allow)) return false;
    for (const std::string& name : names_.NamesOf(id, f.dst)) {
      if (NameAllowed(rules.allow, rules.deny, name, f.dport)) return true;
    }
    return false;
  };
  auto cut = ct.Cut({addrs.sandbox4, addrs.sandbox6}, keep);
  if (!cut.ok()) return Annotate(cut.status(), fmt::format("sandbox {}: cut the flows its new rules forbid", id));
  if (*cut > 0) spdlog::info("sandbox {}: egress rules replaced; {} open flows cut", id, *cut);
  return *cut;
}

absl::Status NetworkHost::StartDenialReader() {
  SBX_ASSIGN_OR_RETURN(denial_reader_, NflogReader::Start([this](const LoggedPacket& p) {
    std::optional<std::string> id = IdOfIfindex(p.in_ifindex);
    if (!id) return;  // a sandbox already gone
    Denial d{.time = absl::Now(),
             .reason = p.reason,
             .dest = p.dst.family != 0 ? p.dst.AddressString() : "",
             .name = "",
             .protocol = p.protocol,
             .port = p.port};
    if (!p.dst.family) d.protocol = p.protocol.empty() ? "ip" : p.protocol;
    // The nft counters count these (the log is rate limited): recorded, not counted again.
    denials_log_.Record(*id, std::move(d), /*count=*/false);
  }));
  return absl::OkStatus();
}

}  // namespace sbx::net

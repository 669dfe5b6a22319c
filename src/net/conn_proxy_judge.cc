#include "net/conn_proxy_judge.h"

namespace sbx::net {

bool CidrRuleAdmits(const EgressRule& rule, const IpPrefix& dest, uint16_t port) {
  if (rule.is_domain()) return false;
  if (rule.protocol == Protocol::kUdp) return false;
  if (rule.dest.family != dest.family || !rule.dest.Contains(dest)) return false;
  return rule.any_port() || (port >= rule.port_lo && port <= rule.port_hi);
}

CidrVerdict JudgeCidr(const EffectiveRules& rules, const IpPrefix& dest, uint16_t port) {
  for (const auto& d : rules.deny) {
    if (CidrRuleAdmits(d, dest, port)) return CidrVerdict::kDenied;
  }
  for (const auto& a : rules.allow) {
    if (CidrRuleAdmits(a, dest, port)) return CidrVerdict::kAllowed;
  }
  return CidrVerdict::kNone;
}

std::string JudgeName(const EffectiveRules& rules, const PeekResult& peek, const IpPrefix& dest,
                      uint16_t port,
                      const std::function<bool(const std::string&, const IpPrefix&)>& resolved) {
  if (peek.state != PeekState::kName) return kReasonNoName;
  if (!NameAllowed(rules.allow, rules.deny, peek.name, port)) return kReasonNameNotAllowed;
  if (!resolved(peek.name, dest)) return kReasonNameAddressMismatch;
  return "";
}

bool StillAllowed(const EffectiveRules& rules, const std::string& name, const IpPrefix& dest,
                  uint16_t port) {
  switch (JudgeCidr(rules, dest, port)) {
    case CidrVerdict::kDenied:
      return false;
    case CidrVerdict::kAllowed:
      return true;
    case CidrVerdict::kNone:
      break;
  }
  return !name.empty() && NameAllowed(rules.allow, rules.deny, name, port);
}

}  // namespace sbx::net

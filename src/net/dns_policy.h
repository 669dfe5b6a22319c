// What sbxd's resolver (dns_server.h) may tell a sandbox: pure functions, unit-tested without
// sockets or root.
//
//   - A name is answered when the sandbox's effective rules allow it (NameAllowed, port 0:
//     `open` resolves every name, a CIDR-only allow-list none, a domain allow-list its names).
//     Names refused get REFUSED, not NXDOMAIN: the name may well exist, and a client that
//     caches a negative answer would keep failing after a PATCH that allows it. Each refusal
//     is a denial `dns_name` (counted by sbxd, DenialLog).
//   - Only A, AAAA and CNAME questions are forwarded. Others (TXT, MX, SRV, HTTPS, ...) get an
//     empty NOERROR for an allowed name: HTTPS/SVCB records carry address hints the resolver
//     would have to check and record too, and a package manager needs none of them.
//   - Every address of an answer is checked as a packet to it would be: the always-blocked
//     ranges minus the operator's exempt list (never metadata), the sandbox pool (other
//     sandboxes), the operator's deny list. An upstream (or a forger) pointing an allowed name
//     at 10.0.0.5 or 169.254.169.254 has that record removed and a denial logged; the rest of
//     the answer stands.
//   - Answer TTLs are capped at what the packet-level allowance lasts (kMinTtl..kMaxTtl, as
//     NameTable clamps), so a client never keeps an address past its set element.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "net/dns_message.h"
#include "net/egress_rules.h"
#include "net/ip_prefix.h"
#include "net/nft_ruleset.h"

namespace sbx::net {

inline constexpr const char* kReasonDnsName = "dns_name";  // the resolver refused a name
inline constexpr uint32_t kDnsMinTtl = 30;  // NameTable::kMinTtl

inline constexpr uint32_t kDnsMaxTtl = 3600;

// Whether a sandbox whose effective rules are `allow`/`deny` may resolve `name`.
bool MayResolve(const std::vector<EgressRule>& allow, const std::vector<EgressRule>& deny,
                const std::string& name);

// Why a sandbox may not be told `addr` (a reason of DenialReasons()), or "" when it may.
std::string RefusedAnswerReason(const NetPolicyConfig& cfg, const IpPrefix& addr);

struct CheckedAnswer {
  std::vector<dns::Record> records;  // what the sandbox is told, TTLs capped
  std::vector<IpPrefix> addrs;       // its addresses (A/AAAA of the chain)
  std::vector<std::pair<IpPrefix, std::string>> stripped;  // removed, with the reason
  uint32_t ttl = kDnsMinTtl;         // the smallest TTL on the chain, within [min, max]
};
// The chain (dns::Chain) checked address by address.
CheckedAnswer CheckAnswer(const NetPolicyConfig& cfg, std::vector<dns::Record> chain);

struct DnsUpstream {
  IpPrefix addr;  // a host address
  uint16_t port = 53;
  std::string ToString() const;
};
// "ip", "ip:port", "[v6]:port", comma-separated; InvalidArgument naming `field`.
absl::StatusOr<std::vector<DnsUpstream>> ParseUpstreams(const std::string& text,
                                                        const std::string& field);
// The `nameserver` lines of a resolv.conf text (at most 3, as glibc reads).
std::vector<DnsUpstream> UpstreamsOfResolvConf(const std::string& text);

// What a networked sandbox's /etc/resolv.conf says: the host end of its veth, v4 then v6.
std::string SandboxResolvConf(const IpPrefix& host4, const IpPrefix& host6);

}  // namespace sbx::net

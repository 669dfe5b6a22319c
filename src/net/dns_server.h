// sbxd's own DNS resolver, the only one a networked sandbox can use (docs/isolation.md §2.3c).
//
// A sandbox's /etc/resolv.conf names the host end of its veth; nftables (`prerouting`,
// nft_ruleset.h) redirects UDP and TCP port 53 sent to any address of the host from an sbx
// veth to egress.dns_port, and `input` accepts exactly those redirected packets. This server
// listens there on the wildcard addresses, on a thread of its own (poll, no Asio: it needs
// recvmsg's packet info), and:
//   1. knows the sandbox by the interface the query came in on, never by its source address:
//      UDP by IP_PKTINFO / IPV6_PKTINFO's ifindex (NetworkHost::IdOfIfindex); TCP by the local
//      address of the connection, which the redirect set to the incoming veth's own host-end
//      address (a sandbox cannot choose it). Anything else (another interface, the uplink) is
//      dropped unanswered;
//   2. parses the query (dns_message.h; FORMERR for what does not parse) and checks the name
//      against the sandbox's live rules (dns_policy.h; REFUSED and a `dns_name` denial);
//   3. forwards a fresh query (new random id, only the question) to egress.dns_upstream over
//      UDP; an answer is taken only from that upstream's address and port with the same id and
//      question. An answer the upstream truncated (TC) is asked again over TCP (RFC 7766),
//      within the same deadline. At most kMaxInflight queries wait upstream, each at most the
//      timeout (SERVFAIL then, or at once when the table is full);
//   4. keeps the answer's CNAME chain, strips addresses a packet could not reach anyway
//      (logged as denials), records the rest in NameTable and, for a domain-ruled sandbox, in
//      the nft sets resolved4/resolved6 (one transaction per answer, before the reply leaves,
//      so the connection that follows finds them), and answers.
// Every structure is bounded: UDP datagrams and TCP messages of at most 512 bytes from a
// sandbox, at most kMaxTcp TCP connections (each closed after kTcpIdle without a query).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "net/dns_policy.h"

namespace sbx::net {

class NetworkHost;
class Nft;

struct DnsServerOptions {
  uint16_t port = 10053;
  std::vector<DnsUpstream> upstreams;
  int timeout_ms = 2000;
};

class DnsServer {
 public:
  static constexpr size_t kMaxInflight = 1024;
  static constexpr size_t kMaxTcp = 64;
  static constexpr int kTcpIdleMs = 10000;

  // Binds the sockets (an error names the port) and starts the thread. `host` outlives it.
  static absl::StatusOr<std::unique_ptr<DnsServer>> Start(NetworkHost* host, DnsServerOptions opts);
  ~DnsServer();  // stops the thread, closes the sockets
  DnsServer(const DnsServer&) = delete;
  DnsServer& operator=(const DnsServer&) = delete;

  struct Impl;

 private:
  explicit DnsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace sbx::net

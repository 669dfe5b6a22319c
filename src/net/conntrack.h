// Conntrack: the kernel's connection tracking table over ctnetlink (NETLINK_NETFILTER, libmnl),
// in-process, in the calling thread's network namespace. A PATCH of a sandbox's egress rules
// uses it to cut the flows the new rules forbid: it lists the flows whose original source is
// one of the sandbox's addresses and deletes those no rule allows any more. With its entry
// gone, the flow's next packet from the remote side finds no connection (the forward chain
// lets toward a veth only packets of a tracked connection, and the masquerade can no longer
// translate it back), and its next packet from the sandbox is judged as new by the sandbox's
// new chain; a mid-flow packet is refused there since no allow rule matches it.
//
// Thread safety: one Conntrack per thread at a time.
#pragma once

#include <libmnl/libmnl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/egress_rules.h"
#include "net/ip_prefix.h"

namespace sbx::net {

// One tracked flow as its first packet saw it (the "original" tuple).
struct Flow {
  IpPrefix src, dst;  // hosts (/32 or /128)
  uint8_t proto = 0;  // IPPROTO_TCP, IPPROTO_UDP, ...
  uint16_t sport = 0, dport = 0;  // host byte order; 0 for protocols without ports
  uint16_t zone = 0;
  std::string ToString() const;   // "tcp 10.0.0.2:4711 -> 198.18.0.2:80"
};

// One ctnetlink message of a dump (IPCTNL_MSG_CT_NEW), read: nullopt when it lacks an original
// tuple with both addresses (never trusts the lengths it is given: a fuzz target feeds it).
std::optional<Flow> ParseFlowMessage(const void* msg, size_t len);

// True when a flow the sandbox began passes `deny` then `allow` (egress_rules.h: a port range
// with protocol "any" is TCP and UDP); what a PATCH keeps open (sandbox_patch.cc).
bool RulesAllowFlow(const std::vector<EgressRule>& deny, const std::vector<EgressRule>& allow,
                    const Flow& f);

class Conntrack {
 public:
  static absl::StatusOr<Conntrack> Open();
  Conntrack(Conntrack&&) noexcept = default;
  Conntrack& operator=(Conntrack&&) noexcept = default;
  ~Conntrack();

  // Every flow whose original source address is one of `sources` (one dump of the table).
  absl::StatusOr<std::vector<Flow>> FlowsFrom(const std::vector<IpPrefix>& sources);
  // Deletes the flow's entry; NotFound when it is already gone (it ended meanwhile).
  absl::Status Delete(const Flow& flow);
  // Deletes the flows from `sources` that `keep` refuses; returns how many were deleted.
  absl::StatusOr<int> Cut(const std::vector<IpPrefix>& sources,
                          const std::function<bool(const Flow&)>& keep);

 private:
  explicit Conntrack(mnl_socket* sock);
  struct Closer {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Closer> sock_;
  uint32_t seq_ = 1;
  unsigned port_id_ = 0;
  std::unique_ptr<char[]> buf_;
};

}  // namespace sbx::net

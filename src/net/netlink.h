// Netlink (rtnetlink) in-process through libmnl: the links, addresses and routes of a
// sandbox's network. One Netlink talks to one network namespace: the one the calling thread
// was in when it was opened, or the namespace of `netns_fd` (the socket is made there by a
// brief setns of the calling thread, which then returns to its own).
//
// Thread safety: one Netlink per thread at a time.
#pragma once

#include <libmnl/libmnl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/ip_prefix.h"

namespace sbx::net {

struct LinkInfo {
  int index = 0;
  std::string name;
  std::string alias;  // IFLA_IFALIAS: the owning sandbox's id for sbx's veths
};

class Netlink {
 public:
  static absl::StatusOr<Netlink> Open(int netns_fd = -1);
  Netlink(Netlink&&) noexcept = default;
  Netlink& operator=(Netlink&&) noexcept = default;
  ~Netlink();

  // A veth pair: `name` here, `peer_name` created directly in the namespace of `peer_netns_fd`
  // (never visible in this one, so no name clash and no move afterwards).
  absl::Status CreateVeth(const std::string& name, const std::string& peer_name, int peer_netns_fd);
  absl::StatusOr<int> IfIndex(const std::string& name);
  absl::Status SetAlias(int ifindex, const std::string& alias);
  absl::Status SetUp(int ifindex);
  // `addr` with the subnet's prefix length (10.200.0.1/30). IPv6 addresses skip duplicate
  // address detection (IFA_F_NODAD): the pool guarantees they are unique, and DAD would leave
  // them unusable for a second after create.
  absl::Status AddAddress(int ifindex, const IpPrefix& addr);
  absl::Status AddDefaultRoute(int ifindex, const IpPrefix& gateway);
  // Waits until the kernel reports the link operational (IFLA_OPERSTATE up): only then has its
  // queueing discipline replaced the no-op one a link starts with (the kernel's link-watch
  // work does both, asynchronously after "up"), and until then every packet sent through it
  // is dropped. Listens to link notifications (RTNLGRP_LINK) for at most `timeout_ms`;
  // DeadlineExceeded after.
  absl::Status WaitOperUp(int ifindex, int timeout_ms);
  // NotFound when there is no such link; deleting one end of a veth removes both.
  absl::Status DeleteLink(int ifindex);
  absl::StatusOr<std::vector<LinkInfo>> ListLinks();

 private:
  explicit Netlink(mnl_socket* sock) : sock_(sock) {}
  // Sends the request in buf_ and waits for its ack; errors name `what`.
  absl::Status Transact(nlmsghdr* nlh, const std::string& what);
  // A link request in buf_: the netlink header and an ifinfomsg for `ifindex` (0: none).
  nlmsghdr* PutLinkHeader(uint16_t type, uint16_t flags, int ifindex);
  // WaitOperUp's body, with this socket subscribed to RTNLGRP_LINK.
  absl::Status WaitOperUpSubscribed(int ifindex, int timeout_ms);

  struct Closer {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Closer> sock_;
  uint32_t seq_ = 1;
  int last_errno_ = 0;  // of the last request the kernel refused
  unsigned port_id_ = 0;
  std::unique_ptr<char[]> buf_;
};

}  // namespace sbx::net

#include "net/netlink.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::net {
namespace {

constexpr size_t kBufSize = 32768;  // MNL_SOCKET_BUFFER_SIZE is page-sized; dumps want more

mnl_socket* OpenSocket(std::string* error) {
  mnl_socket* s = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (s == nullptr) {
    *error = "socket(NETLINK_ROUTE)";
    return nullptr;
  }
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) {
    int err = errno;
    mnl_socket_close(s);
    errno = err;
    *error = "bind(NETLINK_ROUTE)";
    return nullptr;
  }
  return s;
}

}  // namespace

absl::StatusOr<Netlink> Netlink::Open(int netns_fd) {
  std::string what;
  mnl_socket* s = nullptr;
  if (netns_fd < 0) {
    s = OpenSocket(&what);
    if (s == nullptr) return ErrnoStatus(errno, fmt::format("netlink: {}", what));
  } else {
    UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!original) return ErrnoStatus(errno, "netlink: open(/proc/thread-self/ns/net)");
    if (::setns(netns_fd, CLONE_NEWNET) != 0) {
      return ErrnoStatus(errno, "netlink: setns(sandbox network namespace)");
    }
    s = OpenSocket(&what);
    int err = errno;
    if (::setns(original.get(), CLONE_NEWNET) != 0) {
      // This thread would stay in a sandbox's namespace; nothing it does later may trust that.
      if (s != nullptr) mnl_socket_close(s);
      return ErrnoStatus(errno, "netlink: setns back to the host network namespace");
    }
    if (s == nullptr) return ErrnoStatus(err, fmt::format("netlink: {} in the sandbox namespace", what));
  }
  Netlink nl(s);
  nl.port_id_ = mnl_socket_get_portid(s);
  nl.buf_ = std::make_unique<char[]>(kBufSize);
  return nl;
}

Netlink::~Netlink() = default;

absl::Status Netlink::Transact(nlmsghdr* nlh, const std::string& what) {
  nlh->nlmsg_flags |= NLM_F_ACK;
  nlh->nlmsg_seq = seq_++;
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) {
    return ErrnoStatus(errno, fmt::format("{}: netlink sendto", what));
  }
  uint32_t seq = nlh->nlmsg_seq;
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
    if (n < 0) return ErrnoStatus(errno, fmt::format("{}: netlink recvfrom", what));
    int r = mnl_cb_run(buf_.get(), n, seq, port_id_, nullptr, nullptr);
    if (r < 0) {
      last_errno_ = errno;
      return ErrnoStatus(last_errno_, what);
    }
    if (r == MNL_CB_STOP) return absl::OkStatus();
  }
}

nlmsghdr* Netlink::PutLinkHeader(uint16_t type, uint16_t flags, int ifindex) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.get());
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = flags;
  nlh->nlmsg_seq = seq_++;
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = ifindex;
  return nlh;
}

absl::Status Netlink::CreateVeth(const std::string& name, const std::string& peer_name,
                                 int peer_netns_fd) {
  nlmsghdr* nlh = PutLinkHeader(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, 0);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  nlattr* linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  nlattr* data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  nlattr* peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  // The peer's attributes follow its own ifinfomsg inside VETH_INFO_PEER.
  auto* pifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  std::memset(pifm, 0, sizeof(*pifm));
  mnl_attr_put_strz(nlh, IFLA_IFNAME, peer_name.c_str());
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, static_cast<uint32_t>(peer_netns_fd));
  mnl_attr_nest_end(nlh, peer);
  mnl_attr_nest_end(nlh, data);
  mnl_attr_nest_end(nlh, linkinfo);
  return Transact(nlh, fmt::format("create veth {}: RTM_NEWLINK", name));
}

absl::StatusOr<int> Netlink::IfIndex(const std::string& name) {
  // A lookup by name, not a dump: a host with thousands of sandbox veths answers in one message.
  nlmsghdr* nlh = PutLinkHeader(RTM_GETLINK, NLM_F_REQUEST, 0);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  uint32_t seq = nlh->nlmsg_seq;
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) {
    return ErrnoStatus(errno, fmt::format("index of {}: netlink sendto(RTM_GETLINK)", name));
  }
  int index = 0;
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    *static_cast<int*>(data) = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(h))->ifi_index;
    return MNL_CB_STOP;
  };
  ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
  if (n < 0) return ErrnoStatus(errno, fmt::format("index of {}: netlink recvfrom", name));
  if (mnl_cb_run(buf_.get(), n, seq, port_id_, cb, &index) < 0) {
    if (errno == ENODEV) return absl::NotFoundError(fmt::format("netlink: no link named {}", name));
    return ErrnoStatus(errno, fmt::format("index of {}: RTM_GETLINK", name));
  }
  if (index <= 0) return absl::NotFoundError(fmt::format("netlink: no link named {}", name));
  return index;
}

absl::Status Netlink::SetAlias(int ifindex, const std::string& alias) {
  nlmsghdr* nlh = PutLinkHeader(RTM_NEWLINK, NLM_F_REQUEST, ifindex);
  mnl_attr_put_strz(nlh, IFLA_IFALIAS, alias.c_str());
  return Transact(nlh, fmt::format("name link {} after {}: RTM_NEWLINK(IFLA_IFALIAS)", ifindex, alias));
}

absl::Status Netlink::SetUp(int ifindex) {
  nlmsghdr* nlh = PutLinkHeader(RTM_NEWLINK, NLM_F_REQUEST, ifindex);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_get_payload(nlh));
  ifm->ifi_flags = IFF_UP;
  ifm->ifi_change = IFF_UP;
  return Transact(nlh, fmt::format("link {} up: RTM_NEWLINK(IFF_UP)", ifindex));
}

absl::Status Netlink::AddAddress(int ifindex, const IpPrefix& addr) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.get());
  nlh->nlmsg_type = RTM_NEWADDR;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL;
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = static_cast<uint8_t>(addr.family);
  ifa->ifa_prefixlen = static_cast<uint8_t>(addr.len);
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = static_cast<uint32_t>(ifindex);
  mnl_attr_put(nlh, IFA_LOCAL, addr.bytes(), addr.addr.data());
  mnl_attr_put(nlh, IFA_ADDRESS, addr.bytes(), addr.addr.data());
  if (!addr.is_v4()) {
    ifa->ifa_flags = IFA_F_NODAD;
    mnl_attr_put_u32(nlh, IFA_FLAGS, IFA_F_NODAD);
  }
  return Transact(nlh, fmt::format("address {} on link {}: RTM_NEWADDR", addr.ToString(), ifindex));
}

absl::Status Netlink::AddDefaultRoute(int ifindex, const IpPrefix& gateway) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.get());
  nlh->nlmsg_type = RTM_NEWROUTE;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL;
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = static_cast<uint8_t>(gateway.family);
  rtm->rtm_dst_len = 0;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_STATIC;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  mnl_attr_put(nlh, RTA_GATEWAY, gateway.bytes(), gateway.addr.data());
  mnl_attr_put_u32(nlh, RTA_OIF, static_cast<uint32_t>(ifindex));
  return Transact(nlh, fmt::format("default route via {}: RTM_NEWROUTE", gateway.AddressString()));
}

namespace {

// IFLA_OPERSTATE of a link message, IF_OPER_UNKNOWN when it has none.
uint8_t OperState(const nlmsghdr* h) {
  uint8_t state = IF_OPER_UNKNOWN;
  const char* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(h));
  for (const auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(h, sizeof(ifinfomsg)));
       mnl_attr_ok(a, static_cast<int>(tail - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    if (mnl_attr_get_type(a) == IFLA_OPERSTATE) state = mnl_attr_get_u8(a);
  }
  return state;
}

}  // namespace

absl::Status Netlink::WaitOperUp(int ifindex, int timeout_ms) {
  // Subscribed to link notifications before the first look: a change between the look and the
  // wait arrives as a message instead of being missed, so the wait sleeps in poll() rather than
  // asking again every few hundred microseconds.
  const int fd = mnl_socket_get_fd(sock_.get());
  int group = RTNLGRP_LINK;
  if (::setsockopt(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) != 0) {
    return ErrnoStatus(errno, fmt::format("wait for link {}: setsockopt(NETLINK_ADD_MEMBERSHIP)", ifindex));
  }
  absl::Status st = WaitOperUpSubscribed(ifindex, timeout_ms);
  ::setsockopt(fd, SOL_NETLINK, NETLINK_DROP_MEMBERSHIP, &group, sizeof(group));
  // Notifications queued meanwhile must not be taken for the answers of later requests.
  while (::recv(fd, buf_.get(), kBufSize, MSG_DONTWAIT) > 0) {
  }
  return st;
}

absl::Status Netlink::WaitOperUpSubscribed(int ifindex, int timeout_ms) {
  uint32_t seq = 0;
  auto ask = [&]() -> absl::Status {
    nlmsghdr* req = PutLinkHeader(RTM_GETLINK, NLM_F_REQUEST, ifindex);
    seq = req->nlmsg_seq;
    if (mnl_socket_sendto(sock_.get(), req, req->nlmsg_len) < 0) {
      return ErrnoStatus(errno, fmt::format("wait for link {}: netlink sendto(RTM_GETLINK)", ifindex));
    }
    return absl::OkStatus();
  };
  SBX_RETURN_IF_ERROR(ask());
  const int fd = mnl_socket_get_fd(sock_.get());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint8_t state = IF_OPER_UNKNOWN;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    struct pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (r < 0 && errno != EINTR) return ErrnoStatus(errno, fmt::format("wait for link {}: poll", ifindex));
    if (r == 0) {
      return absl::DeadlineExceededError(fmt::format(
          "wait for link {}: not operational after {} ms (operstate {})", ifindex, timeout_ms, state));
    }
    if (r < 0) continue;
    ssize_t n = ::recv(fd, buf_.get(), kBufSize, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != ENOBUFS) return ErrnoStatus(errno, fmt::format("wait for link {}: netlink recv", ifindex));
      // Notifications were lost (the socket's buffer overflowed): ask again.
      SBX_RETURN_IF_ERROR(ask());
      continue;
    }
    int len = static_cast<int>(n);
    for (const auto* h = reinterpret_cast<const nlmsghdr*>(buf_.get()); mnl_nlmsg_ok(h, len);
         h = mnl_nlmsg_next(h, &len)) {
      if (h->nlmsg_type == NLMSG_ERROR && h->nlmsg_seq == seq) {
        const auto* e = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(h));
        if (e->error != 0) return ErrnoStatus(-e->error, fmt::format("wait for link {}: RTM_GETLINK", ifindex));
        continue;
      }
      if (h->nlmsg_type != RTM_NEWLINK) continue;
      // The answer to the look (seq) and the notifications (seq 0) alike.
      if (static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(h))->ifi_index != ifindex) continue;
      state = OperState(h);
      if (state == IF_OPER_UP) return absl::OkStatus();
    }
  }
}

absl::Status Netlink::DeleteLink(int ifindex) {
  nlmsghdr* nlh = PutLinkHeader(RTM_DELLINK, NLM_F_REQUEST, ifindex);
  last_errno_ = 0;
  absl::Status st = Transact(nlh, fmt::format("delete link {}: RTM_DELLINK", ifindex));
  if (!st.ok() && last_errno_ == ENODEV) {
    return absl::NotFoundError(fmt::format("delete link {}: no such link", ifindex));
  }
  return st;
}

absl::StatusOr<std::vector<LinkInfo>> Netlink::ListLinks() {
  nlmsghdr* nlh = PutLinkHeader(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 0);
  uint32_t seq = nlh->nlmsg_seq;
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) {
    return ErrnoStatus(errno, "list links: netlink sendto(RTM_GETLINK)");
  }
  std::vector<LinkInfo> out;
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    auto* links = static_cast<std::vector<LinkInfo>*>(data);
    const auto* ifm = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(h));
    LinkInfo info{.index = ifm->ifi_index};
    const char* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(h));
    for (const auto* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(h, sizeof(*ifm)));
         mnl_attr_ok(attr, static_cast<int>(tail - reinterpret_cast<const char*>(attr)));
         attr = mnl_attr_next(attr)) {
      int type = mnl_attr_get_type(attr);
      if (type == IFLA_IFNAME) info.name = mnl_attr_get_str(attr);
      if (type == IFLA_IFALIAS) info.alias = mnl_attr_get_str(attr);
    }
    links->push_back(std::move(info));
    return MNL_CB_OK;
  };
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
    if (n < 0) return ErrnoStatus(errno, "list links: netlink recvfrom");
    int r = mnl_cb_run(buf_.get(), n, seq, port_id_, cb, &out);
    if (r < 0) return ErrnoStatus(errno, "list links: RTM_GETLINK");
    if (r == MNL_CB_STOP) return out;
  }
}

}  // namespace sbx::net

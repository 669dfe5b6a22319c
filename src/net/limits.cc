#include "net/limits.h"

#include <linux/pkt_cls.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::net {
namespace {

constexpr size_t kBufSize = 32768;
constexpr uint32_t kGsoMax = 65536;
// The kernel's scheduler ticks are 64 ns (PSCHED_SHIFT 6): tc_tbf_qopt.buffer is in them.
constexpr uint64_t kNsPerTick = 64;
constexpr uint32_t kRootHandle = 0x00010000u;     // "1:"

tc_ratespec RateSpec(uint64_t bytes_per_s) {
  tc_ratespec r{};
  // Ethernet: the kernel then computes packet times itself and wants no rate table.
  r.linklayer = TC_LINKLAYER_ETHERNET;
  r.cell_log = 3;
  r.rate = static_cast<uint32_t>(std::min<uint64_t>(bytes_per_s, UINT32_MAX));
  return r;
}

nlmsghdr* PutTcHeader(char* buf, uint16_t type, uint16_t flags, int ifindex, uint32_t handle,
                      uint32_t parent, uint32_t info, uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = flags;
  nlh->nlmsg_seq = seq;
  auto* tcm = static_cast<tcmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(tcmsg)));
  tcm->tcm_family = AF_UNSPEC;
  tcm->tcm_ifindex = ifindex;
  tcm->tcm_handle = handle;
  tcm->tcm_parent = parent;
  tcm->tcm_info = info;
  return nlh;
}

}  // namespace

RateParams RateParamsFor(uint32_t mbit) {
  RateParams p;
  p.bytes_per_s = static_cast<uint64_t>(mbit) * 1000 * 1000 / 8;
  // 20 ms at the rate, but never less than two GSO packets: a bucket smaller than one packet
  // would refuse that packet forever.
  p.burst = static_cast<uint32_t>(std::clamp<uint64_t>(p.bytes_per_s / 50, 2 * kGsoMax, UINT32_MAX / 2));
  p.queue = static_cast<uint32_t>(std::clamp<uint64_t>(p.bytes_per_s / 20, 2 * kGsoMax, UINT32_MAX / 2));
  return p;
}

TrafficControl::TrafficControl(mnl_socket* sock) : sock_(sock), buf_(new char[kBufSize]) {
  port_id_ = mnl_socket_get_portid(sock);
}

TrafficControl::~TrafficControl() = default;

absl::StatusOr<TrafficControl> TrafficControl::Open(int netns_fd) {
  mnl_socket* s = nullptr;
  if (netns_fd < 0) {
    s = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  } else {
    UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!original) return ErrnoStatus(errno, "tc: open(/proc/thread-self/ns/net)");
    if (::setns(netns_fd, CLONE_NEWNET) != 0) return ErrnoStatus(errno, "tc: setns(sandbox network namespace)");
    s = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    const int err = errno;
    if (::setns(original.get(), CLONE_NEWNET) != 0) {
      // This thread would stay in a sandbox's namespace; nothing it does later may trust that.
      if (s != nullptr) mnl_socket_close(s);
      return ErrnoStatus(errno, "tc: setns back to the host network namespace");
    }
    errno = err;
  }
  if (s == nullptr) return ErrnoStatus(errno, "tc: socket(NETLINK_ROUTE)");
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) {
    int err = errno;
    mnl_socket_close(s);
    return ErrnoStatus(err, "tc: bind(NETLINK_ROUTE)");
  }
  return TrafficControl(s);
}

absl::Status TrafficControl::Transact(nlmsghdr* nlh, const std::string& what) {
  nlh->nlmsg_flags |= NLM_F_ACK;
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) return ErrnoStatus(errno, what);
  const uint32_t seq = nlh->nlmsg_seq;
  ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
  if (n < 0) return ErrnoStatus(errno, what);
  if (mnl_cb_run(buf_.get(), static_cast<size_t>(n), seq, port_id_, nullptr, nullptr) < 0) {
    return ErrnoStatus(errno, what);
  }
  return absl::OkStatus();
}

absl::Status TrafficControl::LimitRate(int ifindex, uint32_t mbit) {
  if (mbit == 0) return absl::InvalidArgumentError("tc: a rate limit of 0 Mbit/s");
  const RateParams p = RateParamsFor(mbit);
  {
    nlmsghdr* nlh = PutTcHeader(buf_.get(), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE,
                                ifindex, kRootHandle, TC_H_ROOT, 0, seq_++);
    mnl_attr_put_strz(nlh, TCA_KIND, "tbf");
    nlattr* opts = mnl_attr_nest_start(nlh, TCA_OPTIONS);
    tc_tbf_qopt q{};
    q.rate = RateSpec(p.bytes_per_s);
    q.limit = p.queue;
    q.buffer = static_cast<uint32_t>(static_cast<uint64_t>(p.burst) * 1000000000ull / p.bytes_per_s / kNsPerTick);
    mnl_attr_put(nlh, TCA_TBF_PARMS, sizeof(q), &q);
    if (p.bytes_per_s > UINT32_MAX) mnl_attr_put_u64(nlh, TCA_TBF_RATE64, p.bytes_per_s);
    mnl_attr_put_u32(nlh, TCA_TBF_BURST, p.burst);
    mnl_attr_nest_end(nlh, opts);
    SBX_RETURN_IF_ERROR(Transact(nlh, fmt::format("tc: limit link {} to {} Mbit/s: RTM_NEWQDISC(tbf)", ifindex, mbit)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> TrafficControl::QdiscKinds(int ifindex) {
  const uint32_t seq = seq_++;
  nlmsghdr* nlh = PutTcHeader(buf_.get(), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, 0, 0, 0, 0, seq);
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) {
    return ErrnoStatus(errno, "tc: list qdiscs: sendto(RTM_GETQDISC)");
  }
  struct Ctx {
    int ifindex;
    std::vector<std::string> kinds;
  } ctx{ifindex, {}};
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    auto* c = static_cast<Ctx*>(data);
    const auto* tcm = static_cast<const tcmsg*>(mnl_nlmsg_get_payload(h));
    if (tcm->tcm_ifindex != c->ifindex) return MNL_CB_OK;
    mnl_attr_parse(h, sizeof(tcmsg), [](const nlattr* a, void* d) -> int {
      if (mnl_attr_get_type(a) == TCA_KIND && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0) {
        static_cast<std::vector<std::string>*>(d)->emplace_back(mnl_attr_get_str(a));
      }
      return MNL_CB_OK;
    }, &c->kinds);
    return MNL_CB_OK;
  };
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
    if (n < 0) return ErrnoStatus(errno, "tc: list qdiscs: recvfrom");
    int r = mnl_cb_run(buf_.get(), static_cast<size_t>(n), seq, port_id_, cb, &ctx);
    if (r < 0) return ErrnoStatus(errno, "tc: list qdiscs: RTM_GETQDISC dump");
    if (r == MNL_CB_STOP) break;
  }
  return std::move(ctx.kinds);
}

}  // namespace sbx::net

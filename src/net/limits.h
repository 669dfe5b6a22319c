// Per-sandbox bandwidth limits: tc over rtnetlink (libmnl), in-process. A token bucket (tbf)
// becomes the root qdisc of each end of the sandbox's veth pair:
//   the host end shapes what goes toward the sandbox;
//   the sandbox end (`eth0`, set up through a netlink socket made inside the sandbox's network
//     namespace) shapes what the sandbox sends. Sandbox root cannot lift it: that namespace
//     belongs to the host's user namespace, where it has no CAP_NET_ADMIN.
// Why not police the host end's ingress: this kernel (and many minimal ones) has neither the
// police action nor the matchall classifier, and an ifb device per sandbox would be one more
// object to name, find and sweep. A shaper also queues instead of dropping, which TCP prefers.
// Both qdiscs belong to the veth pair and vanish with it: SandboxNetwork's teardown and the
// start-up sweep, which remove veths, remove them too.
//
// Thread safety: one TrafficControl per thread at a time.
#pragma once

#include <libmnl/libmnl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::net {

// What a limit of `mbit` megabits per second makes: the bucket (bytes a burst may send at
// once: at least two 64 KiB GSO packets) and the queue of the tbf (bytes waiting, about 50 ms
// at the rate). Exposed for tests.
struct RateParams {
  uint64_t bytes_per_s = 0;
  uint32_t burst = 0;
  uint32_t queue = 0;
};
RateParams RateParamsFor(uint32_t mbit);

class TrafficControl {
 public:
  // In the calling thread's network namespace, or in that of `netns_fd` (the socket is made
  // there by a brief setns of the calling thread, which then returns to its own).
  static absl::StatusOr<TrafficControl> Open(int netns_fd = -1);
  TrafficControl(TrafficControl&&) noexcept = default;
  TrafficControl& operator=(TrafficControl&&) noexcept = default;
  ~TrafficControl();

  // Limits what link `ifindex` sends to `mbit` (> 0): a tbf root qdisc, replacing the one it
  // has (an earlier limit included).
  absl::Status LimitRate(int ifindex, uint32_t mbit);
  // The kinds of the qdiscs on link `ifindex` ("tbf", "ingress", ...).
  absl::StatusOr<std::vector<std::string>> QdiscKinds(int ifindex);

 private:
  explicit TrafficControl(mnl_socket* sock);
  absl::Status Transact(nlmsghdr* nlh, const std::string& what);
  struct Closer {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Closer> sock_;
  uint32_t seq_ = 1;
  unsigned port_id_ = 0;
  std::unique_ptr<char[]> buf_;
};

}  // namespace sbx::net

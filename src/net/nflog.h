// NflogReader: the packets sbx's nftables rules refused, as the kernel logs them to an NFLOG
// group (nfnetlink_log over libmnl, in-process, on a thread of its own). Each refusal rule of
// sbx's table also logs (`log group kNflogGroup prefix "sbx REASON"`, at most a few per second
// per sandbox: nft_ruleset.cc), so the reader learns the time, the reason (the prefix), the
// veth it came in on (which sandbox) and, from the first bytes of the packet, its destination,
// protocol and port. NetworkHost puts them in its DenialLog as the sandbox's recent denials;
// the nft counters, not these, count them (the log is rate limited, the counters are not).
//
// Thread safety: the callback runs on the reader's thread; Stop (and the destructor) joins it.
#pragma once

#include <libmnl/libmnl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "net/ip_prefix.h"

namespace sbx::net {

// The NFLOG group of sbx's rules. Groups are per network namespace; sbxd owns this one in its
// own (docs/isolation.md §2.3b).
inline constexpr uint16_t kNflogGroup = 0x5bd;
// The log prefix of a refusal: "sbx " then the reason.
inline constexpr const char* kNflogPrefix = "sbx ";
// Bytes of each refused packet copied to sbxd: an IPv6 header and the ports after it.
inline constexpr uint32_t kNflogSnaplen = 64;

struct LoggedPacket {
  std::string reason;     // from the prefix, without "sbx "
  int in_ifindex = 0;     // the sandbox's host veth
  IpPrefix dst;           // family 0 when the payload was too short to tell
  std::string protocol;   // "tcp", "udp", "icmp", "icmpv6" or the number
  uint16_t port = 0;      // TCP/UDP destination port, else 0
};

// One nfnetlink_log message (NFULNL_MSG_PACKET) as the kernel sends it: nullopt when it is not
// one of sbx's (no "sbx " prefix) or is malformed. Never reads past `len` (a fuzz target feeds
// it arbitrary bytes).
std::optional<LoggedPacket> ParseNflogMessage(const void* msg, size_t len);

class NflogReader {
 public:
  using Callback = std::function<void(const LoggedPacket&)>;
  // Binds group kNflogGroup in the calling thread's network namespace and starts reading.
  static absl::StatusOr<std::unique_ptr<NflogReader>> Start(Callback cb);
  ~NflogReader();
  void Stop();

 private:
  NflogReader(mnl_socket* sock, Callback cb);
  void Run();

  struct Closer {
    void operator()(mnl_socket* s) const { mnl_socket_close(s); }
  };
  std::unique_ptr<mnl_socket, Closer> sock_;
  Callback cb_;
  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

}  // namespace sbx::net

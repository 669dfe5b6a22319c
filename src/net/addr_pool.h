// AddrPool: the addresses of networked sandboxes. Slot i is the i-th /30 of the IPv4 range and
// the i-th /126 of the IPv6 range: the host end of the sandbox's veth takes the first usable
// address of each (.1 and ::1), the sandbox end the second (.2 and ::2). Using /30 and /126
// rather than /31 and /127 keeps both ends ordinary hosts for every tool inside.
//
// The slot is written into the host veth's name (VethName), so the kernel itself is the record
// of what is handed out: after a restart, sbxd lists its veths, Reserve()s the slots of the
// sandboxes it adopts and removes the rest, and no slot is handed out twice.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "net/ip_prefix.h"

namespace sbx::net {

struct SandboxAddrs {
  uint32_t slot = 0;
  IpPrefix host4, sandbox4;  // /30 each (the length is the subnet's)
  IpPrefix host6, sandbox6;  // /126 each
};

// "sbxv" + the slot in hex: at most 15 characters (IFNAMSIZ - 1) for every slot the pool allows.
std::string VethName(uint32_t slot);
// The slot of a name VethName made, or nullopt for any other interface.
std::optional<uint32_t> SlotOfVethName(std::string_view name);

class AddrPool {
 public:
  // At most this many slots, whatever the ranges: a veth name holds 5 hex digits after "sbxv"
  // ... and more sandboxes than this would not fit on one host anyway.
  static constexpr uint32_t kMaxSlots = 1u << 20;

  // v4: an IPv4 range of /8 to /29; v6: an IPv6 range of /64 to /125. The pool holds as many
  // slots as the smaller of the two allows.
  static absl::StatusOr<AddrPool> Make(const IpPrefix& v4, const IpPrefix& v6);
  AddrPool(AddrPool&& o) noexcept;

  uint32_t capacity() const { return capacity_; }
  const IpPrefix& v4() const { return v4_; }
  const IpPrefix& v6() const { return v6_; }

  // The lowest free slot; ResourceExhausted when every one is taken.
  absl::StatusOr<SandboxAddrs> Allocate();
  // Marks `slot` taken (a sandbox adopted after a restart). AlreadyExists if it is,
  // OutOfRange past the capacity.
  absl::StatusOr<SandboxAddrs> Reserve(uint32_t slot);
  void Release(uint32_t slot);
  uint32_t in_use() const;
  SandboxAddrs AddrsOf(uint32_t slot) const;

 private:
  AddrPool(const IpPrefix& v4, const IpPrefix& v6, uint32_t capacity);

  IpPrefix v4_, v6_;
  uint32_t capacity_;
  mutable std::mutex mu_;
  std::vector<bool> used_;
  uint32_t in_use_ = 0;
  uint32_t next_hint_ = 0;
};

}  // namespace sbx::net

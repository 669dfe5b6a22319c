#include "net/addr_pool.h"

#include <charconv>

#include <fmt/format.h>

#include "absl/status/status.h"

namespace sbx::net {

std::string VethName(uint32_t slot) { return fmt::format("sbxv{:x}", slot); }

std::optional<uint32_t> SlotOfVethName(std::string_view name) {
  if (name.size() < 5 || name.size() > 9 || name.substr(0, 4) != "sbxv") return std::nullopt;
  std::string_view hex = name.substr(4);
  uint32_t v = 0;
  auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
  if (ec != std::errc() || ptr != hex.data() + hex.size()) return std::nullopt;
  if (VethName(v) != name) return std::nullopt;  // "sbxv01", upper case: not ours
  return v;
}

absl::StatusOr<AddrPool> AddrPool::Make(const IpPrefix& v4, const IpPrefix& v6) {
  if (!v4.is_v4() || v4.len < 8 || v4.len > 29) {
    return absl::InvalidArgumentError(
        fmt::format("address pool: IPv4 range {} is not an IPv4 range of /8 to /29", v4.ToString()));
  }
  if (v6.is_v4() || v6.family == 0 || v6.len < 64 || v6.len > 125) {
    return absl::InvalidArgumentError(fmt::format(
        "address pool: IPv6 range {} is not an IPv6 range of /64 to /125", v6.ToString()));
  }
  uint64_t slots4 = uint64_t{1} << (30 - v4.len);
  uint64_t slots6 = (126 - v6.len) >= 63 ? UINT64_MAX : uint64_t{1} << (126 - v6.len);
  uint64_t n = std::min<uint64_t>({slots4, slots6, kMaxSlots});
  return AddrPool(v4, v6, static_cast<uint32_t>(n));
}

AddrPool::AddrPool(const IpPrefix& v4, const IpPrefix& v6, uint32_t capacity)
    : v4_(v4), v6_(v6), capacity_(capacity), used_(capacity, false) {}

AddrPool::AddrPool(AddrPool&& o) noexcept
    : v4_(o.v4_), v6_(o.v6_), capacity_(o.capacity_), used_(std::move(o.used_)),
      in_use_(o.in_use_), next_hint_(o.next_hint_) {}

SandboxAddrs AddrPool::AddrsOf(uint32_t slot) const {
  uint64_t base = uint64_t{slot} * 4;
  return {.slot = slot,
          .host4 = v4_.Offset(base + 1, 30),
          .sandbox4 = v4_.Offset(base + 2, 30),
          .host6 = v6_.Offset(base + 1, 126),
          .sandbox6 = v6_.Offset(base + 2, 126)};
}

absl::StatusOr<SandboxAddrs> AddrPool::Allocate() {
  std::lock_guard lock(mu_);
  if (in_use_ >= capacity_) {
    return absl::ResourceExhaustedError(fmt::format(
        "address pool: all {} sandbox subnets of {} and {} are taken", capacity_, v4_.ToString(),
        v6_.ToString()));
  }
  // Round-robin from the last one handed out: a slot just released is reused last, so a
  // late packet or conntrack entry of a deleted sandbox does not land in a new one.
  for (uint32_t i = 0; i < capacity_; ++i) {
    uint32_t slot = (next_hint_ + i) % capacity_;
    if (!used_[slot]) {
      used_[slot] = true;
      ++in_use_;
      next_hint_ = (slot + 1) % capacity_;
      return AddrsOf(slot);
    }
  }
  return absl::InternalError("address pool: in-use count disagrees with the slots");
}

absl::StatusOr<SandboxAddrs> AddrPool::Reserve(uint32_t slot) {
  std::lock_guard lock(mu_);
  if (slot >= capacity_) {
    return absl::OutOfRangeError(
        fmt::format("address pool: slot {} is past the pool's {} (was the range made smaller?)",
                    slot, capacity_));
  }
  if (used_[slot]) {
    return absl::AlreadyExistsError(fmt::format("address pool: slot {} is already taken", slot));
  }
  used_[slot] = true;
  ++in_use_;
  return AddrsOf(slot);
}

void AddrPool::Release(uint32_t slot) {
  std::lock_guard lock(mu_);
  if (slot < capacity_ && used_[slot]) {
    used_[slot] = false;
    --in_use_;
  }
}

uint32_t AddrPool::in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

}  // namespace sbx::net

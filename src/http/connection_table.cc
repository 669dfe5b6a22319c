#include "http/connection_table.h"

namespace sbx::http {

ConnectionTable::Lease& ConnectionTable::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    table_ = o.table_;
    key_ = std::move(o.key_);
    slot_ = o.slot_;
    reason_ = o.reason_;
    o.table_ = nullptr;
    o.slot_ = Slot::kRefused;
  }
  return *this;
}

void ConnectionTable::Lease::Release() {
  if (table_ != nullptr && slot_ != Slot::kRefused) table_->Release(key_, slot_);
  table_ = nullptr;
  slot_ = Slot::kRefused;
}

ConnectionTable::ConnectionTable(size_t max, size_t per_address, size_t reserve,
                                 metrics::Gauge* open)
    : max_(max), per_address_(per_address), reserve_(reserve), open_gauge_(open) {}

std::string ConnectionTable::KeyOf(const boost::asio::ip::address& peer) {
  if (peer.is_v4()) {
    const auto b = peer.to_v4().to_bytes();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  const auto v6 = peer.to_v6();
  if (v6.is_v4_mapped()) {
    const auto b = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, v6).to_bytes();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  const auto b = v6.to_bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), 8);
}

ConnectionTable::Lease ConnectionTable::Grant(std::string key, Slot slot,
                                              std::string_view reason) {
  Lease lease;
  lease.slot_ = slot;
  lease.reason_ = reason;
  if (slot == Slot::kRefused) return lease;
  lease.table_ = this;
  lease.key_ = std::move(key);
  if (open_gauge_ != nullptr) open_gauge_->Inc();
  return lease;
}

ConnectionTable::Lease ConnectionTable::Admit(const boost::asio::ip::address& peer) {
  std::string key = KeyOf(peer);
  std::lock_guard lock(mu_);
  Count& c = by_source_[key];
  std::string_view reason;
  if (normal_ >= max_) {
    reason = kMaxConnections;
  } else if (c.normal >= per_address_) {
    reason = kMaxPerAddress;
  } else {
    ++c.normal;
    ++normal_;
    return Grant(std::move(key), Slot::kNormal, {});
  }
  return GrantReserve(std::move(key), c, reason);
}

ConnectionTable::Lease ConnectionTable::AdmitReserve(const boost::asio::ip::address& peer,
                                                     std::string_view reason) {
  std::string key = KeyOf(peer);
  std::lock_guard lock(mu_);
  Count& c = by_source_[key];
  return GrantReserve(std::move(key), c, reason);
}

ConnectionTable::Lease ConnectionTable::GrantReserve(std::string key, Count& c,
                                                     std::string_view reason) {
  if (reserved_ < reserve_ && c.reserve < kReservePerAddress) {
    ++c.reserve;
    ++reserved_;
    return Grant(std::move(key), Slot::kReserve, reason);
  }
  if (c.normal == 0 && c.reserve == 0) by_source_.erase(key);
  return Grant(std::move(key), Slot::kRefused, reason);
}

void ConnectionTable::Release(const std::string& key, Slot slot) {
  {
    std::lock_guard lock(mu_);
    auto it = by_source_.find(key);
    if (it != by_source_.end()) {
      if (slot == Slot::kNormal) {
        --it->second.normal;
        --normal_;
      } else {
        --it->second.reserve;
        --reserved_;
      }
      if (it->second.normal == 0 && it->second.reserve == 0) by_source_.erase(it);
    }
  }
  if (open_gauge_ != nullptr) open_gauge_->Dec();
}

size_t ConnectionTable::open() const {
  std::lock_guard lock(mu_);
  return normal_ + reserved_;
}

size_t ConnectionTable::reserve_in_use() const {
  std::lock_guard lock(mu_);
  return reserved_;
}

}  // namespace sbx::http

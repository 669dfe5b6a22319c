// Who holds the HTTP server's connections, and whether one more may come in (issue 13: 20,000
// silent connections from one address took sbxd to its fd limit).
//
// Three numbers bound it. `max` connections in all, at most `per_address` of them from one
// source (an IPv4 address; an IPv6 /64, since one host usually holds a whole /64). Past either
// cap a connection may still take one of `reserve` slots, at most kReservePerAddress per
// source: the server then serves it only a /healthz or an admin-authenticated request
// (Server's `privileged` predicate) and answers anything else 503. Past the reserve it is
// refused at once. So a flood from one source cannot take the others' slots, and a flood from
// many cannot lock out the health check and the operator, who need one slot each.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/asio/ip/address.hpp>

#include "common/metrics.h"

namespace sbx::http {

class ConnectionTable {
 public:
  // A reserve slot per source is enough for a health check plus an operator's request; more
  // would let one source take the whole reserve.
  static constexpr size_t kReservePerAddress = 2;

  enum class Slot { kRefused, kNormal, kReserve };
  // Why a connection is not kNormal; the values of sbx_http_connections_rejected_total{reason}.
  static constexpr std::string_view kMaxConnections = "max_connections";
  static constexpr std::string_view kMaxPerAddress = "max_connections_per_ip";
  static constexpr std::string_view kOpenFiles = "open_files";

  // One connection's slot, released when the lease is destroyed. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    Slot slot() const { return slot_; }
    // Why the connection is not kNormal ("" when it is).
    std::string_view reason() const { return reason_; }

   private:
    friend class ConnectionTable;
    void Release();
    ConnectionTable* table_ = nullptr;
    std::string key_;
    Slot slot_ = Slot::kRefused;
    std::string_view reason_;
  };

  // `open`: the gauge of open connections (sbx_http_connections); may be nullptr.
  ConnectionTable(size_t max, size_t per_address, size_t reserve, metrics::Gauge* open = nullptr);

  // A slot for a connection from `peer`. A kRefused lease holds nothing.
  Lease Admit(const boost::asio::ip::address& peer);
  // A reserve slot only (accept ran out of file descriptors: only a privileged request may
  // have the one a spare gave up), or kRefused.
  Lease AdmitReserve(const boost::asio::ip::address& peer, std::string_view reason);

  size_t open() const;
  size_t reserve_in_use() const;

  // The key a source is counted under: 4 bytes of an IPv4 (or v4-mapped) address, the first
  // 8 of an IPv6 one.
  static std::string KeyOf(const boost::asio::ip::address& peer);

 private:
  struct Count {
    size_t normal = 0;
    size_t reserve = 0;
  };
  Lease Grant(std::string key, Slot slot, std::string_view reason);
  // A reserve slot for the source counted in `c` (by_source_[key]), or kRefused; mu_ held.
  Lease GrantReserve(std::string key, Count& c, std::string_view reason);
  void Release(const std::string& key, Slot slot);

  const size_t max_, per_address_, reserve_;
  metrics::Gauge* open_gauge_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Count> by_source_;
  size_t normal_ = 0;
  size_t reserved_ = 0;
};

}  // namespace sbx::http

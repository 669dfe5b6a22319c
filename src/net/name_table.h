// NameTable: which addresses each name resolved to, per sandbox, as sbxd's own resolver answered
// it. A domain rule holds on a connection only when the name the connection asks for (its Host or
// SNI) resolved to the address it goes to, for this sandbox (docs/isolation.md, "domain rules"):
// a forged answer the sandbox got elsewhere, or an allowed name pointed at another host's address,
// finds no entry here. Entries expire with the answer's TTL, clamped to [kMinTtl, kMaxTtl]: a
// connection may start a little after a short-lived answer, and a long TTL must not keep an
// address allowed for a day.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "net/ip_prefix.h"

namespace sbx::net {

class NameTable {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kMinTtl{30};
  static constexpr std::chrono::seconds kMaxTtl{3600};
  // Names kept per sandbox; past it the entry expiring first goes (a sandbox cannot grow sbxd's
  // memory by resolving names without end).
  static constexpr size_t kMaxNamesPerSandbox = 4096;

  // `name` (NormalizeName form) resolved to `addrs` (hosts: IpPrefix::Host) for sandbox `id`.
  // Adds to what the name had: round-robin answers differ between lookups.
  void Record(const std::string& id, const std::string& name, const std::vector<IpPrefix>& addrs,
              std::chrono::seconds ttl);
  // Whether `name` resolved to `addr` for `id` and has not expired.
  bool Resolved(const std::string& id, const std::string& name, const IpPrefix& addr) const;
  // The unexpired names that resolved to `addr` for `id` (a denial shows them).
  std::vector<std::string> NamesOf(const std::string& id, const IpPrefix& addr) const;
  // The sandbox is gone.
  void Forget(const std::string& id);

  // For tests: the clock the table reads.
  void SetClockForTest(Clock::time_point (*now)()) { now_ = now; }

 private:
  struct Sandbox {
    // name -> address key (family byte + 16 bytes) -> expiry
    std::map<std::string, std::map<std::string, Clock::time_point>> names;
  };
  static std::string Key(const IpPrefix& addr);
  void PruneLocked(Sandbox& s, Clock::time_point now);

  mutable std::mutex mu_;
  std::map<std::string, Sandbox> sandboxes_;
  Clock::time_point (*now_)() = &Clock::now;
};

}  // namespace sbx::net

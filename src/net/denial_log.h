// DenialLog: the last refusals of each sandbox's network, so a user can see why `pip install`
// failed (GET /v1/sandboxes/{id}/egress, `sbx egress ID`), and the counts of the refusals that
// sbxd itself makes. Three writers: sbxd's resolver and its Host/SNI proxy (they refuse and
// count here), and the NFLOG reader (packet-level refusals, counted by nftables' own counters:
// it records with count=false, so nothing is counted twice).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"

namespace sbx::net {

struct Denial {
  absl::Time time;
  std::string reason;    // a DenialReasons() name or one of sbxd's own (dns_name, no_name, ...)
  std::string dest;      // the address refused ("" when a name was refused before any address)
  std::string name;      // the host name, when known (DNS query, Host, SNI)
  std::string protocol;  // "tcp", "udp", "icmp", "dns", ...
  uint16_t port = 0;     // 0 when the protocol has none
};

// {"time": RFC 3339, "reason", "destination", "name"?, "protocol", "port"?}
nlohmann::json DenialToJson(const Denial& d);

class DenialLog {
 public:
  static constexpr size_t kDefaultKeep = 64;
  explicit DenialLog(size_t keep = kDefaultKeep) : keep_(keep) {}

  // Adds `d` to sandbox `id`'s recent list (the oldest goes past `keep`) and, when `count`,
  // to its counter of `d.reason`.
  void Record(const std::string& id, Denial d, bool count = true);
  // Oldest first.
  std::vector<Denial> Recent(const std::string& id) const;
  // The counts Record added, by reason (reasons never recorded are absent).
  std::map<std::string, uint64_t> Counts(const std::string& id) const;
  // Every sandbox's counts, by id (for the metrics).
  std::map<std::string, std::map<std::string, uint64_t>> AllCounts() const;
  void Forget(const std::string& id);

 private:
  struct Sandbox {
    std::deque<Denial> recent;
    std::map<std::string, uint64_t> counts;
  };
  size_t keep_;
  mutable std::mutex mu_;
  std::map<std::string, Sandbox> sandboxes_;
};

}  // namespace sbx::net

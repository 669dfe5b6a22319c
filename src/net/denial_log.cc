#include "net/denial_log.h"

namespace sbx::net {

nlohmann::json DenialToJson(const Denial& d) {
  nlohmann::json j = {{"time", absl::FormatTime(absl::RFC3339_full, d.time, absl::UTCTimeZone())},
                      {"reason", d.reason},
                      {"destination", d.dest},
                      {"protocol", d.protocol}};
  if (!d.name.empty()) j["name"] = d.name;
  if (d.port != 0) j["port"] = d.port;
  return j;
}

void DenialLog::Record(const std::string& id, Denial d, bool count) {
  std::lock_guard lock(mu_);
  Sandbox& s = sandboxes_[id];
  if (count) ++s.counts[d.reason];
  s.recent.push_back(std::move(d));
  while (s.recent.size() > keep_) s.recent.pop_front();
}

std::vector<Denial> DenialLog::Recent(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return {};
  return {it->second.recent.begin(), it->second.recent.end()};
}

std::map<std::string, uint64_t> DenialLog::Counts(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return {};
  return it->second.counts;
}

std::map<std::string, std::map<std::string, uint64_t>> DenialLog::AllCounts() const {
  std::lock_guard lock(mu_);
  std::map<std::string, std::map<std::string, uint64_t>> out;
  for (const auto& [id, s] : sandboxes_) {
    if (!s.counts.empty()) out[id] = s.counts;
  }
  return out;
}

void DenialLog::Forget(const std::string& id) {
  std::lock_guard lock(mu_);
  sandboxes_.erase(id);
}

}  // namespace sbx::net

#include "net/name_table.h"

#include <algorithm>

namespace sbx::net {

std::string NameTable::Key(const IpPrefix& addr) {
  std::string k(1, static_cast<char>(addr.family));
  k.append(reinterpret_cast<const char*>(addr.addr.data()), addr.bytes());
  return k;
}

void NameTable::PruneLocked(Sandbox& s, Clock::time_point now) {
  for (auto it = s.names.begin(); it != s.names.end();) {
    auto& addrs = it->second;
    std::erase_if(addrs, [&](const auto& kv) { return kv.second <= now; });
    it = addrs.empty() ? s.names.erase(it) : std::next(it);
  }
}

void NameTable::Record(const std::string& id, const std::string& name,
                       const std::vector<IpPrefix>& addrs, std::chrono::seconds ttl) {
  if (addrs.empty()) return;
  auto now = now_();
  auto expiry = now + std::clamp(ttl, kMinTtl, kMaxTtl);
  std::lock_guard lock(mu_);
  Sandbox& s = sandboxes_[id];
  if (!s.names.contains(name) && s.names.size() >= kMaxNamesPerSandbox) {
    PruneLocked(s, now);
    if (s.names.size() >= kMaxNamesPerSandbox) {
      // The name whose last address expires first makes room.
      auto victim = std::min_element(s.names.begin(), s.names.end(), [](const auto& a, const auto& b) {
        auto last = [](const auto& m) {
          Clock::time_point t{};
          for (const auto& [k, e] : m) t = std::max(t, e);
          return t;
        };
        return last(a.second) < last(b.second);
      });
      s.names.erase(victim);
    }
  }
  auto& entry = s.names[name];
  for (const auto& a : addrs) {
    auto& e = entry[Key(a)];
    e = std::max(e, expiry);
  }
}

bool NameTable::Resolved(const std::string& id, const std::string& name,
                         const IpPrefix& addr) const {
  auto now = now_();
  std::lock_guard lock(mu_);
  auto s = sandboxes_.find(id);
  if (s == sandboxes_.end()) return false;
  auto n = s->second.names.find(name);
  if (n == s->second.names.end()) return false;
  auto a = n->second.find(Key(addr));
  return a != n->second.end() && a->second > now;
}

std::vector<std::string> NameTable::NamesOf(const std::string& id, const IpPrefix& addr) const {
  auto now = now_();
  std::string key = Key(addr);
  std::vector<std::string> out;
  std::lock_guard lock(mu_);
  auto s = sandboxes_.find(id);
  if (s == sandboxes_.end()) return out;
  for (const auto& [name, addrs] : s->second.names) {
    auto a = addrs.find(key);
    if (a != addrs.end() && a->second > now) out.push_back(name);
  }
  return out;
}

void NameTable::Forget(const std::string& id) {
  std::lock_guard lock(mu_);
  sandboxes_.erase(id);
}

}  // namespace sbx::net

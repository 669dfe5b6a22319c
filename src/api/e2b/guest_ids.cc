#include "api/e2b/guest_ids.h"

#include <charconv>
#include <optional>
#include <vector>

namespace sbx::api::e2b {
namespace {

std::optional<uint32_t> Number(std::string_view s) {
  uint32_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Calls f(name, id) for each line of an /etc file whose first field is a name and whose third
// is a number (passwd: name:password:uid:..., group: name:password:gid:...), at most
// kMaxIdEntries lines of the first kMaxIdFileBytes.
template <typename F>
void ForEachId(std::string_view text, F&& f) {
  text = text.substr(0, kMaxIdFileBytes);
  size_t n = 0;
  while (!text.empty() && n < kMaxIdEntries) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    ++n;
    std::string_view fields[3];
    size_t got = 0;
    while (got < 3) {
      const size_t c = line.find(':');
      fields[got++] = line.substr(0, c);
      if (c == std::string_view::npos) break;
      line.remove_prefix(c + 1);
    }
    if (got < 3 || fields[0].empty()) continue;
    if (auto id = Number(fields[2])) f(fields[0], *id);
  }
}

}  // namespace

GuestIds ParseGuestIds(std::string_view passwd, std::string_view group) {
  GuestIds ids;
  ForEachId(passwd, [&](std::string_view name, uint32_t uid) {
    ids.user_names.emplace(uid, std::string(name));
  });
  ForEachId(group, [&](std::string_view name, uint32_t gid) {
    ids.group_names.emplace(gid, std::string(name));
  });
  return ids;
}

std::shared_ptr<const GuestIds> GuestIdsCache::Get(const std::string& sandbox_id,
                                                   Clock::time_point now) const {
  std::lock_guard lock(mu_);
  auto it = by_sandbox_.find(sandbox_id);
  if (it == by_sandbox_.end() || now - it->second.at > kTtl) return nullptr;
  return it->second.ids;
}

void GuestIdsCache::Put(const std::string& sandbox_id, std::shared_ptr<const GuestIds> ids,
                        Clock::time_point now) {
  std::lock_guard lock(mu_);
  by_sandbox_[sandbox_id] = Entry{std::move(ids), now};
  while (by_sandbox_.size() > kMaxSandboxes) {
    auto oldest = by_sandbox_.begin();
    for (auto it = by_sandbox_.begin(); it != by_sandbox_.end(); ++it) {
      if (it->second.at < oldest->second.at) oldest = it;
    }
    by_sandbox_.erase(oldest);
  }
}

size_t GuestIdsCache::size() const {
  std::lock_guard lock(mu_);
  return by_sandbox_.size();
}

}  // namespace sbx::api::e2b

// The names of a sandbox's users and groups (its /etc/passwd and /etc/group), which envd's
// EntryInfo gives as `owner` and `group` ("user", "root") where the agent gives numbers, and a
// short-lived cache of them per sandbox, owned by Api (State): reading both files through the
// agent for every Stat would double its cost. Pure and bounded: the files are the guest's.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace sbx::api::e2b {

struct GuestIds {
  std::map<uint32_t, std::string> user_names, group_names;  // the first name of an id wins
};
inline constexpr size_t kMaxIdFileBytes = 1 << 20;
inline constexpr size_t kMaxIdEntries = 65536;
GuestIds ParseGuestIds(std::string_view passwd, std::string_view group);

// Per sandbox, for kTtl (a user added in the sandbox shows by number until then). At most
// kMaxSandboxes, the oldest dropped first.
class GuestIdsCache {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kTtl{10};
  static constexpr size_t kMaxSandboxes = 1024;

  std::shared_ptr<const GuestIds> Get(const std::string& sandbox_id, Clock::time_point now) const;
  void Put(const std::string& sandbox_id, std::shared_ptr<const GuestIds> ids,
           Clock::time_point now);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const GuestIds> ids;
    Clock::time_point at;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> by_sandbox_;
};

}  // namespace sbx::api::e2b

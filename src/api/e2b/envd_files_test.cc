// EntryInfo and watch events as envd renders them (envd_filesystem.h), and the polling
// watchers' table (watchers.h).
#include <gtest/gtest.h>

#include "api/e2b/envd_filesystem.h"
#include "api/e2b/watchers.h"

namespace sbx::api::e2b {
namespace {

using nlohmann::json;

service::FileEntry Entry(std::string type, uint64_t mode) {
  service::FileEntry e;
  e.name = "a.txt";
  e.path = "/home/user/a.txt";
  e.type = std::move(type);
  e.size = 12;
  e.mode = mode;
  e.uid = 1000;
  e.gid = 1001;
  e.mtime = "2025-01-01T00:00:00Z";
  return e;
}

TEST(EntryInfo, TheDocumentedExample) {
  EXPECT_EQ(EntryInfo(Entry("file", 0644)),
            json::parse(R"({"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt",
              "size":"12","mode":420,"permissions":"-rw-r--r--","owner":"1000","group":"1001",
              "modifiedTime":"2025-01-01T00:00:00Z"})"));
}

TEST(EntryInfo, TypesAlwaysSetAndSymlinkTarget) {
  EXPECT_EQ(EntryInfo(Entry("directory", 0755))["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ(EntryInfo(Entry("other", 0644))["type"], "FILE_TYPE_FILE");
  auto link = Entry("symlink", 0777);
  link.symlink_target = "/etc/hosts";
  const json j = EntryInfo(link);
  EXPECT_EQ(j["type"], "FILE_TYPE_SYMLINK");
  EXPECT_EQ(j["symlinkTarget"], "/etc/hosts");
  EXPECT_FALSE(EntryInfo(Entry("file", 0644)).contains("symlinkTarget"));
  // Big sizes stay exact (int64 as a string).
  auto big = Entry("file", 0644);
  big.size = (uint64_t{1} << 53) + 1;
  EXPECT_EQ(EntryInfo(big)["size"], "9007199254740993");
}

TEST(EntryInfo, PermissionsAsGoWritesThem) {
  EXPECT_EQ(GoPermissions("file", 0644), "-rw-r--r--");
  EXPECT_EQ(GoPermissions("directory", 0755), "drwxr-xr-x");
  EXPECT_EQ(GoPermissions("directory", 01777), "dtrwxrwxrwx");
  EXPECT_EQ(GoPermissions("symlink", 0777), "Lrwxrwxrwx");
  EXPECT_EQ(GoPermissions("file", 04755), "urwxr-xr-x");
  EXPECT_EQ(GoPermissions("file", 0), "----------");
  EXPECT_EQ(GoPermissions("other", 0600), "?rw-------");
  EXPECT_EQ(EntryInfo(Entry("directory", 01777))["mode"], 0777);
}

TEST(EntryInfo, OwnersNamedFromTheSandboxsOwnFiles) {
  // Comments, blank and short lines, a non-number id and a second name of one id are taken in
  // stride: the files are the guest's.
  const GuestIds ids = ParseGuestIds(
      "# users\nroot:x:0:0:root:/root:/bin/sh\n\nbroken\nuser:x:1000:1000::/home/user:/bin/bash\r\n"
      "alias:x:1000:1000::/:/bin/sh\nodd:x:notanumber:1:::\n:x:5:5:::\n",
      "root:x:0:\nuser:x:1000:\n");
  EXPECT_EQ(ids.user_names.size(), 2u);
  EXPECT_EQ(ids.user_names.at(1000), "user");
  json info = EntryInfo(Entry("file", 0644));  // uid 1000, gid 1001
  NameOwners(info, ids);
  EXPECT_EQ(info["owner"], "user");
  EXPECT_EQ(info["group"], "1001");  // no group of that id: the number stays
  json odd = info;
  odd["owner"] = "12x";
  NameOwners(odd, ids);
  EXPECT_EQ(odd["owner"], "12x");
  // Bounded: a huge file stops at its caps, never holds more than kMaxIdEntries names.
  std::string many;
  for (int i = 0; i < 70000; ++i) many += "u" + std::to_string(i) + ":x:" + std::to_string(i) + ":0:::\n";
  EXPECT_LE(ParseGuestIds(many, "").user_names.size(), kMaxIdEntries);
}

TEST(GuestIdsCache, KeptForItsTtlAndBounded) {
  GuestIdsCache cache;
  const auto t0 = GuestIdsCache::Clock::now();
  auto ids = std::make_shared<const GuestIds>();
  cache.Put("a", ids, t0);
  EXPECT_EQ(cache.Get("a", t0 + std::chrono::seconds(5)), ids);
  EXPECT_EQ(cache.Get("a", t0 + GuestIdsCache::kTtl + std::chrono::seconds(1)), nullptr);
  EXPECT_EQ(cache.Get("b", t0), nullptr);
  for (size_t i = 0; i < GuestIdsCache::kMaxSandboxes + 10; ++i) {
    cache.Put("s" + std::to_string(i), ids, t0 + std::chrono::milliseconds(i));
  }
  EXPECT_EQ(cache.size(), GuestIdsCache::kMaxSandboxes);
  EXPECT_EQ(cache.Get("a", t0), nullptr);  // the oldest went first
}

TEST(EntryInfo, FromTheAgentsListing) {
  // As parsed from the agent's bytes (non-negative numbers are unsigned).
  const json listed = json::parse(R"({"name":"b","path":"/b","type":"directory","size":4096,
    "mode":493,"uid":0,"gid":0,"mtime":"2025-01-01T00:00:00Z"})");
  auto j = EntryInfoFromListing(listed);
  ASSERT_TRUE(j);
  EXPECT_EQ((*j)["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ((*j)["owner"], "0");
  EXPECT_FALSE(EntryInfoFromListing(json{{"name", 1}}));
  EXPECT_FALSE(EntryInfoFromListing(json::array()));
}

service::FileWatchEvent Ev(std::string type, std::string path,
                           std::optional<std::string> from = std::nullopt) {
  return service::FileWatchEvent{std::move(type), std::move(path), false, std::move(from)};
}

TEST(FilesystemEvents, NamesRelativeToTheWatchedDirectory) {
  using V = std::vector<json>;
  auto ev = [](std::string name, std::string type) {
    return json{{"name", name}, {"type", "EVENT_TYPE_" + type}};
  };
  EXPECT_EQ(FilesystemEvents("/tmp/w", Ev("create", "/tmp/w/a")), V{ev("a", "CREATE")});
  EXPECT_EQ(FilesystemEvents("/tmp/w", Ev("modify", "/tmp/w/d/a")), V{ev("d/a", "WRITE")});
  EXPECT_EQ(FilesystemEvents("/tmp/w", Ev("delete", "/tmp/w/a")), V{ev("a", "REMOVE")});
  EXPECT_EQ(FilesystemEvents("/", Ev("create", "/x")), V{ev("x", "CREATE")});
  EXPECT_EQ(FilesystemEvents("/tmp/w", Ev("move", "/tmp/w/b", "/tmp/w/a")),
            (V{ev("a", "RENAME"), ev("b", "CREATE")}));
  // sbx's upload: a temporary file renamed into place reads as envd's write in place.
  EXPECT_TRUE(FilesystemEvents("/tmp/w", Ev("create", "/tmp/w/.sbx-upload-0a1b")).empty());
  EXPECT_TRUE(FilesystemEvents("/tmp/w", Ev("modify", "/tmp/w/.sbx-upload-0a1b")).empty());
  EXPECT_EQ(FilesystemEvents("/tmp/w", Ev("move", "/tmp/w/f", "/tmp/w/.sbx-upload-0a1b")),
            (V{ev("f", "CREATE")}));
  EXPECT_TRUE(FilesystemEvents("/tmp/w", Ev("overflow", "/tmp/w")).empty());
  EXPECT_TRUE(FilesystemEvents("/tmp/w", Ev("create", "/tmp/wx")).empty());
}

TEST(Watchers, EventsSinceTheLastPollAndBounds) {
  WatcherTable t;
  const auto now = Clock::now();
  auto a = t.Add("sbx_a", now);
  ASSERT_TRUE(a.ok());
  a->second->Push(json{{"name", "x"}});
  auto events = t.Get("sbx_a", a->first)->Drain(now);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 1u);
  EXPECT_TRUE(t.Get("sbx_a", a->first)->Drain(now)->empty());
  // Another sandbox never sees it.
  EXPECT_EQ(t.Get("sbx_b", a->first), nullptr);
  EXPECT_FALSE(t.Remove("sbx_b", a->first));
  // Too many queued: dropped, and the next poll says so after the kept ones.
  for (size_t i = 0; i < Watcher::kMaxEvents + 5; ++i) a->second->Push(json::object());
  EXPECT_EQ(a->second->Drain(now)->size(), Watcher::kMaxEvents);
  EXPECT_EQ(a->second->Drain(now).status().code(), absl::StatusCode::kResourceExhausted);
  // The end of the watch is reported once the events are out.
  a->second->Push(json::object());
  a->second->End(absl::OkStatus());
  EXPECT_EQ(a->second->Drain(now)->size(), 1u);
  EXPECT_EQ(a->second->Drain(now).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(t.Remove("sbx_a", a->first));
  EXPECT_TRUE(a->second->Abandoned(now, WatcherTable::kIdle));
  EXPECT_EQ(t.size(), 0u);
}

TEST(Watchers, PerSandboxCapAndIdleSweep) {
  WatcherTable t;
  const auto now = Clock::now();
  for (size_t i = 0; i < WatcherTable::kMaxPerSandbox; ++i) ASSERT_TRUE(t.Add("sbx_a", now).ok());
  EXPECT_EQ(t.Add("sbx_a", now).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(t.Add("sbx_b", now).ok());
  // Nobody polled them: a later Add drops them first.
  const auto later = now + WatcherTable::kIdle + std::chrono::seconds(1);
  EXPECT_TRUE(t.Add("sbx_a", later).ok());
  EXPECT_EQ(t.size(), 1u);
}

}  // namespace
}  // namespace sbx::api::e2b

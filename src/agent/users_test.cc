#include "agent/users.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "agent/spawn.h"

namespace sbx::agent {
namespace {

constexpr const char* kPasswd =
    "root:x:0:0:root:/root:/bin/bash\n"
    "# comment\n"
    "broken line\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "alice:x:1000:1000:Alice,,,:/home/alice:/bin/sh\r\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
constexpr const char* kGroup =
    "root:x:0:\n"
    "adm:x:4:syslog,alice\n"
    "alice:x:1000:\n"
    "docker:x:999:bob,alice\n"
    "users:x:100:\n";

TEST(ResolveUser, ByName) {
  auto u = ResolveUser("alice", kPasswd, kGroup);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->uid, 1000u);
  EXPECT_EQ(u->gid, 1000u);
  EXPECT_EQ(u->home, "/home/alice");
  EXPECT_EQ(u->groups, (std::vector<gid_t>{1000, 4, 999}));
  auto root = ResolveUser("root", kPasswd, kGroup);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->uid, 0u);
  EXPECT_EQ(root->groups, (std::vector<gid_t>{0}));
}

TEST(ResolveUser, ByNumber) {
  auto known = ResolveUser("65534", kPasswd, kGroup);
  ASSERT_TRUE(known.ok());
  EXPECT_EQ(known->name, "nobody");
  EXPECT_EQ(known->gid, 65534u);
  auto unknown = ResolveUser("4242", kPasswd, kGroup);
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->uid, 4242u);
  EXPECT_EQ(unknown->gid, 4242u);
  EXPECT_TRUE(unknown->name.empty());
  EXPECT_EQ(unknown->groups, (std::vector<gid_t>{4242}));
}

TEST(ResolveUser, WithGroup) {
  auto a = ResolveUser("alice:users", kPasswd, kGroup);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->gid, 100u);
  EXPECT_EQ(a->groups.front(), 100u);
  auto b = ResolveUser("1000:5000", kPasswd, kGroup);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->gid, 5000u);
}

TEST(ResolveUser, Rejects) {
  EXPECT_EQ(ResolveUser("mallory", kPasswd, kGroup).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ResolveUser("alice:nogroup", kPasswd, kGroup).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(ResolveUser("", kPasswd, kGroup).ok());
  EXPECT_FALSE(ResolveUser(":1", kPasswd, kGroup).ok());
  EXPECT_FALSE(ResolveUser("alice:", kPasswd, kGroup).ok());
  EXPECT_FALSE(ResolveUser("99999999999", kPasswd, kGroup).ok());
  EXPECT_FALSE(ResolveUser("broken line", kPasswd, kGroup).ok());
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The files are cached by their stat identity: an edit in place of the same size, right after
// the first read, and a rename over the file must both be seen.
TEST(ResolveUserFromFiles, SeesEditsOfTheCachedFiles) {
  char dir[] = "/tmp/sbx-users-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string passwd = std::string(dir) + "/passwd", group = std::string(dir) + "/group";
  WriteFile(passwd, "alice:x:1000:1000::/home/alice:/bin/sh\n");
  WriteFile(group, "");
  for (int round = 0; round < 2; ++round) {
    auto u = ResolveUserFromFiles("alice", passwd, group);
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_EQ(u->uid, 1000u);
  }
  WriteFile(passwd, "alice:x:1001:1001::/home/alice:/bin/sh\n");  // same size
  auto edited = ResolveUserFromFiles("alice", passwd, group);
  ASSERT_TRUE(edited.ok()) << edited.status();
  EXPECT_EQ(edited->uid, 1001u);
  WriteFile(passwd + ".new", "alice:x:1002:1002::/home/alice:/bin/sh\n");
  ASSERT_EQ(std::rename((passwd + ".new").c_str(), passwd.c_str()), 0);
  auto renamed = ResolveUserFromFiles("alice", passwd, group);
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(renamed->uid, 1002u);
  ::unlink(passwd.c_str());
  EXPECT_FALSE(ResolveUserFromFiles("alice", passwd, group).ok());
  ::unlink(group.c_str());
  ::rmdir(dir);
}

TEST(PasswdNames, NamesOnlyTheWantedUidsFromTheSameEntriesAsResolveUser) {
  const std::string passwd = std::string(kPasswd) + "root2:x:0:0::/:/bin/sh\n" +
                             "#comment:x:7:7::/:/bin/sh\n" + "spaced:x: 8:8::/:/bin/sh\n";
  const auto names = PasswdNames(passwd, {0, 1000, 7, 8, 42});
  EXPECT_EQ(names, (std::map<int64_t, std::string>{{0, "root"}, {1000, "alice"}}));
  EXPECT_TRUE(PasswdNames(passwd, {}).empty());
  // A name past the field bound is cut like every guest-chosen string in a reply.
  const std::string long_name(100000, 'n');
  EXPECT_LT(PasswdNames(long_name + ":x:5:5::/:/bin/sh\n", {5}).at(5).size(), long_name.size());
}

TEST(BuildEnv, StripsAgentVariablesAndOverlays) {
  const char* base[] = {"PATH=/bin", "HOME=/root", "SBX_AGENT_TOKEN=secret", "SBX_OTHER=1",
                        "NOEQUALS", "=bad", nullptr};
  auto env = BuildEnv(const_cast<char**>(base), {{"HOME", "/home/x"}, {"NEW", "a=b"}});
  EXPECT_EQ(env, (std::vector<std::string>{"HOME=/home/x", "NEW=a=b", "PATH=/bin",
                                           "SBX_OTHER=1"}));
}

TEST(ExecCandidates, SearchesPathUnlessArgv0HasASlash) {
  EXPECT_EQ(ExecCandidates("./run", "/bin"), (std::vector<std::string>{"./run"}));
  EXPECT_EQ(ExecCandidates("ls", "/usr/bin:/bin/::x"),
            (std::vector<std::string>{"/usr/bin/ls", "/bin/ls", "ls", "x/ls"}));
}

}  // namespace
}  // namespace sbx::agent

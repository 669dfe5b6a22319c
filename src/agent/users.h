// Resolves a session's `user` field from /etc/passwd and /etc/group, parsed by hand: sbx-agent
// is linked statically and must not go through NSS (getpwnam would dlopen host modules).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::agent {

struct ResolvedUser {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, including gid
  std::string name;           // empty for a numeric uid without a passwd entry
  std::string home;
};

// `spec` is "name", "uid", "name:group" or "uid:gid". A numeric uid need not exist in passwd;
// its primary group is then the same number. Supplementary groups are the /etc/group entries
// that list the user's name.
absl::StatusOr<ResolvedUser> ResolveUser(std::string_view spec, std::string_view passwd,
                                         std::string_view group);

// Same, reading the two files (a missing file is treated as empty).
absl::StatusOr<ResolvedUser> ResolveUserFromFiles(std::string_view spec,
                                                  const std::string& passwd_path = "/etc/passwd",
                                                  const std::string& group_path = "/etc/group");

// uid -> name from the text of the sandbox's /etc/passwd, for the uids in `wanted` only: the
// file is the guest's, and its size is not ours to hold in a map.
std::map<int64_t, std::string> PasswdNames(std::string_view passwd,
                                           const std::set<int64_t>& wanted);

}  // namespace sbx::agent

// Templates known to this sbxd. Today there is one built-in template, `base`: read-only views
// of the host's /usr and /etc plus the merged-/usr symlinks, so python3, sh and coreutils exist
// in every sandbox without a download. Its skeleton lower layer lives in
// <state_dir>/templates/base/rootfs and is (re)built at start-up.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/backend.h"

namespace sbx::service {

class TemplateRegistry {
 public:
  // Builds the `base` skeleton under state_dir; `host_root` is "/" except in tests.
  static absl::StatusOr<TemplateRegistry> Create(const std::string& state_dir,
                                                 const std::string& host_root = "/");
  // "base", "base:latest" -> the spec; unknown names or tags -> template_not_found.
  absl::StatusOr<runtime::TemplateSpec> Resolve(const std::string& ref) const;
  // Resolve, plus what a launch would find missing only at the first create: the skeleton
  // lower layer and every bind's host path must exist (sbx doctor, sbxd start-up).
  absl::Status Check(const std::string& ref) const;

 private:
  std::map<std::string, runtime::TemplateSpec> templates_;  // by "name:tag"
};

// For preflight checks (sbx doctor, sbxd --check): builds the registry as sbxd's start-up would
// and Check()s `ref`. A state dir that does not exist yet is left alone: the skeleton is then
// built in a temporary directory (removed afterwards), which tests the same host views.
absl::Status CheckTemplateForDoctor(const std::string& state_dir, const std::string& ref = "base");

}  // namespace sbx::service

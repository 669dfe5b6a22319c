// Templates known to this sbxd. Today there is one built-in template, `base`: read-only views
// of the host's /usr and /etc plus the merged-/usr symlinks, so python3, sh and coreutils exist
// in every sandbox without a download. Its skeleton lower layer lives in
// <state_dir>/templates/base/rootfs and is (re)built at start-up.
#pragma once

#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend.h"

namespace sbx::service {

class TemplateRegistry {
 public:
  // Builds the `base` skeleton under state_dir; `host_root` is "/" except in tests.
  static absl::StatusOr<TemplateRegistry> Create(const std::string& state_dir,
                                                 const std::string& host_root = "/");
  // "base", "name", "name:tag", "name@sha256:..." -> the spec (its digest the release's);
  // a malformed reference -> invalid_template_ref; unknown names or tags -> template_not_found.
  // `ns` is the caller's template namespace (template_ref.h): its own name wins over a shared
  // one of the same name; "" sees the shared catalogue only. The error lists only names `ns`
  // sees.
  absl::StatusOr<runtime::TemplateSpec> Resolve(const std::string& ref,
                                                const std::string& ns = "") const;
  // The spec a sandbox was created with: its release `digest`, wherever `ref`'s tag points
  // now. FailedPrecondition when that release is gone.
  absl::StatusOr<runtime::TemplateSpec> ResolvePinned(const std::string& ref,
                                                      const std::string& digest) const;

  // Image templates (docs/templates.md), kept by TemplateService: loaded from the store at
  // start-up, changed as imports, pulls, tags and deletes commit. Safe from any thread.
  void AddImage(const runtime::TemplateSpec& spec);  // spec.name: the name it was made under
  void RemoveImage(const std::string& digest);
  void SetTag(const std::string& name, const std::string& tag, const std::string& digest);
  void RemoveTag(const std::string& name, const std::string& tag);
  // "name:tag" -> digest of every tag (names qualified), base's included.
  std::map<std::string, std::string> Tags() const;
  // The digest one tag (`name` qualified) names here; "" when it names none.
  std::string TagDigest(const std::string& name, const std::string& tag) const;
  // Sets the tag to `to` ("" removes it) only if it still names `from` ("": names nothing);
  // false when it changed meanwhile (a create or import on this node got there first).
  bool ReplaceTag(const std::string& name, const std::string& tag, const std::string& from,
                  const std::string& to);
  // Whether the image release `digest` is loaded here (its layers are on this host).
  bool HoldsRelease(const std::string& digest) const;
  const std::string& base_digest() const { return base_.digest; }
  // Resolve, plus what a launch would find missing only at the first create: the skeleton
  // lower layer and every bind's host path must exist (sbx doctor, sbxd start-up).
  absl::Status Check(const std::string& ref) const;

 private:
  runtime::TemplateSpec base_;
  struct Images {
    mutable std::shared_mutex mu;
    std::map<std::string, runtime::TemplateSpec> by_digest;
    std::map<std::string, std::string> tags;  // "name:tag" -> digest
  };
  // Shared so the registry stays movable (it is built before the service that keeps it).
  std::shared_ptr<Images> images_ = std::make_shared<Images>();
};

// For preflight checks (sbx doctor, sbxd --check): builds the registry as sbxd's start-up would
// and Check()s `ref`. A state dir that does not exist yet is left alone: the skeleton is then
// built in a temporary directory (removed afterwards), which tests the same host views.
absl::Status CheckTemplateForDoctor(const std::string& state_dir, const std::string& ref = "base");

}  // namespace sbx::service

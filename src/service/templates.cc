#include "service/templates.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "common/digest.h"
#include "common/status_util.h"
#include "service/template_ref.h"

namespace sbx::service {
namespace fs = std::filesystem;
namespace {

absl::Status MkdirAll(const fs::path& p, mode_t mode) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) return ErrnoStatus(ec.value(), fmt::format("template: mkdir({})", p.string()));
  if (::chmod(p.c_str(), mode) != 0) {
    return ErrnoStatus(errno, fmt::format("template: chmod({})", p.string()));
  }
  return absl::OkStatus();
}

absl::Status Symlink(const std::string& target, const fs::path& link) {
  std::error_code ec;
  if (fs::is_symlink(link, ec)) {
    if (fs::read_symlink(link, ec) == target) return absl::OkStatus();
    fs::remove(link, ec);
  }
  if (::symlink(target.c_str(), link.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("template: symlink({} -> {})", link.string(), target));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TemplateRegistry> TemplateRegistry::Create(const std::string& state_dir,
                                                          const std::string& host_root) {
  const fs::path base = fs::path(state_dir) / "templates" / "base";
  const fs::path rootfs = base / "rootfs";
  const fs::path host(host_root);
  SBX_RETURN_IF_ERROR(MkdirAll(rootfs, 0755));
  // Mount points for the views and the runtime's own mounts.
  for (const char* d : {"usr", "etc", "proc", "dev", "sys", "run", "var", "mnt", "opt", "srv",
                        "home", "media"}) {
    SBX_RETURN_IF_ERROR(MkdirAll(rootfs / d, 0755));
  }
  SBX_RETURN_IF_ERROR(MkdirAll(rootfs / "root", 0700));
  SBX_RETURN_IF_ERROR(MkdirAll(rootfs / "tmp", 01777));
  SBX_RETURN_IF_ERROR(MkdirAll(rootfs / "var" / "tmp", 01777));

  runtime::TemplateSpec spec;
  spec.name = "base";
  spec.rootfs_dir = rootfs.string();
  spec.workdir = "/";
  spec.default_user = "root";
  nlohmann::json descriptor = {{"name", "base"}, {"links", nlohmann::json::array()}};

  // merged-/usr: /bin, /sbin, /lib, /lib64, ... are symlinks into /usr on Debian 12. Mirror the
  // host so binaries find their interpreter and libraries at the usual paths.
  for (const char* d : {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}) {
    std::error_code ec;
    fs::path usr_dir = host / "usr" / d;
    if (!fs::is_directory(usr_dir, ec)) continue;
    SBX_RETURN_IF_ERROR(Symlink(std::string("usr/") + d, rootfs / d));
    descriptor["links"].push_back(d);
  }
  spec.binds.push_back({(host / "usr").string(), "/usr", true});
  spec.binds.push_back({(host / "etc").string(), "/etc", true});

  // The /etc view must not leak the host's secrets: mask them with an empty, read-only file.
  const fs::path empty = base / "empty";
  {
    int fd = ::open(empty.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
    if (fd < 0) return ErrnoStatus(errno, fmt::format("template: open({})", empty.string()));
    ::close(fd);
  }
  const fs::path empty_dir = base / "empty.d";
  SBX_RETURN_IF_ERROR(MkdirAll(empty_dir, 0555));
  nlohmann::json masked = nlohmann::json::array();
  for (const char* secret : {"etc/shadow", "etc/gshadow", "etc/shadow-", "etc/gshadow-",
                             "etc/ssh/ssh_host_rsa_key", "etc/ssh/ssh_host_ecdsa_key",
                             "etc/ssh/ssh_host_ed25519_key", "etc/ssl/private"}) {
    std::error_code ec;
    fs::path p = host / secret;
    if (!fs::exists(p, ec)) continue;
    const fs::path& mask = fs::is_directory(p, ec) ? empty_dir : empty;
    spec.binds.push_back({mask.string(), std::string("/") + secret, true});
    masked.push_back(secret);
  }
  descriptor["binds"] = {"/usr", "/etc"};
  descriptor["masked"] = masked;
  spec.digest = "sha256:" + Sha256Hex(descriptor.dump());

  TemplateRegistry reg;
  reg.base_ = spec;
  return reg;
}

namespace {

// Names the caller's namespace sees: its own (shown without the qualifier) and the shared ones.
absl::Status NotFound(const std::string& ref, const std::map<std::string, std::string>& tags,
                      const std::string& ns) {
  std::string names = "base";
  int n = 0;
  for (const auto& [key, digest] : tags) {
    const SplitName s = SplitTemplateName(key);
    if (!s.ns.empty() && s.ns != ns) continue;
    if (++n > 10) {
      names += ", ...";
      break;
    }
    names += ", " + s.name;
  }
  return ApiError(absl::StatusCode::kFailedPrecondition, "template_not_found",
                  fmt::format("template '{}' not found (available: {})", ref, names), "template");
}

}  // namespace

absl::StatusOr<runtime::TemplateSpec> TemplateRegistry::Resolve(const std::string& ref,
                                                                const std::string& ns) const {
  SBX_ASSIGN_OR_RETURN(TemplateRef r, ParseTemplateRef(ref));
  if (r.name == "base" && (r.tag == "latest" || r.digest == base_.digest)) return base_;
  // The caller's own name first, then the shared one.
  std::vector<std::string> names;
  if (!ns.empty()) names.push_back(QualifiedTemplateName(ns, r.name));
  names.push_back(r.name);
  std::shared_lock lock(images_->mu);
  if (r.digest.empty()) {
    for (const std::string& name : names) {
      auto t = images_->tags.find(name + ":" + r.tag);
      if (t == images_->tags.end()) continue;
      auto it = images_->by_digest.find(t->second);
      if (it == images_->by_digest.end()) break;
      return it->second;
    }
    return NotFound(ref, images_->tags, ns);
  }
  auto it = images_->by_digest.find(r.digest);
  if (it == images_->by_digest.end()) return NotFound(ref, images_->tags, ns);
  // name@digest names a release of that name: made under it, or tagged under it now.
  for (const std::string& name : names) {
    if (it->second.name == name) return it->second;
    for (const auto& [key, d] : images_->tags) {
      if (d == r.digest && key.rfind(name + ":", 0) == 0) return it->second;
    }
  }
  return NotFound(ref, images_->tags, ns);
}

absl::StatusOr<runtime::TemplateSpec> TemplateRegistry::ResolvePinned(
    const std::string& ref, const std::string& digest) const {
  if (digest == base_.digest) return base_;
  {
    std::shared_lock lock(images_->mu);
    auto it = images_->by_digest.find(digest);
    if (it != images_->by_digest.end()) return it->second;
  }
  return absl::FailedPreconditionError(fmt::format(
      "template {}: its release {} is no longer in the template store", ref, digest));
}

void TemplateRegistry::AddImage(const runtime::TemplateSpec& spec) {
  std::unique_lock lock(images_->mu);
  images_->by_digest[spec.digest] = spec;
}

void TemplateRegistry::RemoveImage(const std::string& digest) {
  std::unique_lock lock(images_->mu);
  images_->by_digest.erase(digest);
}

void TemplateRegistry::SetTag(const std::string& name, const std::string& tag,
                              const std::string& digest) {
  std::unique_lock lock(images_->mu);
  images_->tags[name + ":" + tag] = digest;
}

void TemplateRegistry::RemoveTag(const std::string& name, const std::string& tag) {
  std::unique_lock lock(images_->mu);
  images_->tags.erase(name + ":" + tag);
}

std::map<std::string, std::string> TemplateRegistry::Tags() const {
  std::shared_lock lock(images_->mu);
  std::map<std::string, std::string> out = images_->tags;
  out["base:latest"] = base_.digest;
  return out;
}

bool TemplateRegistry::ReplaceTag(const std::string& name, const std::string& tag,
                                  const std::string& from, const std::string& to) {
  std::unique_lock lock(images_->mu);
  const std::string key = name + ":" + tag;
  auto it = images_->tags.find(key);
  if ((it == images_->tags.end() ? std::string() : it->second) != from) return false;
  if (to.empty()) {
    if (it != images_->tags.end()) images_->tags.erase(it);
  } else {
    images_->tags[key] = to;
  }
  return true;
}

bool TemplateRegistry::HoldsRelease(const std::string& digest) const {
  std::shared_lock lock(images_->mu);
  return images_->by_digest.count(digest) != 0;
}

std::string TemplateRegistry::TagDigest(const std::string& name, const std::string& tag) const {
  std::shared_lock lock(images_->mu);
  auto it = images_->tags.find(name + ":" + tag);
  return it == images_->tags.end() ? std::string() : it->second;
}

absl::Status TemplateRegistry::Check(const std::string& ref) const {
  SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec spec, Resolve(ref));
  struct stat st;
  if (::stat(spec.rootfs_dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, fmt::format("template '{}': its rootfs: stat({})", ref, spec.rootfs_dir));
  }
  for (const auto& bind : spec.binds) {
    if (::stat(bind.host_path.c_str(), &st) != 0) {
      return ErrnoStatus(errno, fmt::format("template '{}': the source of its view {}: stat({})", ref,
                                            bind.sandbox_path, bind.host_path));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTemplateForDoctor(const std::string& state_dir, const std::string& ref) {
  std::error_code ec;
  if (fs::is_directory(state_dir, ec)) {
    SBX_ASSIGN_OR_RETURN(TemplateRegistry reg, TemplateRegistry::Create(state_dir));
    return reg.Check(ref);
  }
  char tmpl[] = "/tmp/sbx-doctor-template-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return ErrnoStatus(errno, "template check: mkdtemp(/tmp/sbx-doctor-template-XXXXXX)");
  absl::Status st = [&]() -> absl::Status {
    SBX_ASSIGN_OR_RETURN(TemplateRegistry reg, TemplateRegistry::Create(tmpl));
    return reg.Check(ref);
  }();
  fs::remove_all(tmpl, ec);
  return st;
}

}  // namespace sbx::service

// Template builds (docs/templates.md, "Builds"): a Dockerfile subset run step by step over a
// parent template or image. ENV, WORKDIR, USER, ARG, LABEL, CMD and ENTRYPOINT change the
// config; RUN, COPY and ADD each run in a sandbox of the result so far (build_steps.cc), whose
// writable layer becomes the step's layer. Each such step is cached by its parent's key and the
// step (for COPY/ADD also the digest of the files it copies), so a rebuild with one changed
// step redoes only what follows it.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/digest.h"
#include "common/files.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "archive/tar.h"
#include "image/build_context.h"
#include "image/dockerfile.h"
#include "image/layer_unpack.h"
#include "image/oci.h"
#include "registry/registry.h"
#include "service/service_internal.h"
#include "service/template_service.h"

namespace sbx::service {

namespace fs = std::filesystem;
namespace df = image::dockerfile;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxDockerfileBytes = 1 << 20;
constexpr size_t kMaxOutputLine = 512;
constexpr int64_t kDefaultStepTimeoutS = 3600;

absl::Status DockerfileError(const absl::Status& s) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                  std::string(s.message()), "source.build.dockerfile");
}

std::string StepName(const df::Step& s, int n, int total) {
  return fmt::format("step {}/{} (Dockerfile line {}): {:.200}", n, total, s.line, s.text);
}

// "K=V" entries, replacing K when it is there.
void SetEnv(std::vector<std::string>& env, const std::string& k, const std::string& v) {
  for (std::string& e : env) {
    if (e.compare(0, k.size() + 1, k + "=") == 0) {
      e = k + "=" + v;
      return;
    }
  }
  env.push_back(k + "=" + v);
}

std::map<std::string, std::string> EnvMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const std::string& e : env) {
    size_t eq = e.find('=');
    if (eq != std::string::npos && eq > 0) out[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return out;
}

image::ImageConfig ConfigOf(const json& c) {
  image::ImageConfig out;
  auto strings = [&](const char* key) {
    std::vector<std::string> v;
    auto it = c.find(key);
    if (it != c.end() && it->is_array()) {
      for (const auto& x : *it) {
        if (x.is_string()) v.push_back(x.get<std::string>());
      }
    }
    return v;
  };
  out.env = strings("env");
  out.entrypoint = strings("entrypoint");
  out.cmd = strings("cmd");
  out.working_dir = c.value("working_dir", "");
  out.user = c.value("user", "");
  if (auto it = c.find("labels"); it != c.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (v.is_string()) out.labels[k] = v.get<std::string>();
    }
  }
  out.os = "linux";
  out.architecture = "amd64";
  return out;
}

std::string AbsPath(const std::string& cwd, const std::string& p) {
  if (!p.empty() && p[0] == '/') return p;
  std::string base = cwd.empty() ? "/" : cwd;
  if (base.back() != '/') base += '/';
  return base + p;
}

// The OCI config and manifest of a built release: its digest names it, as a registry would.
void Seal(image::Image& img) {
  const image::ImageConfig& c = img.config;
  json labels = json::object();
  for (const auto& [k, v] : c.labels) labels[k] = v;
  json cfg = {{"Env", c.env}, {"WorkingDir", c.working_dir}, {"User", c.user},
              {"Labels", labels}};
  if (!c.entrypoint.empty()) cfg["Entrypoint"] = c.entrypoint;
  if (!c.cmd.empty()) cfg["Cmd"] = c.cmd;
  json diff_ids = json::array();
  for (const auto& l : img.layers) diff_ids.push_back(l.diff_id);
  json config = {{"architecture", "amd64"},
                 {"os", "linux"},
                 {"config", cfg},
                 {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
  const std::string config_text = config.dump();
  img.config_digest = Sha256Digest(config_text);
  json manifest = {{"schemaVersion", 2},
                   {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                   {"config",
                    {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                     {"digest", img.config_digest},
                     {"size", config_text.size()}}},
                   {"layers", json::array()}};
  for (const auto& l : img.layers) {
    manifest["layers"].push_back({{"mediaType", "application/vnd.oci.image.layer.v1.tar"},
                                  {"digest", l.diff_id},
                                  {"size", l.unpacked_bytes}});
  }
  img.digest = Sha256Digest(manifest.dump());
  img.config_json = image::oci::ConfigJson(c);
}

// Reads the Dockerfile out of the context tar (bounded).
absl::StatusOr<std::string> DockerfileFromContext(const std::string& context,
                                                  const std::string& path) {
  auto want = image::NormalizeContextPath(path);
  if (!want || want->empty()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                    fmt::format("Dockerfile: bad path \"{:.100}\" in the context", path));
  }
  UniqueFd in(::open(context.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return ErrnoStatus(errno, "build: open the context");
  std::string chunk(1 << 20, '\0');
  archive::TarReader reader([&]() -> absl::StatusOr<std::string_view> {
    for (;;) {
      ssize_t n = ::read(in.get(), chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "build: read the context");
      return std::string_view(chunk.data(), static_cast<size_t>(n));
    }
  });
  for (;;) {
    auto e = reader.Next();
    if (!e.ok()) {
      return ApiError(absl::StatusCode::kInvalidArgument, "invalid_build_context",
                      fmt::format("build context: {}", std::string(e.status().message())));
    }
    if (!e->has_value()) break;
    auto name = image::NormalizeContextPath((*e)->name);
    const bool it = name && *name == *want && (*e)->type == archive::TarType::kFile;
    std::string text;
    for (;;) {
      auto p = reader.Read();
      if (!p.ok()) return p.status();
      if (p->bytes.empty()) break;
      if (!it) continue;
      if (text.size() + p->bytes.size() > kMaxDockerfileBytes) {
        return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                        "Dockerfile: larger than 1 MiB");
      }
      text.append(p->bytes);
    }
    if (it) return text;
  }
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                  fmt::format("Dockerfile: \"{:.100}\" is not in the build context", path));
}

// The build cache: one small file per step key, naming the layer the step made ("" for a
// step that changed nothing). A layer gc removed since makes the entry a miss.
std::optional<image::LayerInfo> ReadCacheEntry(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  char buf[1024];
  ssize_t n = ::read(fd.get(), buf, sizeof(buf));
  if (n <= 0) return std::nullopt;
  auto j = ParseUntrustedJson(std::string_view(buf, static_cast<size_t>(n)));
  if (!j.ok() || !j->is_object()) return std::nullopt;
  image::LayerInfo out;
  out.diff_id = j->value("diff_id", "");
  out.unpacked_bytes = j->value("unpacked_bytes", uint64_t{0});
  out.entries = j->value("entries", uint64_t{0});
  if (!out.diff_id.empty() && !image::IsDigest(out.diff_id)) return std::nullopt;
  return out;
}

void WriteCacheFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn("template build: cannot write the cache entry {}: {}", path, strerror(errno));
    ::unlink(tmp.c_str());
  }
}

void WriteCacheEntry(const std::string& path, const image::LayerInfo& l) {
  WriteCacheFile(path, json{{"diff_id", l.diff_id},
                            {"unpacked_bytes", l.unpacked_bytes},
                            {"entries", l.entries}}.dump());
}

}  // namespace

runtime::TemplateSpec TemplateService::SpecOfBuild(const image::Image& img) const {
  runtime::TemplateSpec spec;
  spec.name = "build";
  spec.digest = "sha256:" + std::string(64, '0');
  spec.rootfs_dir = skel_dir_;
  for (auto it = img.layers.rbegin(); it != img.layers.rend(); ++it) {
    auto tree = layers_->TreeOf(it->diff_id);
    if (tree.ok()) spec.lower_dirs.push_back(*tree);
  }
  spec.env = img.config.env;
  spec.workdir = img.config.working_dir.empty() ? "/" : img.config.working_dir;
  spec.default_user = img.config.user.empty() ? "root" : img.config.user;
  return spec;
}

absl::StatusOr<image::Image> TemplateService::BuildParent(const std::string& op_id,
                                                          const std::string& ref,
                                                          const std::string& ns,
                                                          const std::string& dir,
                                                          const image::ProgressFn& progress,
                                                          const image::CancelFn& cancelled) {
  (void)op_id;
  if (ref.find('/') == std::string::npos) {
    auto tmpl = templates_.Resolve(ref, ns);
    if (!tmpl.ok()) {
      return ApiError(absl::StatusCode::kNotFound, "template_not_found",
                      fmt::format("FROM {:.100}: {}; an image of a registry is named with its "
                                  "registry (FROM registry.example/team/app:1)",
                                  ref, std::string(tmpl.status().message())));
    }
    if (tmpl->digest == templates_.base_digest()) {
      return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                      "FROM base: `base` is a view of the host's /usr and /etc, not an image "
                      "to build on; build FROM an image template or a registry image");
    }
    return StoredImage(tmpl->digest, ref);
  }
  auto r = registry::ParseReference(ref);
  if (!r.ok()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                    fmt::format("FROM {:.100}: {}", ref, std::string(r.status().message())));
  }
  const std::string layout = dir + "/parent";
  // The tag is resolved again (it may have moved), but an image already in the store, every
  // layer there, is not fetched again.
  std::optional<image::Image> have;
  SBX_ASSIGN_OR_RETURN(
      std::string digest,
      registry::PullToLayout(*r, opts_.registry, layout, progress, cancelled,
                             [&](const std::string& d) {
                               auto img = StoredImage(d, ref);
                               if (!img.ok()) img = CachedParent(d);
                               if (img.ok()) have = std::move(*img);
                               return have.has_value();
                             }));
  if (have) return std::move(*have);
  SBX_ASSIGN_OR_RETURN(image::Image img,
                       image::ImportLayout(layout, digest, *layers_, progress, cancelled));
  // Its layers stay in the store until a gc finds them unused; until then the next build
  // FROM the same image fetches only its manifest.
  json entry = {{"parent", img.digest},
                {"config", image::oci::ConfigJson(img.config)},
                {"layers", json::array()}};
  for (const auto& l : img.layers) {
    entry["layers"].push_back(
        {{"diff_id", l.diff_id}, {"unpacked_bytes", l.unpacked_bytes}, {"entries", l.entries}});
  }
  WriteCacheFile(ParentCachePath(img.digest), entry.dump());
  return img;
}

std::string TemplateService::ParentCachePath(const std::string& digest) const {
  return fmt::format("{}/build-cache/parent-{}.json", opts_.dir,
                     digest.substr(digest.find(':') + 1));
}

absl::StatusOr<image::Image> TemplateService::CachedParent(const std::string& digest) {
  if (!image::IsDigest(digest)) return absl::NotFoundError("not a digest");
  SBX_ASSIGN_OR_RETURN(json j, ParseUntrustedJson(ReadFileOrEmpty(ParentCachePath(digest))));
  if (!j.is_object() || j.value("parent", "") != digest || !j.contains("layers") ||
      !j["layers"].is_array() || !j.contains("config") || !j["config"].is_object()) {
    return absl::NotFoundError("no cached parent " + digest);
  }
  image::Image img;
  img.digest = digest;
  for (const auto& l : j["layers"]) {
    if (!l.is_object()) return absl::NotFoundError("bad cached parent " + digest);
    image::LayerInfo li;
    li.diff_id = l.value("diff_id", "");
    li.unpacked_bytes = l.value("unpacked_bytes", uint64_t{0});
    li.entries = l.value("entries", uint64_t{0});
    if (!layers_->Has(li.diff_id)) return absl::NotFoundError("a layer of the parent is gone");
    img.layers.push_back(li);
  }
  img.config = ConfigOf(j["config"]);
  return img;
}

absl::StatusOr<image::Image> TemplateService::StoredImage(const std::string& digest,
                                                          const std::string& ref) {
  store::ImageRecord rec;
  SBX_RETURN_IF_ERROR(store_.Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(rec, tx.GetImage(digest));
    return absl::OkStatus();
  }));
  image::Image img;
  img.digest = rec.digest;
  for (const auto& l : rec.layers) {
    if (!l.is_object()) continue;
    image::LayerInfo li;
    li.diff_id = l.value("diff_id", "");
    li.unpacked_bytes = l.value("unpacked_bytes", uint64_t{0});
    li.entries = l.value("entries", uint64_t{0});
    if (!layers_->Has(li.diff_id)) {
      return absl::FailedPreconditionError(
          fmt::format("FROM {}: its layer {} is gone from the store", ref, li.diff_id));
    }
    img.layers.push_back(li);
  }
  img.config = ConfigOf(rec.config);
  return img;
}

absl::StatusOr<OperationStarted> TemplateService::Build(const Caller& caller,
                                                        const TemplateTarget& target,
                                                        BuildSpec spec,
                                                        std::optional<Upload> context) {
  std::string context_path;
  if (context) {
    if (context->fd >= 0) ::close(context->fd);
    context->fd = -1;
    context_path = context->path;
  }
  auto cleanup = [context_path] {
    if (!context_path.empty()) ::unlink(context_path.c_str());
  };
  auto refuse = [&](absl::Status s) {
    cleanup();
    return s;
  };
  if (!opts_.build_step) {
    return refuse(ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                           "template builds need a runtime that runs sandboxes (sbxd's ns runtime)"));
  }
  if (!spec.dockerfile.empty()) {
    auto parsed = df::Parse(spec.dockerfile);
    if (!parsed.ok()) return refuse(DockerfileError(parsed.status()));
  } else if (context_path.empty()) {
    return refuse(ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                           "a build needs a Dockerfile: its text, or a context that holds it",
                           "source.build.dockerfile"));
  }
  spec.ns = NamespaceOf(caller);
  spec.tenant_id = caller.tenant_id;
  // Refused now rather than at the first RUN (each step checks again: the list may change).
  if (absl::Status st = store_.Transact([&](store::Tx& tx) {
        return CheckEgressProfile(tx, caller.tenant_id, spec.sandbox.egress_profile);
      });
      !st.ok()) {
    return refuse(ApiError(st.code(), ApiErrorCode(st),
                           fmt::format("source.build.sandbox: {}", std::string(st.message())),
                           "source.build.sandbox.egress_profile"));
  }
  json source = {{"kind", "build"}};
  if (!spec.args.empty()) source["args"] = spec.args;
  if (spec.sandbox.egress_profile != "none") source["egress_profile"] = spec.sandbox.egress_profile;
  auto started = Start(
      caller, "template_build", target, source,
      [this, spec, context_path](const std::string& op_id, const image::ProgressFn& progress,
                                 const image::CancelFn& cancelled) {
        return RunBuild(op_id, spec, context_path, progress, cancelled);
      },
      cleanup);
  if (!started.ok()) cleanup();
  return started;
}

absl::StatusOr<image::Image> TemplateService::RunBuild(const std::string& op_id,
                                                       const BuildSpec& spec,
                                                       const std::string& context,
                                                       const image::ProgressFn& progress,
                                                       const image::CancelFn& cancelled) {
  auto built = RunBuildSteps(op_id, spec, context, progress, cancelled);
  if (!built.ok()) {
    // A line that is not quiet writes the log: the last output of a failed RUN is in it.
    image::Progress p;
    p.stage = "failed";
    p.message = std::string(built.status().message()).substr(0, kMaxOutputLine);
    progress(p);
  }
  return built;
}

absl::StatusOr<image::Image> TemplateService::RunBuildSteps(const std::string& op_id,
                                                            const BuildSpec& spec,
                                                            const std::string& context,
                                                            const image::ProgressFn& progress,
                                                            const image::CancelFn& cancelled) {
  std::string text = spec.dockerfile;
  if (text.empty()) {
    SBX_ASSIGN_OR_RETURN(text, DockerfileFromContext(context, spec.dockerfile_path));
  }
  auto parsed = df::Parse(text);
  if (!parsed.ok()) return DockerfileError(parsed.status());
  const df::Dockerfile& file = *parsed;
  const int total = static_cast<int>(file.steps.size());

  // The build's own directory: step tars, the parent's pull. Removed whatever happens.
  const std::string dir = opts_.dir + "/builds/" + op_id;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(fmt::format("build: mkdir {}: {}", dir, ec.message()));
  struct RemoveDir {
    std::string d;
    ~RemoveDir() {
      std::error_code e;
      fs::remove_all(d, e);
    }
  } remove_dir{dir};
  const std::string cache_dir = opts_.dir + "/build-cache";
  fs::create_directories(cache_dir, ec);

  image::Progress p;
  p.stage = "building";
  p.steps_total = total;
  auto say = [&](std::string line, bool quiet = false) {
    p.message = std::move(line);
    p.quiet = quiet;
    progress(p);
    p.message.clear();
    p.quiet = false;
  };

  // ARGs: those declared before FROM may be used in FROM; a value given to the build wins.
  std::map<std::string, std::string> vars;
  for (const df::Step& a : file.args_before_from) {
    for (const auto& [k, v] : a.pairs) {
      auto given = spec.args.find(k);
      if (given != spec.args.end()) {
        vars[k] = given->second;
      } else if (a.has_default) {
        SBX_ASSIGN_OR_RETURN(vars[k], df::Expand(v, vars));
      }
    }
  }

  image::Image img;
  std::string key;
  uint64_t budget = opts_.limits.max_image_bytes;
  std::map<std::string, std::string> args_in_scope;  // ARGs after FROM: env of RUN steps
  bool cmd_set_here = false;                          // a CMD of this Dockerfile
  int n = 0;
  for (const df::Step& s : file.steps) {
    ++n;
    if (cancelled()) return absl::CancelledError("build: cancelled");
    p.steps_done = n - 1;
    say(StepName(s, n, total));
    auto expand = [&](const std::string& w) -> absl::StatusOr<std::string> {
      // As Docker: an ARG declared before FROM is seen after it only when declared again.
      std::map<std::string, std::string> scope = args_in_scope;
      for (const auto& [k, v] : EnvMap(img.config.env)) scope[k] = v;
      auto r = df::Expand(w, scope);
      if (!r.ok()) {
        return ApiError(absl::StatusCode::kInvalidArgument, "invalid_dockerfile",
                        fmt::format("Dockerfile line {}: {}", s.line, std::string(r.status().message())));
      }
      return r;
    };
    auto line_error = [&](absl::Status st, std::string_view code) {
      return ApiError(st.code(), code,
                      fmt::format("{}: {}", StepName(s, n, total), std::string(st.message())));
    };
    switch (s.kind) {
      case df::Kind::kFrom: {
        SBX_ASSIGN_OR_RETURN(std::string ref, df::Expand(s.value, vars));
        SBX_ASSIGN_OR_RETURN(img, BuildParent(op_id, ref, spec.ns, dir, progress, cancelled));
        img.config.os = "linux";
        img.config.architecture = "amd64";
        for (const auto& l : img.layers) budget -= std::min(budget, l.unpacked_bytes);
        // Each tenant's steps chain from their own root: a cached RUN of another tenant (made
        // with its egress, its secrets in ARGs) never stands in for this one's.
        key = spec.ns.empty() ? img.digest : Sha256Digest(spec.ns + "\n" + img.digest);
        say(fmt::format("parent {} ({}, {} layers)", ref, img.digest, img.layers.size()));
        continue;
      }
      case df::Kind::kArg:
        for (const auto& [k, v] : s.pairs) {
          auto given = spec.args.find(k);
          if (given != spec.args.end()) {
            args_in_scope[k] = given->second;
          } else if (s.has_default) {
            SBX_ASSIGN_OR_RETURN(args_in_scope[k], expand(v));
          } else if (vars.count(k)) {
            args_in_scope[k] = vars[k];
          }
        }
        break;
      case df::Kind::kEnv: {
        // Every value of one ENV sees the environment from before it, as Docker's.
        std::vector<std::pair<std::string, std::string>> set;
        for (const auto& [k, v] : s.pairs) {
          SBX_ASSIGN_OR_RETURN(std::string val, expand(v));
          set.emplace_back(k, std::move(val));
        }
        for (const auto& [k, v] : set) SetEnv(img.config.env, k, v);
        break;
      }
      case df::Kind::kLabel:
        for (const auto& [k, v] : s.pairs) {
          SBX_ASSIGN_OR_RETURN(std::string kk, expand(k));
          SBX_ASSIGN_OR_RETURN(img.config.labels[kk], expand(v));
        }
        break;
      case df::Kind::kUser: {
        SBX_ASSIGN_OR_RETURN(img.config.user, expand(s.value));
        break;
      }
      case df::Kind::kCmd:
        img.config.cmd = s.args;
        cmd_set_here = true;
        break;
      case df::Kind::kEntrypoint:
        // As Docker: a new entrypoint drops a CMD the parent set, not one set here.
        img.config.entrypoint = s.args;
        if (!cmd_set_here) img.config.cmd.clear();
        break;
      case df::Kind::kWorkdir: {
        SBX_ASSIGN_OR_RETURN(std::string w, expand(s.value));
        img.config.working_dir = AbsPath(img.config.working_dir, w);
        // As Docker's, WORKDIR makes its directory (as root): a step of its own, since the
        // image may end there or be followed only by COPY.
        [[fallthrough]];
      }
      case df::Kind::kRun:
      case df::Kind::kCopy:
      case df::Kind::kAdd: {
        BuildStepRequest req;
        req.sandbox = spec.sandbox;
        req.tenant_id = spec.tenant_id;
        req.cancelled = cancelled;
        std::string step_key;
        const std::string files_tar = fmt::format("{}/copy-{}.tar", dir, n);
        UniqueFd files;
        uint64_t off = 0;                // req.files reads these: they outlive the step
        std::string buf(1 << 20, '\0');
        if (s.kind == df::Kind::kRun) {
          protocol::SessionSpec run;
          run.argv = s.args;
          run.cwd = img.config.working_dir.empty() ? "/" : img.config.working_dir;
          run.user = img.config.user;
          // A RUN that never ends must not hold the build (and its engine worker) forever.
          run.timeout_s = static_cast<uint64_t>(spec.sandbox.timeout_s.value_or(kDefaultStepTimeoutS));
          run.env = EnvMap(img.config.env);
          for (const auto& [k, v] : args_in_scope) run.env.emplace(k, v);
          if (run.env.find("PATH") == run.env.end()) {
            run.env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
          }
          // What the step could reach is part of what it is: a step that needs the network
          // must not be satisfied offline by a result made with it, nor the other way.
          json env_key = args_in_scope;
          step_key = fmt::format("{}\nRUN {}\n{}\n{}\n{}\n{}", key, json(run.argv).dump(),
                                 env_key.dump(), json(run.env).dump(),
                                 spec.sandbox.egress_profile, spec.sandbox.egress.dump());
          req.run = std::move(run);
        } else if (s.kind == df::Kind::kWorkdir) {
          req.mkdir = img.config.working_dir;
          step_key = fmt::format("{}\nWORKDIR {}", key, img.config.working_dir);
        } else {
          if (context.empty()) {
            return line_error(absl::InvalidArgumentError(
                                  "COPY and ADD need a build context: send one with "
                                  "POST /v1/templates:build (sbx template build CTX)"),
                              "invalid_build_context");
          }
          // Resolved by the build sandbox's agent through the image's own /etc/passwd and
          // /etc/group, as Docker does.
          if (!s.chown.empty()) {
            SBX_ASSIGN_OR_RETURN(req.files_owner, expand(s.chown));
          }
          image::CopySpec cs;
          for (const std::string& src : s.sources) {
            if (src.find("://") != std::string::npos) {
              return line_error(absl::InvalidArgumentError(
                                    "ADD from a URL is not supported: download it in a RUN "
                                    "step (with an egress profile) instead"),
                                "invalid_dockerfile");
            }
            SBX_ASSIGN_OR_RETURN(std::string e, expand(src));
            cs.sources.push_back(e);
          }
          SBX_ASSIGN_OR_RETURN(std::string dest, expand(s.dest));
          cs.dest = AbsPath(img.config.working_dir, dest);
          if (!dest.empty() && dest.back() == '/' && cs.dest.back() != '/') cs.dest += '/';
          cs.chmod = s.chmod;
          cs.unpack_archives = s.kind == df::Kind::kAdd;
          // A bomb in the context must not fill sbxd's disk on its way to the step.
          cs.max_bytes = budget;
          files.Reset(::open(files_tar.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
          if (!files) return ErrnoStatus(errno, "build: open " + files_tar);
          auto copied = image::WriteCopyTar(context, cs, files.get(), cancelled);
          if (!copied.ok()) {
            if (absl::IsCancelled(copied.status())) return copied.status();
            return line_error(copied.status(), absl::IsInvalidArgument(copied.status())
                                                   ? "invalid_build_context"
                                               : absl::IsResourceExhausted(copied.status())
                                                   ? "image_too_large"
                                                   : "template_failed");
          }
          step_key = fmt::format("{}\n{}\n{}\n{}", key, s.text, copied->digest, req.files_owner);
          say(fmt::format("{} entries, {} bytes from the context", copied->entries,
                          copied->bytes));
          req.files = [&, fd = files.get()]() -> absl::StatusOr<std::string_view> {
            for (;;) {
              ssize_t r = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
              if (r < 0 && errno == EINTR) continue;
              if (r < 0) return ErrnoStatus(errno, "build: read " + files_tar);
              off += static_cast<uint64_t>(r);
              return std::string_view(buf.data(), static_cast<size_t>(r));
            }
          };
        }
        key = Sha256Digest(step_key);
        const std::string cache_file = cache_dir + "/" + key.substr(7) + ".json";
        if (!spec.no_cache) {
          auto hit = ReadCacheEntry(cache_file);
          if (hit) {
            if (hit->diff_id.empty()) {
              say("cached: no changes");
              break;
            }
            if (layers_->Has(hit->diff_id)) {
              img.layers.push_back(*hit);
              budget -= std::min(budget, hit->unpacked_bytes);
              say(fmt::format("cached: layer {}", hit->diff_id.substr(0, 19)));
              break;
            }
          }
        }
        // Not cached: run it.
        const std::string layer_tar = fmt::format("{}/layer-{}.tar", dir, n);
        UniqueFd out(::open(layer_tar.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        if (!out) return ErrnoStatus(errno, "build: open " + layer_tar);
        req.layer_fd = out.get();
        req.max_entries = opts_.limits.max_entries_per_layer;
        req.tmpl = SpecOfBuild(img);
        std::string partial;
        req.output = [&](std::string_view data) {
          for (char c : data) {
            if (c == '\n' || partial.size() >= kMaxOutputLine) {
              say(partial, true);
              partial.clear();
              if (c == '\n') continue;
            }
            if (c != '\r') partial.push_back(c);
          }
        };
        auto ran = opts_.build_step(req);
        if (!partial.empty()) say(partial, true);
        if (!ran.ok()) {
          if (absl::IsCancelled(ran.status())) return ran.status();
          return line_error(ran.status(), "build_step_failed");
        }
        if (ran->failed) {
          return line_error(absl::FailedPreconditionError(*ran->failed), "build_step_failed");
        }
        out.Reset();
        image::LayerInfo info;
        if (ran->layer.entries > 0) {
          SBX_ASSIGN_OR_RETURN(info, layers_->Put(layer_tar, ran->layer.diff_id, budget, progress,
                                                  cancelled));
          img.layers.push_back(info);
          budget -= std::min(budget, info.unpacked_bytes);
          say(fmt::format("layer {}: {} entries, {} bytes", info.diff_id.substr(0, 19),
                          info.entries, info.unpacked_bytes));
        } else {
          say("no changes");
        }
        WriteCacheEntry(cache_file, info);
        ::unlink(layer_tar.c_str());
        if (files) ::unlink(files_tar.c_str());
        break;
      }
    }
    // Config steps chain the key too: what follows them depends on them.
    if (s.kind != df::Kind::kRun && s.kind != df::Kind::kCopy && s.kind != df::Kind::kAdd &&
        s.kind != df::Kind::kWorkdir) {
      key = Sha256Digest(fmt::format("{}\n{}\n{}", key, s.text,
                                     image::oci::ConfigJson(img.config).dump()));
    }
  }
  p.steps_done = total;
  Seal(img);
  say(fmt::format("built {}: {} layers", img.digest, img.layers.size()));
  return img;
}

}  // namespace sbx::service

// TemplateService (template_service.h): imports and pulls as operations, the release and tag
// records, delete and garbage collection.
#include "service/template_service.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "runtime/image_skeleton.h"
#include "service/service_internal.h"
#include "service/template_ref.h"

namespace sbx::service {

namespace fs = std::filesystem;
using internal::Finish;
using internal::NewOperation;
using json = nlohmann::json;
using store::ImageRecord;
using store::OperationRecord;
using store::TagRecord;
using store::Tx;

namespace {

constexpr size_t kLogLines = 50;  // the last lines of an operation's log kept in its progress

// Leftovers of work a restart interrupted (its operation is failed by the reconcile).
void EmptyDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) spdlog::warn("templates: cannot remove {}: {}", e.path().string(), rm.message());
  }
}

absl::Status MakeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, fmt::format("templates: mkdir({})", path));
  }
  return absl::OkStatus();
}

json LayersJson(const image::Image& img) {
  json out = json::array();
  for (const auto& l : img.layers) {
    out.push_back({{"diff_id", l.diff_id}, {"unpacked_bytes", l.unpacked_bytes},
                   {"entries", l.entries}});
  }
  return out;
}

std::vector<std::string> Strings(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

std::string StringOr(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() && !it->get<std::string>().empty()
             ? it->get<std::string>()
             : fallback;
}

}  // namespace

std::string TemplateErrorCode(const absl::Status& s) {
  // The codes a build attaches say more than the kind; other codes the file helpers attach
  // (not_found, path_outside_root) describe a path of the image, which is an invalid image.
  const std::string attached = ApiErrorCode(s);
  if (attached == "invalid_dockerfile" || attached == "build_step_failed" ||
      attached == "invalid_build_context" || attached == "template_not_found" ||
      attached == "quota_exceeded" || attached == "tenant_deleting") {
    return attached;
  }
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
      return "invalid_image";
    case absl::StatusCode::kResourceExhausted:
      return "image_too_large";
    case absl::StatusCode::kNotFound:
      return "image_not_found";
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return "registry_auth_failed";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return "registry_unavailable";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    default:
      return "template_failed";
  }
}

TemplateService::TemplateService(TemplateServiceOptions opts, store::Store& store,
                                 ops::OperationEngine& engine, TemplateRegistry templates,
                                 std::unique_ptr<image::LayerStore> layers)
    : opts_(std::move(opts)),
      store_(store),
      engine_(engine),
      templates_(std::move(templates)),
      layers_(std::move(layers)),
      skel_dir_(opts_.dir + "/skel") {}

TemplateService::~TemplateService() { Stop(); }

void TemplateService::Stop() {
  stopping_ = true;
  std::lock_guard lock(mu_);
  for (auto& [id, flag] : cancels_) *flag = true;
}

absl::StatusOr<std::unique_ptr<TemplateService>> TemplateService::Open(
    TemplateServiceOptions opts, store::Store& store, ops::OperationEngine& engine,
    TemplateRegistry templates) {
  SBX_RETURN_IF_ERROR(MakeDir(opts.dir, 0700));
  // What work in flight left (a build's step tars and parent pull included): its operation
  // fails as interrupted. The build cache stays.
  for (const char* sub : {"/uploads", "/pulls", "/builds"}) {
    SBX_RETURN_IF_ERROR(MakeDir(opts.dir + sub, 0700));
    EmptyDir(opts.dir + sub);
  }
  SBX_RETURN_IF_ERROR(MakeDir(opts.dir + "/build-cache", 0700));
  SBX_ASSIGN_OR_RETURN(std::unique_ptr<image::LayerStore> layers,
                       image::LayerStore::Open(opts.dir + "/store", opts.limits));
  SBX_RETURN_IF_ERROR(Annotate(layers->Sweep(), "templates: sweep of the layer store"));
  SBX_RETURN_IF_ERROR(runtime::EnsureImageSkeleton(opts.dir + "/skel"));
  std::unique_ptr<TemplateService> svc(new TemplateService(
      std::move(opts), store, engine, std::move(templates), std::move(layers)));
  SBX_RETURN_IF_ERROR(svc->Load());
  metrics::Registry& reg = svc->opts_.metrics ? *svc->opts_.metrics : metrics::Default();
  svc->store_metrics_ = reg.AddCallback(
      "sbx_template_store_bytes", "Unpacked bytes of the layers in the template store",
      metrics::Type::kGauge, {}, [layers = svc->layers_.get()](metrics::CallbackSamples& s) {
        s.Add(static_cast<double>(layers->UsedBytes()));
      });
  return svc;
}

absl::Status TemplateService::Load() {
  std::vector<ImageRecord> images;
  std::vector<TagRecord> tags;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(images, tx.ListImages());
    SBX_ASSIGN_OR_RETURN(tags, tx.ListTags());
    return absl::OkStatus();
  }));
  std::set<std::string> loaded;
  for (const ImageRecord& rec : images) {
    auto spec = SpecOf(rec);
    if (!spec.ok()) {
      if (opts_.cluster && absl::IsNotFound(spec.status())) {
        // Made on another node: its first create here fetches it (SyncFromCluster).
        spdlog::debug("templates: release {} of {} is not on this node yet", rec.digest, rec.name);
        continue;
      }
      // Kept in the store (inspect shows it; delete and gc remove it); creates from it fail.
      spdlog::warn("templates: release {} of {} cannot be used: {}", rec.digest, rec.name,
                   std::string(spec.status().message()));
      continue;
    }
    templates_.AddImage(*spec);
    loaded.insert(rec.digest);
  }
  for (const TagRecord& t : tags) {
    if (loaded.count(t.digest)) templates_.SetTag(t.name, t.tag, t.digest);
  }
  spdlog::info("templates: {} releases, {} tags, layer store {} MiB", loaded.size(), tags.size(),
               layers_->UsedBytes() >> 20);
  return absl::OkStatus();
}

absl::StatusOr<runtime::TemplateSpec> TemplateService::SpecOf(const ImageRecord& rec) const {
  runtime::TemplateSpec spec;
  spec.name = rec.name;
  spec.digest = rec.digest;
  spec.rootfs_dir = skel_dir_;
  if (!rec.layers.is_array()) return absl::DataLossError("its layer list is not an array");
  // The store lists layers bottom first; an overlay's lowerdir lists the top first.
  for (auto it = rec.layers.rbegin(); it != rec.layers.rend(); ++it) {
    const std::string diff_id = it->is_object() ? it->value("diff_id", "") : "";
    SBX_ASSIGN_OR_RETURN(std::string tree, layers_->TreeOf(diff_id));
    spec.lower_dirs.push_back(std::move(tree));
  }
  const json& c = rec.config;
  spec.env = Strings(c, "env");
  spec.entrypoint = Strings(c, "entrypoint");
  spec.cmd = Strings(c, "cmd");
  spec.workdir = StringOr(c, "working_dir", "/");
  spec.default_user = StringOr(c, "user", "root");
  if (auto start = c.find("start"); start != c.end() && start->is_object()) {
    spec.start_cmd = Strings(*start, "cmd");
    spec.ready_cmd = Strings(*start, "ready");
    spec.start_timeout_s = start->value("timeout_s", 60);
  }
  return spec;
}

std::string TemplateService::NamespaceOf(const Caller& caller) const {
  return TemplateNamespaceOf(caller);
}


bool TemplateService::IsTemplateOperation(const std::string& kind) const {
  return kind == "template_import" || kind == "template_pull" || kind == "template_build";
}

void TemplateService::AppendEvent(const std::string& op_id, const std::string& line) {
  std::lock_guard lock(events_mu_);
  EventLog& log = events_[op_id];
  log.lines.push_back(line);
  log.bytes += line.size();
  while (log.bytes > kEventBytes && log.lines.size() > 1) {
    log.bytes -= log.lines.front().size();
    log.lines.pop_front();
    ++log.first_id;
  }
}

void TemplateService::FinishEvents(const std::string& op_id) {
  std::lock_guard lock(events_mu_);
  events_[op_id].finished = true;
  finished_events_.push_back(op_id);
  while (finished_events_.size() > kFinishedKept) {
    events_.erase(finished_events_.front());
    finished_events_.pop_front();
  }
}

absl::StatusOr<TemplateService::EventLines> TemplateService::Events(const std::string& op_id,
                                                                    uint64_t after) const {
  std::lock_guard lock(events_mu_);
  auto it = events_.find(op_id);
  if (it == events_.end()) {
    return absl::NotFoundError("this sbxd keeps no event lines of operation " + op_id);
  }
  EventLines out;
  const EventLog& log = it->second;
  for (uint64_t id = std::max(after + 1, log.first_id); id < log.first_id + log.lines.size();
       ++id) {
    out.lines.emplace_back(id, log.lines[id - log.first_id]);
  }
  out.finished = log.finished;
  return out;
}

absl::StatusOr<Upload> TemplateService::NewUpload() {
  Upload up;
  up.path = fmt::format("{}/uploads/{}.tar", opts_.dir, NewId("up"));
  up.fd = ::open(up.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (up.fd < 0) return ErrnoStatus(errno, fmt::format("template import: open({})", up.path));
  return up;
}

void TemplateService::Discard(Upload& upload) {
  if (upload.fd >= 0) ::close(upload.fd);
  upload.fd = -1;
  if (!upload.path.empty()) ::unlink(upload.path.c_str());
  upload.path.clear();
}

absl::StatusOr<OperationStarted> TemplateService::Import(const Caller& caller,
                                                         const TemplateTarget& target,
                                                         Upload upload) {
  if (upload.fd >= 0) {
    ::close(upload.fd);
    upload.fd = -1;
  }
  const std::string path = upload.path;
  auto cleanup = [path] { ::unlink(path.c_str()); };
  auto started = Start(
      caller, "template_import", target, json{{"kind", "import"}},
      [this, path](const std::string&, const image::ProgressFn& progress,
                   const image::CancelFn& cancelled) {
        return image::ImportArchive(path, "", *layers_, progress, cancelled);
      },
      cleanup);
  if (!started.ok()) cleanup();
  return started;
}

absl::StatusOr<OperationStarted> TemplateService::Pull(const Caller& caller,
                                                       const TemplateTarget& target,
                                                       const std::string& image) {
  auto ref = registry::ParseReference(image);
  if (!ref.ok()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_image_ref",
                    std::string(ref.status().message()), "source.image");
  }
  const std::string pulls = opts_.dir + "/pulls";
  return Start(
      caller, "template_pull", target, json{{"kind", "pull"}, {"image", ref->String()}},
      [this, ref = *ref, pulls](const std::string& op_id, const image::ProgressFn& progress,
                                const image::CancelFn& cancelled) -> absl::StatusOr<image::Image> {
        // The layout is only a way into the store: removed whatever happens (a restart
        // empties pulls/ too, and its operation fails as interrupted).
        const std::string layout = pulls + "/" + op_id;
        auto imported = [&]() -> absl::StatusOr<image::Image> {
          SBX_ASSIGN_OR_RETURN(std::string digest,
                               registry::PullToLayout(ref, opts_.registry, layout, progress,
                                                      cancelled));
          return image::ImportLayout(layout, digest, *layers_, progress, cancelled);
        }();
        std::error_code ec;
        fs::remove_all(layout, ec);
        if (ec) spdlog::warn("template pull: cannot remove {}: {}", layout, ec.message());
        return imported;
      },
      [] {});
}

absl::StatusOr<OperationStarted> TemplateService::Start(
    const Caller& caller, const std::string& kind, const TemplateTarget& target, json source,
    std::function<absl::StatusOr<image::Image>(const std::string&, const image::ProgressFn&,
                                               const image::CancelFn&)>
        work,
    std::function<void()> cleanup) {
  SBX_RETURN_IF_ERROR(CheckTemplateName(target.name));
  SBX_RETURN_IF_ERROR(CheckTemplateTag(target.tag));
  if (target.name == "base") {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_template_ref",
                    "`base` is the built-in template: choose another name", "name");
  }
  if (stopping_) return absl::UnavailableError("sbxd is stopping");
  // The work and the store see the qualified name; the operation shows the caller's.
  TemplateTarget stored = target;
  stored.name = QualifiedTemplateName(NamespaceOf(caller), target.name);
  OperationRecord op = NewOperation(caller.tenant_id, kind, "", NowRfc3339());
  op.initiator = caller.initiator;
  op.node = opts_.node_name;
  op.target = target.name + ":" + target.tag;
  op.progress = {{"stage", "queued"}, {"log", json::array()}};
  {
    // Registered before the operation is visible: gc must see every import that may put layers.
    std::lock_guard lock(mu_);
    if (gc_running_) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "template_gc_in_progress",
                      "template garbage collection is running: start this when it has finished");
    }
    cancels_[op.id] = std::make_shared<std::atomic<bool>>(false);
  }
  absl::Status put = store_.Transact([&](Tx& tx) -> absl::Status {
    // A new name is refused now (its bytes are known, and checked, when it commits).
    SBX_ASSIGN_OR_RETURN(std::vector<TagRecord> tags, tx.ListTags());
    auto no_size = [](const std::string&) -> int64_t { return 0; };
    const std::string ns = NamespaceOf(caller);
    const TemplateUsage before = UsageOfNamespace(ns, tags, std::nullopt, no_size);
    const TemplateUsage after = UsageOfNamespace(
        ns, tags, TagRecord{stored.name, stored.tag, "", ""}, no_size);
    SBX_RETURN_IF_ERROR(CheckTemplateQuota(tx, caller.tenant_id, {before.names, 0},
                                           {after.names, 0}));
    return tx.PutOperation(op);
  });
  if (!put.ok()) {
    std::lock_guard lock(mu_);
    cancels_.erase(op.id);
    return put;
  }
  const std::string op_id = op.id;
  {
    std::lock_guard lock(events_mu_);
    events_[op_id];  // known from now on: a watcher waits for its first line
  }
  engine_.Submit(
      "tpl:" + stored.name + ":" + stored.tag,
      [this, op_id, target = stored, source = std::move(source), work = std::move(work),
       cleanup = std::move(cleanup)] {
        try {
          Run(op_id, target, source, work);
        } catch (const std::exception& e) {
          FailOperation(op_id, absl::InternalError(
                                   fmt::format("sbxd failed internally: {}", e.what())));
        } catch (...) {
          FailOperation(op_id, absl::InternalError("sbxd failed internally"));
        }
        cleanup();
        FinishEvents(op_id);
        std::lock_guard lock(mu_);
        cancels_.erase(op_id);
      },
      internal::OperationLog(op_id, "", caller.tenant_id));
  return OperationStarted{std::move(op)};
}

void TemplateService::Run(
    const std::string& op_id, const TemplateTarget& target, const json& source,
    const std::function<absl::StatusOr<image::Image>(
        const std::string&, const image::ProgressFn&, const image::CancelFn&)>& work) {
  std::shared_ptr<std::atomic<bool>> flag;
  {
    std::lock_guard lock(mu_);
    auto it = cancels_.find(op_id);
    if (it != cancels_.end()) flag = it->second;
  }
  if (!flag) flag = std::make_shared<std::atomic<bool>>(false);
  image::CancelFn cancelled = [this, flag] { return flag->load() || stopping_.load(); };
  if (cancelled()) {
    FailOperation(op_id, absl::CancelledError("cancelled before it started"));
    return;
  }
  bool proceed = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    proceed = op.state == "pending";
    if (!proceed) return absl::OkStatus();
    op.state = "running";
    op.updated_at = NowRfc3339();
    return tx.PutOperation(op);
  });
  if (!st.ok() || !proceed) return;
  internal::LogOperationStarted(source.value("kind", "template"));
  const auto started = internal::Clock::now();

  // Snapshots are throttled; a log line or a new stage is always written, so a failure's
  // last words are in the operation.
  json log = json::array();
  std::string last_stage;
  auto last_write = internal::Clock::now() - opts_.progress_interval;
  image::ProgressFn progress = [&](const image::Progress& p) {
    if (!p.message.empty()) AppendEvent(op_id, p.message);
    if (!p.message.empty()) {
      log.push_back(p.message);
      if (log.size() > kLogLines) log.erase(log.begin());
    }
    const auto now = internal::Clock::now();
    if ((p.message.empty() || p.quiet) && p.stage == last_stage &&
        now - last_write < opts_.progress_interval) {
      return;
    }
    last_stage = p.stage;
    last_write = now;
    json snap = {{"stage", p.stage},           {"layers_done", p.layers_done},
                 {"layers_total", p.layers_total}, {"bytes_done", p.bytes_done},
                 {"bytes_total", p.bytes_total},   {"log", log}};
    if (p.steps_total > 0) {
      snap["steps_done"] = p.steps_done;
      snap["steps_total"] = p.steps_total;
    }
    absl::Status w = store_.Transact([&](Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
      op.progress = snap;
      op.updated_at = NowRfc3339();
      return tx.PutOperation(op);
    });
    if (!w.ok()) spdlog::warn("template operation {}: progress: {}", op_id, std::string(w.message()));
  };
  absl::StatusOr<image::Image> img = work(op_id, progress, cancelled);
  if (img.ok() && cancelled()) img = absl::CancelledError("cancelled");
  absl::Status done = img.ok() ? Commit(op_id, target, source, *img) : img.status();
  if (!done.ok()) {
    FailOperation(op_id, done);
    internal::LogOperationFinished(source.value("kind", "template"),
                                   done.code() == absl::StatusCode::kCancelled ? "cancelled"
                                                                               : "failed",
                                   started, -1, std::string(done.message()));
    return;
  }
  internal::LogOperationFinished(source.value("kind", "template"), "succeeded", started);
}

absl::Status TemplateService::Commit(const std::string& op_id, const TemplateTarget& target,
                                     const json& source, const image::Image& img) {
  ImageRecord rec;
  rec.digest = img.digest;
  rec.name = target.name;
  rec.layers = LayersJson(img);
  rec.config = img.config_json;  // oci::ConfigJson of the image's config
  if (target.start.is_object()) {
    json start = target.start;
    if (start.value("cmd", json()).is_boolean()) {
      // `true`: what the image says it runs.
      std::vector<std::string> argv = img.config.entrypoint;
      argv.insert(argv.end(), img.config.cmd.begin(), img.config.cmd.end());
      if (argv.empty()) {
        return ApiError(absl::StatusCode::kInvalidArgument, "invalid_image",
                        "start.cmd is true but the image has neither Entrypoint nor Cmd");
      }
      start["cmd"] = argv;
    }
    rec.config["start"] = start;
  }
  rec.source = source;
  for (const auto& l : img.layers) rec.size += static_cast<int64_t>(l.unpacked_bytes);
  // Checked before anything is recorded: a release whose layers cannot be used is not kept.
  SBX_RETURN_IF_ERROR(SpecOf(rec).status());
  const std::string now = NowRfc3339();
  const SplitName shown = SplitTemplateName(target.name);
  // Each attempt starts from the record as built: an earlier one may have taken the name and
  // created_at of a release that is gone by the next.
  const ImageRecord built = rec;
  absl::Status committed = store_.Transact([&](Tx& tx) -> absl::Status {
    rec = built;
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    {
      // In the transaction that records the tag: concurrent imports cannot pass it together.
      SBX_ASSIGN_OR_RETURN(std::vector<TagRecord> tags, tx.ListTags());
      SBX_ASSIGN_OR_RETURN(std::vector<ImageRecord> images, tx.ListImages());
      std::map<std::string, int64_t> sizes;
      for (const ImageRecord& i : images) sizes[i.digest] = i.size;
      sizes[rec.digest] = rec.size;
      auto size_of = [&](const std::string& d) { return sizes.count(d) ? sizes[d] : 0; };
      const TemplateUsage before = UsageOfNamespace(shown.ns, tags, std::nullopt, size_of);
      const TemplateUsage after = UsageOfNamespace(
          shown.ns, tags, TagRecord{target.name, target.tag, rec.digest, now}, size_of);
      SBX_RETURN_IF_ERROR(CheckTemplateQuota(tx, op.tenant_id, before, after));
    }
    auto existing = tx.GetImage(rec.digest);
    if (existing.ok()) {
      rec.created_at = existing->created_at;  // the same release again: first made then
      rec.name = existing->name;
    } else if (!absl::IsNotFound(existing.status())) {
      return existing.status();
    } else {
      rec.created_at = now;
    }
    SBX_RETURN_IF_ERROR(tx.PutImage(rec));
    SBX_RETURN_IF_ERROR(tx.PutTag(TagRecord{target.name, target.tag, rec.digest, now}));
    Finish(op, true, nullptr, now);
    op.result = {{"template", {{"name", shown.name}, {"tag", target.tag},
                               {"digest", rec.digest}, {"size", rec.size}}}};
    json progress = op.progress.is_object() ? op.progress : json::object();
    progress["stage"] = "done";
    op.progress = progress;
    return tx.PutOperation(op);
  });
  SBX_RETURN_IF_ERROR(committed);
  // As stored (the same release made again keeps the name it was first made under, maybe by
  // another tenant); before its tag, so that the tag resolves the moment it is set.
  SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec spec, SpecOf(rec));
  templates_.AddImage(spec);
  templates_.SetTag(target.name, target.tag, rec.digest);
  if (opts_.template_changed) opts_.template_changed();  // a pool of this tag drains
  spdlog::info("template {}:{} is {} ({} layers, {} MiB)", target.name, target.tag, rec.digest,
               img.layers.size(), rec.size >> 20);
  return absl::OkStatus();
}

void TemplateService::FailOperation(const std::string& op_id, const absl::Status& why) {
  const std::string code = TemplateErrorCode(why);
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    if (op.state == "succeeded" || op.state == "failed") return absl::OkStatus();
    Finish(op, false, {{"code", code}, {"message", std::string(why.message())}}, NowRfc3339());
    return tx.PutOperation(op);
  });
  if (!st.ok()) {
    spdlog::error("template operation {}: store, failing it: {}", op_id, std::string(st.message()));
  }
}

absl::StatusOr<OperationRecord> TemplateService::Cancel(const Caller& caller,
                                                        const std::string& op_id) {
  OperationRecord op;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(op, internal::VisibleRow(tx.GetOperation(op_id),
                                                  [&](const OperationRecord& r) {
                                                    return r.tenant_id == caller.tenant_id;
                                                  },
                                                  "operation", op_id));
    return absl::OkStatus();
  }));
  if (!IsTemplateOperation(op.kind)) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "not_cancellable",
                    fmt::format("operation {} is a {}: only template operations are cancelled "
                                "by DELETE (a sandbox's are ended by deleting the sandbox)",
                                op_id, op.kind));
  }
  std::lock_guard lock(mu_);
  if (auto it = cancels_.find(op_id); it != cancels_.end()) *it->second = true;
  return op;
}

uint64_t TemplateService::StoreBytes() const { return layers_->UsedBytes(); }

}  // namespace sbx::service

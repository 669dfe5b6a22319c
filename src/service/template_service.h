// TemplateService: templates users bring (docs/templates.md). Imports of image archives and
// pulls from registries run as operations (kind template_import, template_pull) on the
// OperationEngine, keyed "tpl:<name>:<tag>" so that work on one tag runs in order; their
// progress is written into the operation as it moves. A finished import or pull records the
// release (store ImageRecord, by manifest digest) and moves the tag (TagRecord) in one
// transaction, then tells the TemplateRegistry, which creates resolve against. Layers live in
// the image::LayerStore, shared by every release that lists them.
//
// Templates belong to a namespace (template_ref.h): the operator tenant's are the shared
// catalogue every tenant sees; any other tenant's are its own, seen and changed by it alone,
// within its quotas max_templates and max_template_bytes (docs/tenancy.md, "Templates").
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "image/image.h"
#include "ops/operation_engine.h"
#include "registry/registry.h"
#include "service/build_step.h"
#include "service/inputs.h"
#include "service/results.h"
#include "service/templates.h"
#include "service/tenancy.h"
#include "store/store.h"

namespace sbx::service {

struct TemplateServiceOptions {
  // This process's node (ServiceOptions::node_name): stamped on the operations it runs.
  std::string node_name;
  // <state>/templates: layers/ (the LayerStore), skel/ (the topmost lower of image templates),
  // uploads/ (archives being received), pulls/<op>/ (OCI layouts being fetched).
  std::string dir;
  image::Limits limits;
  registry::ClientOptions registry;
  // The least time between two progress writes of one operation (a log line is always written).
  std::chrono::milliseconds progress_interval{250};
  // Runs a build's RUN, COPY and ADD steps (SandboxService::RunBuildStep); unset: builds are
  // refused (501 not_implemented).
  BuildStepRunner build_step;
  // The warm pools (SandboxService): the releases their ready sandboxes are built from, which
  // delete and gc keep, and the call that drains them after a tag moved or went. Unset: none.
  std::function<std::map<std::string, int>()> pooled_digests;
  std::function<void()> template_changed;
  // Where sbx_template_store_bytes and sbx_template_layers go; nullptr: metrics::Default().
  metrics::Registry* metrics = nullptr;
  // A cluster node (`--role node`, docs/scale.md "Templates"): creates follow the store's
  // catalogue (SyncFromCluster) and fetch the layers this node lacks from the nodes that hold
  // them, with `peer_token` (the admin token every node shares). Set limits.keep_blobs with it.
  bool cluster = false;
  std::string peer_token;
  // Where a node at `node_url` gives the blob of layer `diff_id`, and collects its own layer
  // store (the API's routes).
  std::function<std::string(const std::string& node_url, const std::string& diff_id)> layer_url;
  std::function<std::string(const std::string& node_url)> gc_url;
};

// Where POST /v1/templates:import puts the body while it arrives.
struct Upload {
  std::string path;
  int fd = -1;  // O_WRONLY, owned by the caller until passed to Import or Discard
};

// A template build (docs/templates.md, "Builds"): a Dockerfile subset run step by step.
struct BuildSpec {
  std::string dockerfile;                     // its text; "" reads dockerfile_path
  std::string dockerfile_path = "Dockerfile";  // in the context
  std::map<std::string, std::string> args;    // ARG values (--build-arg)
  CreateSandboxRequest sandbox;  // resources and egress_profile of the RUN steps' sandboxes
  bool no_cache = false;         // run every step, cached or not (the results are cached)
  // Set by Build: the caller's tenant (its egress profiles apply to the RUN steps) and template
  // namespace.
  std::string tenant_id;
  // The caller's template namespace. FROM resolves in it, and its steps' cache
  // entries are its own (another tenant's RUN never stands in for this one's).
  std::string ns;
};

// What an import or pull makes: a release of `name`, tagged `tag`.
struct TemplateTarget {
  std::string name;
  std::string tag = "latest";
  // The release's start command (docs/templates.md, "Start command"), as the API checked it:
  // {"cmd": [argv] | true (the image's Entrypoint + Cmd), "ready": [argv], "timeout_s": N};
  // null: none.
  nlohmann::json start = nullptr;
};

class TemplateService {
 public:
  // Opens the layer store (sweeping what a crash left), builds the skeleton and loads every
  // release and tag from the store into `templates` (a copy sharing the registry's images).
  static absl::StatusOr<std::unique_ptr<TemplateService>> Open(TemplateServiceOptions opts,
                                                               store::Store& store,
                                                               ops::OperationEngine& engine,
                                                               TemplateRegistry templates);
  ~TemplateService();  // Stop()s; the engine must be shut down before
  // Cancels running and queued work (sbxd stopping): each fails as cancelled within one read.
  void Stop();

  absl::StatusOr<Upload> NewUpload();
  void Discard(Upload& upload);
  // Starts the import of the archive in `upload` (closed and taken over: removed when done).
  absl::StatusOr<OperationStarted> Import(const Caller& caller, const TemplateTarget& target,
                                          Upload upload);
  // Starts the pull of `image` (a registry reference).
  absl::StatusOr<OperationStarted> Pull(const Caller& caller, const TemplateTarget& target,
                                        const std::string& image);
  // Starts a build; `context` (the uploaded context tar, taken over) may be absent when the
  // Dockerfile is given and copies nothing. A Dockerfile given as text is parsed here: its
  // errors are 400 invalid_dockerfile naming the line; one read from the context fails the
  // operation with that code.
  absl::StatusOr<OperationStarted> Build(const Caller& caller, const TemplateTarget& target,
                                         BuildSpec spec, std::optional<Upload> context);
  // DELETE /v1/operations/{id} of a template operation: stops it within one read; the
  // operation then fails with code "cancelled". NotFound for other operations.
  absl::StatusOr<store::OperationRecord> Cancel(const Caller& caller, const std::string& op_id);
  bool IsTemplateOperation(const std::string& kind) const;

  // GET /v1/operations/{id}/events: the log lines of a template operation after event id
  // `after` (ids count from 1 and name each line for Last-Event-ID). This sbxd keeps every
  // line of the operations it runs in memory (the last kEventBytes of each, for the last
  // kFinishedKept finished ones: a chatty RUN cannot grow sbxd); NotFound for others (before a restart: the stored
  // progress.log has the last lines).
  struct EventLines {
    std::vector<std::pair<uint64_t, std::string>> lines;
    bool finished = false;
  };
  absl::StatusOr<EventLines> Events(const std::string& op_id, uint64_t after) const;
  static constexpr size_t kEventBytes = 1 << 20;
  static constexpr size_t kFinishedKept = 16;

  // {"templates": [...]} (TemplateView each), by name.
  absl::StatusOr<nlohmann::json> List(const Caller& caller);
  absl::StatusOr<nlohmann::json> Get(const Caller& caller, const std::string& name);
  // "name" removes every tag of the name, "name:tag" one tag. A release no tag names any more is
  // removed with it unless a live sandbox uses it: then nothing changes and the answer is 409
  // template_in_use. Its layers stay until Gc.
  absl::StatusOr<nlohmann::json> Delete(const Caller& caller, const std::string& ref);
  // PUT /v1/templates/{name}:{tag} {"from": REF}: the tag names the release REF names now
  // (`name:tag` or `name@sha256:…`); a tag that named another release moves (sandboxes keep
  // theirs). {"name", "tag", "digest", "previous"}.
  absl::StatusOr<nlohmann::json> Tag(const Caller& caller, const std::string& target,
                                     const std::string& from);
  // Removes releases no tag names and no live sandbox uses, then layers no release lists.
  // {"releases_removed", "layers_removed", "bytes_freed"}. On a cluster node it then asks every
  // other live node to collect its own layer store (`this_node_only`: what they run), and the
  // answer sums theirs in and lists each under "nodes".
  absl::StatusOr<nlohmann::json> Gc(const Caller& caller, bool this_node_only = false);
  // A deleted tenant's templates: its tags go, and its releases with them unless a live
  // sandbox still runs one (gc takes those later). The number of tags removed.
  absl::StatusOr<int> DeleteNamespace(const std::string& tenant_id);
  // The namespace `caller`'s template names live in ("" for the operator tenant).
  std::string NamespaceOf(const Caller& caller) const;
  // Bytes of the layer store (metrics, GET /v1/templates).
  uint64_t StoreBytes() const;

  // A cluster node, before a create from `ref` (template_peers.cc): the registry in memory
  // learns what the store says `ref` names now (a tag moved or removed on another node, a
  // release made there), and the layers of that release missing here are fetched from a node
  // that reports it. 503 template_unavailable when no node gives them. A no-op on one host.
  absl::Status SyncFromCluster(const std::string& ref, const std::string& ns);
  // A cluster node, from its heartbeat: every tag in memory is made what the store says (one
  // read of the tags), so that a tag removed or moved on another node stops being reported
  // here (placement's template locality) without waiting for a create of it. A tag that now
  // names a release this node does not hold is dropped: the next create of it fetches that
  // release. A no-op on one host. Returns how many tags changed here.
  absl::StatusOr<int> SyncTagsFromStore();
  // GET /v1/admin/layers/{diff_id}: the path of the layer's kept blob (LayerStore::BlobOf).
  absl::StatusOr<std::string> LayerBlob(const std::string& diff_id) const;
  uint64_t max_archive_bytes() const { return opts_.limits.max_archive_bytes; }

 private:
  TemplateService(TemplateServiceOptions opts, store::Store& store, ops::OperationEngine& engine,
                  TemplateRegistry templates, std::unique_ptr<image::LayerStore> layers);
  absl::Status Load();
  // Removes tags (in one transaction) and the releases only they named, unless in use; the
  // tags and releases removed. `refuse_in_use`: a release still in use fails it (409) instead.
  struct Removed {
    std::vector<store::TagRecord> tags;
    std::vector<std::string> releases;
  };
  absl::StatusOr<Removed> RemoveTags(const std::function<bool(const store::TagRecord&)>& goes,
                                     const std::string& what, bool refuse_in_use);
  absl::StatusOr<OperationStarted> Start(const Caller& caller, const std::string& kind,
                                         const TemplateTarget& target, nlohmann::json source,
                                         std::function<absl::StatusOr<image::Image>(
                                             const std::string& op_id,
                                             const image::ProgressFn&, const image::CancelFn&)>
                                             work,
                                         std::function<void()> cleanup);
  void Run(const std::string& op_id, const TemplateTarget& target, const nlohmann::json& source,
           const std::function<absl::StatusOr<image::Image>(
               const std::string&, const image::ProgressFn&, const image::CancelFn&)>& work);
  absl::StatusOr<image::Image> RunBuild(const std::string& op_id, const BuildSpec& spec,
                                        const std::string& context,
                                        const image::ProgressFn& progress,
                                        const image::CancelFn& cancelled);
  absl::StatusOr<image::Image> RunBuildSteps(const std::string& op_id, const BuildSpec& spec,
                                             const std::string& context,
                                             const image::ProgressFn& progress,
                                             const image::CancelFn& cancelled);
  absl::StatusOr<image::Image> BuildParent(const std::string& op_id, const std::string& ref,
                                           const std::string& ns, const std::string& dir,
                                           const image::ProgressFn& progress,
                                           const image::CancelFn& cancelled);
  // A release in the store, as a build's parent; FailedPrecondition when a layer is gone.
  absl::StatusOr<image::Image> StoredImage(const std::string& digest, const std::string& ref);
  // A registry parent an earlier build imported (build-cache/parent-<hex>.json), while all
  // its layers are in the store.
  absl::StatusOr<image::Image> CachedParent(const std::string& digest);
  std::string ParentCachePath(const std::string& digest) const;
  runtime::TemplateSpec SpecOfBuild(const image::Image& img) const;
  absl::Status Commit(const std::string& op_id, const TemplateTarget& target,
                      const nlohmann::json& source, const image::Image& img);
  void FailOperation(const std::string& op_id, const absl::Status& why);
  absl::StatusOr<runtime::TemplateSpec> SpecOf(const store::ImageRecord& rec) const;
  absl::Status FetchLayers(const store::ImageRecord& rec, std::vector<store::NodeRecord> nodes);
  void GcOtherNodes(nlohmann::json& out);
  // `name` qualified; shown unqualified, with "shared" telling whose it is.
  nlohmann::json TemplateView(const std::string& name,
                              const std::vector<store::TagRecord>& tags,
                              const std::map<std::string, store::ImageRecord>& images) const;

  TemplateServiceOptions opts_;
  store::Store& store_;
  ops::OperationEngine& engine_;
  TemplateRegistry templates_;
  std::unique_ptr<image::LayerStore> layers_;
  std::string skel_dir_;

  // Event lines by operation (Events), with their own lock: a chatty build appends per line.
  struct EventLog {
    std::deque<std::string> lines;
    size_t bytes = 0;       // of `lines`
    uint64_t first_id = 1;  // the id of lines.front()
    bool finished = false;
  };
  void AppendEvent(const std::string& op_id, const std::string& line);
  void FinishEvents(const std::string& op_id);
  mutable std::mutex events_mu_;
  std::map<std::string, EventLog> events_;
  std::deque<std::string> finished_events_;  // oldest first

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> cancels_;  // running ops
  metrics::CallbackHandle store_metrics_;  // reads layers_: declared after it
  bool gc_running_ = false;  // under mu_: no import starts while gc removes layers
  std::atomic<bool> stopping_{false};
  std::mutex fetch_mu_;  // one SyncFromCluster fetch at a time
};

// The API code of a failed template operation for each kind of failure the image and registry
// code reports (invalid_image, image_too_large, image_not_found, registry_auth_failed,
// registry_unavailable, cancelled, template_failed).
std::string TemplateErrorCode(const absl::Status& s);

}  // namespace sbx::service

// Backend: one isolation technology (namespaces, microVM, fake) behind one interface. The
// service layer picks a backend per sandbox (`runtime` field, deployment default) and never
// knows which kernel objects it uses.
//
// Every backend starts sbx-agent as the sandbox's first process and hands back the path of a
// unix socket on which that agent speaks the framed protocol of src/protocol/. Exec, output
// and exit reporting are therefore the same for every backend.
//
// Thread safety: a Backend is safe for concurrent use from several worker threads.
// Instances are owned by the service layer and used from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "runtime/resources.h"

namespace sbx::runtime {

using Json = nlohmann::json;

struct BindMount {
  std::string host_path;     // absolute path on the host
  std::string sandbox_path;  // absolute path inside the sandbox
  bool read_only = true;
};

// A template resolved to what a backend needs to build a root filesystem.
struct TemplateSpec {
  std::string name;    // "base"
  std::string digest;  // "sha256:..."
  // Read-only lower layer of the overlay root (a directory on the host). For `base` it is a
  // skeleton with the merged-/usr symlinks and empty mount points.
  std::string rootfs_dir;
  // Read-only views mounted on top of the overlay, e.g. host /usr -> /usr for `base`.
  std::vector<BindMount> binds;
  std::string workdir = "/";
  std::string default_user = "root";
  // An image template (docs/templates.md): its layers' trees in the layer store, top first,
  // stacked as read-only lowers under rootfs_dir (which stays the topmost lower: the mount
  // points the runtime needs). Empty for `base`, whose files are the binds.
  std::vector<std::string> lower_dirs;
  // The image config: Env ("K=V") under the sandbox's and each session's env; the start
  // command (Entrypoint + Cmd) recorded for the template's process.
  std::vector<std::string> env;
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  // The template's process (docs/templates.md, "Start command"): started in every new sandbox
  // of the template before it is running, which waits until `ready_cmd` (run repeatedly)
  // exits 0, for at most start_timeout_s. Empty: none.
  std::vector<std::string> start_cmd;
  std::vector<std::string> ready_cmd;
  int start_timeout_s = 60;
};

struct SandboxSpec {
  std::string id;  // "sbx_...": names every kernel object the backend creates
  TemplateSpec tmpl;
  Resources resources;
  std::map<std::string, std::string> env;  // default environment of every process
  std::string hostname;                    // defaults to a prefix of the id
  // net::ResolvedEgress::ToJson() of a networked sandbox (profile, narrowing), as stored at
  // create; null: `none`, loopback only.
  Json egress = nullptr;
  // A warm-pool member for networked creates (egress null): launched into a namespace whose
  // network is built but claimed by no sandbox (veth, addresses, routes, its resolv.conf; no
  // egress rules, so nothing it sends passes) until Instance::AttachEgress gives it a profile.
  // Only runtimes with Capabilities::network_ready accept it.
  bool network_ready = false;
  // A template build's RUN step (docs/templates.md): the instance keeps a handle on its
  // writable layer for ExportWritableLayer. Never adopted after a restart (the build fails).
  bool keep_writable_layer = false;
};

// What ExportWritableLayer wrote.
struct ExportedLayer {
  std::string diff_id;  // "sha256:<hex>" of the tar
  uint64_t tar_bytes = 0;
  uint64_t entries = 0;
};

struct Capabilities {
  bool pause = false;  // Instance::Freeze/Thaw work (pause, suspend and wake)
  // Instance::Suspend can write a sandbox's memory to disk and give it back to the host (for
  // some sandboxes: SuspendOutcome says, per suspend).
  bool suspend_releases_memory = false;
  bool snapshots = false;
  bool egress_policy = false;
  // Create takes SandboxSpec::network_ready and its instances implement AttachEgress.
  bool network_ready = false;
  // Create takes SandboxSpec::keep_writable_layer and its instances implement
  // ExportWritableLayer: a template build's RUN steps can run on it.
  bool template_builds = false;
};

// What a suspend did with the sandbox's memory: the suspend operation's `result`.
struct SuspendOutcome {
  bool memory_preserved = true;  // on wake, processes continue where they stood
  bool memory_released = false;  // the host has the memory back while suspended
  std::string how;               // one sentence: where the memory is, and why
  int64_t snapshot_bytes = 0;    // the saved state on the host's disk, when released
};

class Instance {
 public:
  virtual ~Instance() = default;
  virtual const std::string& id() const = 0;
  // Unix socket on which the sandbox's agent accepts protocol connections.
  virtual std::string AgentSocketPath() const = 0;
  // What the store keeps so that Adopt() can find this sandbox again after sbxd restarts.
  virtual Json Persist() const = 0;
  // False once the sandbox's agent is known to have exited (a cheap check, no I/O to the agent).
  virtual bool Alive() const { return true; }
  // After Alive() turned false: how the agent ended, as far as the runtime can tell (e.g.
  // "killed by SIGKILL; the OOM killer took it: the agent's memory limit was reached").
  virtual std::string DeathReason() const { return "it exited"; }
  // Kills every process of the sandbox and removes every kernel object and file it owns.
  // Idempotent: safe on a half-built or already destroyed sandbox, frozen ones included.
  virtual absl::Status Destroy() = 0;

  // Pause support (Capabilities::pause). Freeze stops every process of the sandbox where it
  // stands and returns once the kernel reports all of them stopped; memory stays resident and
  // open connections (the agent's socket included) stay open but unanswered. On failure the
  // sandbox is left running. Thaw lets them continue. Both are idempotent.
  virtual absl::Status Freeze() {
    return absl::UnimplementedError("freeze: this runtime cannot pause sandboxes");
  }
  virtual absl::Status Thaw() {
    return absl::UnimplementedError("thaw: this runtime cannot pause sandboxes");
  }
  // What the kernel says now: true once a freeze was requested (done or in progress) and not
  // undone. The service trusts this over its store after a restart.
  virtual absl::StatusOr<bool> IsFrozen() const { return false; }
  // Suspend: where a runtime can, the sandbox's whole state goes to disk and its memory back
  // to the host; otherwise a freeze, memory resident. Resume undoes either (and a Freeze).
  // On failure the sandbox is left as IsFrozen() says.
  virtual absl::StatusOr<SuspendOutcome> Suspend() {
    absl::Status st = Freeze();
    if (!st.ok()) return st;
    return SuspendOutcome{.how = "frozen in place: the sandbox's memory stays resident (this runtime "
                                 "cannot save a sandbox's processes to disk)"};
  }
  virtual absl::Status Resume() { return Thaw(); }

  // What the sandbox tried to reach and its egress profile refused, by reason, since the
  // sandbox's network was made (sbx_egress_denied_total{sandbox,reason}): the kernel's packet
  // counters and the refusals of sbxd's resolver and proxy, under the reason names that
  // GET /v1/sandboxes/{id}/egress shows (`no_route` for a `none` sandbox). Each count only
  // grows while the sandbox lives. A cheap read, no I/O to the agent; works on frozen
  // sandboxes. Unimplemented where the runtime cannot tell.
  virtual absl::StatusOr<std::map<std::string, uint64_t>> DeniedEgress() const {
    return absl::UnimplementedError("denied egress: this runtime does not count it");
  }

  // Of an instance created network_ready: gives its network to this sandbox (its id) with
  // `egress` (net::ResolvedEgress::ToJson(), as SandboxSpec::egress), as a networked Create
  // would have: its rules in place before anything passes, Persist() recording them so a
  // restart adopts the network. Once; on an error the instance may hold part of it and must be
  // destroyed, never handed out or pooled again.
  virtual absl::Status AttachEgress(const Json& egress) {
    (void)egress;
    return absl::UnimplementedError("attach egress: this runtime has no network-ready sandboxes");
  }

  // Port exposure (api/port_routes.cc): a non-blocking TCP socket made in the sandbox's network
  // namespace (a socket keeps the namespace it was made in) with a connect to its loopback,
  // 127.0.0.1:`port` or [::1]:`port`, started. The connect may still be in progress: the caller
  // waits for it (writable, then SO_ERROR) under its own deadline. Ingress through sbxd: no
  // egress rule applies, whatever the sandbox's profile (`none` included).
  virtual absl::StatusOr<UniqueFd> DialPort(uint16_t port, bool ipv6) const {
    (void)port;
    (void)ipv6;
    return absl::UnimplementedError("dial port: this runtime cannot reach sandbox ports");
  }

  // Of an instance created keep_writable_layer: freezes its processes, writes what they changed
  // over the template (the overlay's upper) to `out_fd` as an OCI layer tar, thaws them; more
  // than `max_entries` entries is ResourceExhausted. The caller destroys the instance next.
  virtual absl::StatusOr<ExportedLayer> ExportWritableLayer(
      int out_fd, const std::function<bool()>& cancelled, uint64_t max_entries) {
    (void)out_fd;
    (void)cancelled;
    (void)max_entries;
    return absl::UnimplementedError("export writable layer: this runtime cannot build templates");
  }
};
using InstancePtr = std::unique_ptr<Instance>;

// What the host lets this backend's sandboxes have, beyond what the host itself has
// (admission control, service/admission.h). Zero: no such limit.
struct HostShare {
  // CPU quota of the cgroup every sandbox lives under, in thousandths of a CPU.
  int64_t cpu_quota_millis = 0;
  // Memory limit of that cgroup.
  int64_t memory_limit_mib = 0;
  // What the disks of this backend's sandboxes already take in the state dir's file system:
  // sparse images allocate as they fill, so the free space does not show it.
  int64_t disk_allocated_mib = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;
  virtual Capabilities GetCapabilities() const = 0;
  // Checks that this host can run the backend; the message says what is missing.
  virtual absl::Status Probe() = 0;
  // Whether a sandbox of these effective resources, networked or not, can be made at all: asked
  // before a create records anything, so a request this runtime can never serve is refused at
  // once. InvalidArgument names the resources field; Unimplemented says what is missing.
  virtual absl::Status CheckCreate(const Resources& effective, bool networked) const {
    (void)effective;
    (void)networked;
    return absl::OkStatus();
  }
  // What GET /v1/runtimes shows beside the capabilities (e.g. how guests are run).
  virtual Json Describe() const { return Json::object(); }
  // Builds and starts the sandbox; returns once its agent has answered the protocol hello.
  // On failure nothing is left behind and the status names the step that failed.
  virtual absl::StatusOr<InstancePtr> Create(const SandboxSpec& spec) = 0;
  // Re-attaches to a sandbox started by an earlier sbxd process. NotFound if it is gone.
  virtual absl::StatusOr<InstancePtr> Adopt(const std::string& id, const Json& persisted) = 0;
  // Removes every kernel object and state file still named after sandbox `id` when no live
  // instance can be adopted (a crashed agent, a half-built sandbox). Idempotent.
  virtual absl::Status Remove(const std::string& id) {
    return absl::UnimplementedError(Name() + ": Remove(" + id + ") is not implemented");
  }
  // Removes every kernel object and state file named after a sandbox not in `known_ids`.
  virtual absl::Status Sweep(const std::set<std::string>& known_ids) = 0;
  // The deployment defaults changed (SIGHUP): what a backend prepares ahead for sandboxes of
  // the default size follows them.
  virtual void OnDefaultsChanged(const Resources& /*defaults*/) {}
  // Read at every admission: cheap (a few small files and one stat per sandbox disk).
  virtual HostShare Share() const { return {}; }
};
using BackendPtr = std::unique_ptr<Backend>;

}  // namespace sbx::runtime

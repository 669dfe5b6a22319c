#include "daemon/config.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/status_util.h"
#include "runtime/ns/cgroup.h"

namespace sbx::daemon {
namespace {

using Type = KeyInfo::Type;
using Source = Origin::Source;

constexpr char kWarmPool[] = "warm_pool";
constexpr int64_t kMaxWarmPool = 256;

// Shorthands for the table below: the field of a key, by type.
#define SBX_STR(field) .str = [](Config& c) { return &c.field; }
#define SBX_NUM(field) .num = [](Config& c) { return &c.field; }
#define SBX_BOOL(field) .boolean = [](Config& c) { return &c.field; }

// The public contract: paths, flags and ranges are what operators write. Order: --print-config.
const std::vector<KeyInfo> kKeys = {
    {.path = "server.listen", .type = Type::kString, .flag = "--listen", .reloadable = false,
     .help = "HOST:PORT to serve the API on (port 0 picks one)", SBX_STR(server.listen)},
    {.path = "server.http_threads", .type = Type::kInt, .flag = "--http-threads",
     .reloadable = false, .min = 1, .max = 64, .why = "threads serving HTTP",
     .help = "threads serving HTTP", SBX_NUM(server.http_threads)},
    {.path = "server.admin_token", .type = Type::kString, .flag = "--admin-token",
     .reloadable = false, .secret = true,
     .help = "bearer token of tenant 'default' (empty: the one in STATE_DIR/admin-token, "
             "generated there on first start)",
     SBX_STR(server.admin_token)},
    {.path = "server.max_connections", .type = Type::kInt, .flag = "--max-connections",
     .reloadable = false, .min = 0, .max = 1048576,
     .why = "0 derives it from RLIMIT_NOFILE; at most the kernel's default nr_open",
     .help = "client connections the API holds at once, past which only the reserve serves "
             "(0: a quarter of RLIMIT_NOFILE, at most 4096)",
     SBX_NUM(server.max_connections)},
    {.path = "server.max_connections_per_ip", .type = Type::kInt,
     .flag = "--max-connections-per-ip", .reloadable = false, .min = 0, .max = 1048576,
     .why = "0 derives it from server.max_connections",
     .help = "connections one source address (an IPv6 /64) may hold (0: a quarter of "
             "server.max_connections)",
     SBX_NUM(server.max_connections_per_ip)},
    {.path = "server.reserved_connections", .type = Type::kInt,
     .flag = "--reserved-connections", .reloadable = false, .min = 1, .max = 1024,
     .why = "at least one, for the health check",
     .help = "connections past the caps (and spare descriptors for when accept runs out of "
             "them) that serve only /healthz, /readyz and the admin token",
     SBX_NUM(server.reserved_connections)},
    {.path = "server.header_timeout_s", .type = Type::kInt, .flag = "--header-timeout-s",
     .reloadable = false, .min = 1, .max = 300, .why = "1 s to 5 minutes",
     .help = "seconds a request's line and headers may take: from the accept for the first "
             "request, from its first byte for the next ones (a silent or trickling client is "
             "cut off here)",
     SBX_NUM(server.header_timeout_s)},
    {.path = "server.idle_timeout_s", .type = Type::kInt, .flag = "--idle-timeout-s",
     .reloadable = false, .min = 1, .max = 3600, .why = "1 s to an hour",
     .help = "seconds a keep-alive connection may wait for its next request",
     SBX_NUM(server.idle_timeout_s)},
    {.path = "server.guest_replies_in_flight", .type = Type::kInt,
     .flag = "--guest-replies-in-flight", .reloadable = false, .min = 1, .max = 1024,
     .why = "each costs sbxd up to 8 MiB while it is sent",
     .help = "process and file listings (replies a guest sizes, up to 4 MiB each) sbxd holds at "
             "once; one more is answered 503 server_busy at once",
     SBX_NUM(server.guest_replies_in_flight)},
    {.path = "server.guest_replies_per_sandbox", .type = Type::kInt,
     .flag = "--guest-replies-per-sandbox", .reloadable = false, .min = 1, .max = 1024,
     .why = "at least one",
     .help = "of those, for one sandbox; more wait in line (16 at most, 10 s at most), then 429",
     SBX_NUM(server.guest_replies_per_sandbox)},
    {.path = "state.dir", .type = Type::kString, .flag = "--state-dir", .reloadable = false,
     .help = "where the database, tokens and sandboxes live", SBX_STR(state.dir)},
    {.path = "runtime.default", .type = Type::kString, .flag = "--runtime", .reloadable = false,
     .choices = "ns|fake",
     .help = "default runtime: ns (namespaces) or fake (no isolation, tests only)",
     SBX_STR(runtime.default_runtime)},
    {.path = "runtime.agent_path", .type = Type::kString, .flag = "--agent-path",
     .reloadable = false, .help = "sbx-agent binary (empty: the one beside sbxd)",
     SBX_STR(runtime.agent_path)},
    {.path = "runtime.workers", .type = Type::kInt, .flag = "--workers", .reloadable = false,
     .min = 1, .max = 64, .why = "threads running lifecycle operations",
     .help = "threads running lifecycle operations (creates, deletes, pauses)",
     SBX_NUM(runtime.workers)},
    {.path = "runtime.ns.user_namespaces", .type = Type::kBool, .flag = "--userns",
     .reloadable = false,
     .help = "run each sandbox in its own user namespace and host uid range (false only for "
             "hosts whose state dir file system cannot be idmapped: sandbox root is then host "
             "root with fewer capabilities)",
     SBX_BOOL(runtime.ns.user_namespaces)},
    {.path = "runtime.ns.userns_pool", .type = Type::kInt, .flag = "--userns-pool",
     .reloadable = false, .min = 0, .max = 256, .why = "user namespaces built ahead",
     .help = "uid ranges claimed and user namespaces built ahead by an idle-priority thread; 0 "
             "builds each one during the launch",
     SBX_NUM(runtime.ns.userns_pool)},
    {.path = "runtime.ns.agent_memory_mib", .type = Type::kInt, .flag = "--agent-memory-mib",
     .reloadable = false, .min = 16, .max = 65536, .why = "MiB of memory for each sandbox's agent",
     .help = "memory limit of each sandbox's agent (its own cgroup beside the workload's, on top of "
             "the sandbox's memory_mib): the output it buffers for the sandbox's sessions lives "
             "there, and no memory bomb of the workload can reach it",
     SBX_NUM(runtime.ns.agent_memory_mib)},
    {.path = "runtime.ns.agent_pids", .type = Type::kInt, .flag = "--agent-pids",
     .reloadable = false, .min = 16, .max = 65536, .why = "processes of each sandbox's agent",
     .help = "pids.max of each sandbox's agent (itself, its file workers, and session processes "
             "until they join the workload's cgroup): a fork bomb of the workload cannot use them",
     SBX_NUM(runtime.ns.agent_pids)},
    {.path = "runtime.ns.netns_pool", .type = Type::kInt, .flag = "--netns-pool",
     .reloadable = false, .min = 0, .max = 256, .why = "network namespaces kept ready",
     .help = "network namespaces (lo up) kept ready for launches by an idle-priority thread; 0 "
             "creates each one during the launch",
     SBX_NUM(runtime.ns.netns_pool)},
    {.path = "runtime.ns.disk_pool", .type = Type::kInt, .flag = "--disk-pool",
     .reloadable = false, .min = 0, .max = 64, .why = "mounted disks kept ready",
     .help = "sandbox disks (ext4 images of sandbox.defaults.disk_mib, loop-mounted) kept ready "
             "by an idle-priority thread; 0 makes each one during the launch",
     SBX_NUM(runtime.ns.disk_pool)},
    {.path = "runtime.ns.seccomp_policy", .type = Type::kString, .flag = "--seccomp-policy",
     .reloadable = false,
     .help = "seccomp policy JSON for sandboxes (format: src/runtime/ns/seccomp_policy.json; "
             "empty: that file, embedded at build time)",
     SBX_STR(runtime.ns.seccomp_policy)},
    {.path = "runtime.ns.cgroup_favor_dynmods", .type = Type::kBool,
     .flag = "--cgroup-favor-dynmods", .reloadable = false,
     .help = "on hybrid cgroup v1/v2 hosts, remount the host's cgroup2 with favordynmods so "
             "that joining a sandbox's cgroups skips an RCU grace period (host-wide; false "
             "leaves the host's mount alone)",
     SBX_BOOL(runtime.ns.cgroup_favor_dynmods)},
    {.path = "runtime.ns.cgroup_parent", .type = Type::kString, .flag = "--cgroup-parent",
     .reloadable = false,
     .help = "absolute cgroup path that holds the sandbox cgroups in every hierarchy (e.g. /sbx: "
             "outside sbxd's own cgroup, so systemd can restart sbxd on pure cgroup v2 while "
             "sandboxes run); empty: <sbxd's own cgroup>/sbx. One sbxd per parent",
     SBX_STR(runtime.ns.cgroup_parent)},
    {.path = "sandbox.defaults.vcpu", .type = Type::kInt, .flag = "--default-vcpu",
     .reloadable = true, .min = 1, .max = 1024, .why = "whole CPUs of CPU quota",
     .help = "CPU quota (whole CPUs) of a sandbox whose create does not ask",
     SBX_NUM(sandbox.defaults.vcpu)},
    {.path = "sandbox.defaults.memory_mib", .type = Type::kInt, .flag = "--default-memory-mib",
     .reloadable = true, .min = 16, .max = 4194304, .why = "a memory limit in MiB",
     .help = "memory limit in MiB of a sandbox whose create does not ask",
     SBX_NUM(sandbox.defaults.memory_mib)},
    {.path = "sandbox.defaults.disk_mib", .type = Type::kInt, .flag = "--default-disk-mib",
     .reloadable = true, .min = 16, .max = 1048576,
     .why = "the ns runtime's disk images hold 16 MiB to 1 TiB",
     .help = "disk cap in MiB of a sandbox whose create does not ask (also the size of the "
             "disks runtime.ns.disk_pool makes ahead)",
     SBX_NUM(sandbox.defaults.disk_mib)},
    {.path = "sandbox.defaults.pids", .type = Type::kInt, .flag = "--default-pids",
     .reloadable = true, .min = 16, .max = 4194304,
     .why = "the agent and a shell need a few; the kernel's pid_max caps the rest",
     .help = "pids.max of every sandbox: a fork bomb stops there", SBX_NUM(sandbox.defaults.pids)},
    {.path = "sandbox.defaults.open_files", .type = Type::kInt, .flag = "--default-open-files",
     .reloadable = true, .min = 64, .max = 1048576,
     .why = "below 64 ordinary programs fail; 1048576 is the kernel's default nr_open",
     .help = "RLIMIT_NOFILE of sandbox processes (lowered to sbxd's own hard limit with a "
             "warning when above it)",
     SBX_NUM(sandbox.defaults.open_files)},
    {.path = "sandbox.defaults.tmp_mib", .type = Type::kInt, .flag = "--tmp-mib",
     .reloadable = true, .min = 1, .max = 1048576, .why = "a tmpfs size in MiB",
     .help = "size of each sandbox's tmpfs /tmp in MiB (pages in it count against the "
             "sandbox's memory limit)",
     SBX_NUM(sandbox.defaults.tmp_mib)},
    {.path = "sandbox.defaults.shm_mib", .type = Type::kInt, .flag = "--shm-mib",
     .reloadable = true, .min = 1, .max = 1048576, .why = "a tmpfs size in MiB",
     .help = "size of each sandbox's tmpfs /dev/shm in MiB (also counted as memory)",
     SBX_NUM(sandbox.defaults.shm_mib)},
    {.path = "sandbox.defaults.timeout_s", .type = Type::kInt, .flag = "--default-timeout-s",
     .reloadable = true, .min = 0, .max = 2592000, .why = "0 (no TTL) to 30 days",
     .help = "TTL in seconds of a sandbox whose create has no timeout_s: deleted that long "
             "after it was created (0: no TTL)",
     SBX_NUM(sandbox.timers.timeout_s)},
    {.path = "sandbox.defaults.idle_suspend_s", .type = Type::kInt,
     .flag = "--default-idle-suspend-s", .reloadable = true, .min = 0, .max = 2592000,
     .why = "0 (never) to 30 days",
     .help = "seconds without a management call, attach stream or running session after which "
             "a sandbox whose create has no idle_suspend_s is suspended (0: never)",
     SBX_NUM(sandbox.timers.idle_suspend_s)},
    {.path = "sandbox.limits.max_vcpu", .type = Type::kInt, .flag = "--max-vcpu",
     .reloadable = true, .min = 1, .max = 1024, .why = "whole CPUs of CPU quota",
     .help = "the most vcpu a create may ask for", SBX_NUM(sandbox.limits.max_vcpu)},
    {.path = "sandbox.limits.min_memory_mib", .type = Type::kInt, .flag = "--min-memory-mib",
     .reloadable = true, .min = 16, .max = 4194304, .why = "a memory limit in MiB",
     .help = "the least memory_mib a create may ask for", SBX_NUM(sandbox.limits.min_memory_mib)},
    {.path = "sandbox.limits.max_memory_mib", .type = Type::kInt, .flag = "--max-memory-mib",
     .reloadable = true, .min = 16, .max = 4194304, .why = "a memory limit in MiB",
     .help = "the most memory_mib a create may ask for", SBX_NUM(sandbox.limits.max_memory_mib)},
    {.path = "sandbox.limits.min_disk_mib", .type = Type::kInt, .flag = "--min-disk-mib",
     .reloadable = true, .min = 16, .max = 1048576,
     .why = "the ns runtime's disk images hold 16 MiB to 1 TiB",
     .help = "the least disk_mib a create may ask for", SBX_NUM(sandbox.limits.min_disk_mib)},
    {.path = "sandbox.limits.max_disk_mib", .type = Type::kInt, .flag = "--max-disk-mib",
     .reloadable = true, .min = 16, .max = 1048576,
     .why = "the ns runtime's disk images hold 16 MiB to 1 TiB",
     .help = "the most disk_mib a create may ask for", SBX_NUM(sandbox.limits.max_disk_mib)},
    {.path = "admission.enabled", .type = Type::kBool, .flag = "--admission", .reloadable = true,
     .help = "refuse a create (503 insufficient_capacity, or 422 exceeds_capacity when it can "
             "never fit) whose vcpu, memory or disk does not fit in what the host has beside "
             "the other sandboxes and the warm pool (false: admit everything)",
     SBX_BOOL(admission.enabled)},
    {.path = "admission.cpu_overcommit_percent", .type = Type::kInt,
     .flag = "--cpu-overcommit-percent", .reloadable = true, .min = 1, .max = 100000,
     .why = "1% to 1000 times the host's CPUs",
     .help = "vCPUs promised to sandboxes, in percent of the CPUs sbxd may run on (1600: 16 "
             "vCPUs per CPU; CPU time is shared, an oversubscribed host is only slower)",
     SBX_NUM(admission.cpu_overcommit_percent)},
    {.path = "admission.memory_overcommit_percent", .type = Type::kInt,
     .flag = "--memory-overcommit-percent", .reloadable = true, .min = 1, .max = 100000,
     .why = "1% to 1000 times the host's memory",
     .help = "memory promised to sandboxes, in percent of MemTotal (or of the memory limit of "
             "the cgroup the sandboxes live under); above 100 the host's OOM killer, not the "
             "sandbox's limit, decides when all use their limits at once",
     SBX_NUM(admission.memory_overcommit_percent)},
    {.path = "admission.disk_overcommit_percent", .type = Type::kInt,
     .flag = "--disk-overcommit-percent", .reloadable = true, .min = 1, .max = 100000,
     .why = "1% to 1000 times the state dir's space",
     .help = "disk promised to sandboxes, in percent of the free space in the state dir's file "
             "system plus what their (sparse) disks already take",
     SBX_NUM(admission.disk_overcommit_percent)},
    {.path = "admission.reserve_memory_mib", .type = Type::kInt, .flag = "--reserve-memory-mib",
     .reloadable = true, .min = 0, .max = 4194304, .why = "a memory size in MiB",
     .help = "memory in MiB kept for the host and sbxd itself, never promised to sandboxes",
     SBX_NUM(admission.reserve_memory_mib)},
    {.path = "admission.reserve_disk_mib", .type = Type::kInt, .flag = "--reserve-disk-mib",
     .reloadable = true, .min = 0, .max = int64_t{1} << 30, .why = "a disk size in MiB",
     .help = "space in MiB of the state dir's file system kept free for the host, the database "
             "and logs, never promised to sandbox disks",
     SBX_NUM(admission.reserve_disk_mib)},
    {.path = "sessions.output_buffer_bytes", .type = Type::kInt, .flag = "--output-buffer-bytes",
     .reloadable = false, .min = 64 << 10, .max = 1 << 30, .why = "64 KiB to 1 GiB per stream",
     .help = "output retained per session stream by the agent (what a re-attach can replay)",
     SBX_NUM(sessions.output_buffer_bytes)},
    {.path = "sessions.attach_token_ttl_s", .type = Type::kInt, .flag = "--attach-token-ttl-s",
     .reloadable = true, .min = 10, .max = 604800,
     .why = "10 s to 7 days: an attach token is a bearer credential",
     .help = "lifetime in seconds of the attach tokens minted for sessions",
     SBX_NUM(sessions.attach_token_ttl_s)},
    {.path = "retention.idempotency_keys_s", .type = Type::kInt,
     .flag = "--idempotency-retention-s", .reloadable = true, .min = 60, .max = 2592000,
     .why = "a minute to 30 days: a client retrying within this window gets the first answer",
     .help = "how long an Idempotency-Key's first response is kept for replays",
     SBX_NUM(retention.idempotency_keys_s)},
    {.path = "retention.deleted_sandboxes_s", .type = Type::kInt,
     .flag = "--deleted-retention-s", .reloadable = true, .min = 0, .max = 31536000,
     .why = "0 (purge at the next pass) to a year",
     .help = "how long a deleted sandbox (with its operations and sessions) stays readable "
             "before it is purged from the database",
     SBX_NUM(retention.deleted_sandboxes_s)},
    {.path = "metrics.public", .type = Type::kBool, .flag = "--metrics-public",
     .reloadable = false,
     .help = "serve GET /metrics without the admin token (for a scraper on a trusted network; "
             "the counts it shows are deployment-wide, never per tenant)",
     SBX_BOOL(metrics.public_endpoint)},
    {.path = "log.level", .type = Type::kString, .flag = "--log-level", .reloadable = true,
     .choices = "trace|debug|info|warn|error", .help = "trace, debug, info, warn or error",
     SBX_STR(log.level)},
    {.path = "log.format", .type = Type::kString, .flag = "--log-format", .reloadable = false,
     .choices = "json|text|auto",
     .help = "json: one JSON object per line; text: a line for people; auto: text on a "
             "terminal, else json",
     SBX_STR(log.format)},
    {.path = "log.file", .type = Type::kString, .flag = "--log-file", .reloadable = false,
     .help = "append the log to this file instead of stderr (empty); SIGHUP reopens it, for "
             "logrotate",
     SBX_STR(log.file)},
};

#undef SBX_STR
#undef SBX_NUM
#undef SBX_BOOL

// Read-only access through the same accessors: they never write.
const std::string& Str(const Config& c, const KeyInfo& k) {
  return *k.str(const_cast<Config&>(c));
}
int64_t Num(const Config& c, const KeyInfo& k) { return *k.num(const_cast<Config&>(c)); }
bool Bool(const Config& c, const KeyInfo& k) { return *k.boolean(const_cast<Config&>(c)); }

bool IsWarmPoolPath(std::string_view path) {
  return path.size() > sizeof(kWarmPool) && path.substr(0, sizeof(kWarmPool)) == "warm_pool.";
}
std::string WarmPoolPath(const std::string& name) { return std::string(kWarmPool) + "." + name; }

// TOML tables that may appear: every proper prefix of a key path, and warm_pool.
const std::set<std::string>& Tables() {
  static const std::set<std::string> tables = [] {
    std::set<std::string> t = {kWarmPool};
    for (const auto& k : kKeys) {
      std::string_view p = k.path;
      for (size_t dot = p.find('.'); dot != std::string_view::npos; dot = p.find('.', dot + 1)) {
        t.insert(std::string(p.substr(0, dot)));
      }
    }
    return t;
  }();
  return tables;
}

std::string TableOf(std::string_view path) {
  auto dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? std::string_view() : path.substr(0, dot));
}
std::string LeafOf(std::string_view path) {
  auto dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return out;
}
std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string Join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

absl::Status Errors(const std::vector<std::string>& errors) {
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(Join(errors, "; "));
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'x'?)" for a near miss (a typo), else "".
std::string DidYouMean(std::string_view wrong, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_d = 3;  // at most two edits: further than that is a different word
  for (const auto& c : candidates) {
    size_t d = EditDistance(wrong, c);
    if (d < best_d) {
      best_d = d;
      best = &c;
    }
  }
  return best ? fmt::format(" (did you mean '{}'?)", *best) : std::string();
}

std::vector<std::string> AllPaths() {
  std::vector<std::string> out(Tables().begin(), Tables().end());
  for (const auto& k : kKeys) out.push_back(k.path);
  return out;
}

std::string TypeName(Type t) {
  switch (t) {
    case Type::kString: return "a string";
    case Type::kInt: return "an integer";
    case Type::kBool: return "a boolean (true or false)";
  }
  return "?";
}

std::string TomlTypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time: return "a date or time";
    default: return "nothing";
  }
}

std::string TomlString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", ch);
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

// A template name as a TOML key: bare when it can be.
std::string TomlKey(std::string_view k) {
  bool bare = !k.empty() && std::all_of(k.begin(), k.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '-';
  });
  return bare ? std::string(k) : TomlString(k);
}

std::string ValueText(const Config& c, const KeyInfo& k) {
  switch (k.type) {
    case Type::kString: return TomlString(Str(c, k));
    case Type::kInt: return std::to_string(Num(c, k));
    case Type::kBool: return Bool(c, k) ? "true" : "false";
  }
  return "";
}

std::string Shown(const Config& c, const KeyInfo& k) {
  if (k.secret && !Str(c, k).empty()) return "\"<redacted>\"";
  return ValueText(c, k);
}

std::string FileLocation(const std::string& file, const toml::source_region& src) {
  return fmt::format("{}:{}:{}", file, src.begin.line, src.begin.column);
}

// How a message names a value: `--x 'v'` / `SBX_X='v'` for text as given, else TOML.
std::string Label(const KeyInfo& k, const Origin& o, const std::string& shown) {
  switch (o.source) {
    case Source::kFlag:
      return k.secret ? o.where : fmt::format("{} {}", o.where, shown);
    case Source::kEnv:
      return k.secret ? o.where : fmt::format("{}={}", o.where, shown);
    case Source::kFile:
      return k.secret ? fmt::format("{} in {}", k.path, o.where)
                      : fmt::format("{} = {} in {}", k.path, shown, o.where);
    case Source::kDefault:
      break;
  }
  return fmt::format("{} = {} (built-in default)", k.path, shown);
}

// A value as written on a command line or in a variable: strings quoted like the old flags'
// messages ("--runtime 'vm'"), numbers bare ("--default-pids 10").
std::string TextShown(const KeyInfo& k, std::string_view text) {
  return k.type == Type::kString ? fmt::format("'{}'", text) : std::string(text);
}

std::string LabelOf(const Config& c, const KeyInfo& k) {
  auto it = c.origins.find(k.path);
  if (it != c.origins.end()) return it->second.label;
  return Label(k, Origin{}, Shown(c, k));
}

std::string WarmLabel(const Config& c, const std::string& name) {
  auto it = c.origins.find(WarmPoolPath(name));
  if (it != c.origins.end()) return it->second.label;
  return fmt::format("{} = {} (built-in default)", WarmPoolPath(name), c.warm_pool.at(name));
}

std::optional<int64_t> ParseInt(std::string_view text) {
  int64_t v = 0;
  const char* b = text.data();
  const char* e = text.data() + text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (text.empty() || ec != std::errc() || p != e) return std::nullopt;
  return v;
}

std::optional<bool> ParseBool(std::string_view text) {
  const std::string t = Lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  return std::nullopt;
}

// Sets a key from a flag's or a variable's text. `where` is the flag or the variable.
absl::Status SetFromText(Config& c, const KeyInfo& k, std::string_view text, Source source,
                         const std::string& where) {
  Origin o{source, where, ""};
  auto bad = [&] {
    std::string as_given = k.secret ? where
                           : source == Source::kFlag
                               ? fmt::format("{} '{}'", where, text)
                               : fmt::format("{}='{}'", where, text);
    return absl::InvalidArgumentError(
        fmt::format("{}: expected {} ({})", as_given, TypeName(k.type), k.path));
  };
  switch (k.type) {
    case Type::kString:
      *k.str(c) = std::string(text);
      break;
    case Type::kInt: {
      auto v = ParseInt(text);
      if (!v) return bad();
      *k.num(c) = *v;
      break;
    }
    case Type::kBool: {
      auto v = ParseBool(text);
      if (!v) return bad();
      *k.boolean(c) = *v;
      break;
    }
  }
  o.label = Label(k, o, TextShown(k, text));
  c.origins[k.path] = std::move(o);
  return absl::OkStatus();
}

void SetFromToml(Config& c, const KeyInfo& k, const toml::node& node, const std::string& file,
                 std::vector<std::string>& errors) {
  const std::string where = FileLocation(file, node.source());
  bool ok = false;
  switch (k.type) {
    case Type::kString:
      if (auto v = node.as_string()) {
        *k.str(c) = v->get();
        ok = true;
      }
      break;
    case Type::kInt:
      if (auto v = node.as_integer()) {
        *k.num(c) = v->get();
        ok = true;
      }
      break;
    case Type::kBool:
      if (auto v = node.as_boolean()) {
        *k.boolean(c) = v->get();
        ok = true;
      }
      break;
  }
  if (!ok) {
    errors.push_back(fmt::format("{} in {}: expected {}, got {}", k.path, where, TypeName(k.type),
                                 TomlTypeName(node)));
    return;
  }
  Origin o{Source::kFile, where, ""};
  o.label = Label(k, o, ValueText(c, k));
  c.origins[k.path] = std::move(o);
}

void SetWarmPoolFromToml(Config& c, const toml::table& t, const std::string& file,
                         std::vector<std::string>& errors) {
  for (auto&& [key, node] : t) {
    const std::string name(key.str());
    const std::string path = WarmPoolPath(name);
    const std::string where = FileLocation(file, node.source());
    auto v = node.as_integer();
    if (!v) {
      errors.push_back(fmt::format("{} in {}: expected an integer (sandboxes kept ready), got {}",
                                   path, where, TomlTypeName(node)));
      continue;
    }
    c.warm_pool[name] = v->get();
    c.origins[path] = Origin{Source::kFile, where,
                             fmt::format("{} = {} in {}", path, v->get(), where)};
  }
}

void WalkTable(Config& c, const toml::table& t, const std::string& prefix, const std::string& file,
               std::vector<std::string>& errors) {
  for (auto&& [key, node] : t) {
    const std::string path =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const KeyInfo* k = FindKey(path)) {
      SetFromToml(c, *k, node, file, errors);
      continue;
    }
    if (Tables().count(path)) {
      const toml::table* sub = node.as_table();
      if (!sub) {
        errors.push_back(fmt::format("{} in {}: expected a table, got {}", path,
                                     FileLocation(file, node.source()), TomlTypeName(node)));
      } else if (path == kWarmPool) {
        SetWarmPoolFromToml(c, *sub, file, errors);
      } else {
        WalkTable(c, *sub, path, file, errors);
      }
      continue;
    }
    errors.push_back(fmt::format("unknown key '{}' in {}{}", path,
                                 FileLocation(file, key.source()), DidYouMean(path, AllPaths())));
  }
}

// "base=2" -> {"base", 2}, with the message the flag has always given.
absl::StatusOr<std::pair<std::string, int64_t>> ParseWarmPoolFlag(const std::string& spec) {
  auto eq = spec.find('=');
  std::string name = spec.substr(0, eq);
  std::optional<int64_t> n;
  if (eq != std::string::npos) n = ParseInt(std::string_view(spec).substr(eq + 1));
  if (name.empty() || !n || *n < 0 || *n > kMaxWarmPool) {
    return absl::InvalidArgumentError(fmt::format(
        "--warm-pool '{}': expected TEMPLATE=N with N from 0 to {}", spec, kMaxWarmPool));
  }
  return std::make_pair(name, *n);
}

// SBX_<TABLE>_ prefixes: a variable starting with one is meant for sbxd.
const std::vector<std::string>& EnvPrefixes() {
  static const std::vector<std::string> prefixes = [] {
    std::set<std::string> tops = {kWarmPool};
    for (const auto& k : kKeys) tops.insert(std::string(k.path).substr(0, std::string(k.path).find('.')));
    std::vector<std::string> out;
    for (const auto& t : tops) out.push_back("SBX_" + Upper(t) + "_");
    return out;
  }();
  return prefixes;
}

std::string Help(const KeyInfo& k) {
  Config defaults;
  std::string range = k.type == Type::kInt ? fmt::format("{} to {}, ", k.min, k.max) : "";
  return fmt::format("{} [{}, ${}; {}default {}{}]", k.help, k.path, EnvName(k.path), range,
                     ValueText(defaults, k), k.reloadable ? "; SIGHUP reloads it" : "");
}

const char* TypeHint(const KeyInfo& k) {
  if (std::string_view(k.path) == "server.listen") return "HOST:PORT";
  switch (k.type) {
    case Type::kString: return *k.choices ? "NAME" : "TEXT";
    case Type::kInt: return "N";
    case Type::kBool: return "BOOL";
  }
  return "TEXT";
}

}  // namespace

const std::vector<KeyInfo>& Keys() { return kKeys; }

const KeyInfo* FindKey(std::string_view path) {
  for (const auto& k : kKeys) {
    if (path == k.path) return &k;
  }
  return nullptr;
}

std::string EnvName(std::string_view path) { return "SBX_" + Upper(path); }

void AddFlags(CLI::App& app, CommandLine& cl) {
  app.add_option_function<std::string>(
         "--config", [&cl](const std::string& v) { cl.config_file = v; },
         fmt::format("TOML configuration file (default: {} when it exists; ${}; \"\" reads none)",
                     kDefaultConfigFile, kConfigEnv))
      ->type_name("FILE");
  app.add_flag("--print-config", cl.print_config,
               "print the effective configuration as TOML (secrets redacted) and exit");
  for (const auto& k : kKeys) {
    const KeyInfo* key = &k;
    app.add_option_function<std::string>(
           k.flag, [&cl, key](const std::string& v) { cl.values.emplace_back(key, v); }, Help(k))
        ->type_name(TypeHint(k));
  }
  app.add_option_function<std::vector<std::string>>(
      "--warm-pool",
      [&cl](const std::vector<std::string>& v) {
        cl.warm_pools.insert(cl.warm_pools.end(), v.begin(), v.end());
      },
      "TEMPLATE=N: keep N sandboxes of TEMPLATE ready so that creates with the default "
      "resources skip the launch (repeatable; N=0 turns a pool off) [warm_pool.TEMPLATE, "
      "$SBX_WARM_POOL_TEMPLATE; default base=2; SIGHUP reloads it]")
      ->type_name("TEMPLATE=N");
}

absl::Status ApplyToml(Config& c, std::string_view text, const std::string& file_name) {
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: TOML parse error: {}", FileLocation(file_name, e.source()), e.description()));
  }
  std::vector<std::string> errors;
  WalkTable(c, root, "", file_name, errors);
  return Errors(errors);
}

absl::Status ApplyEnv(Config& c, const std::vector<std::string>& env) {
  std::vector<std::string> errors;
  std::map<std::string, std::string> vars;
  for (const auto& entry : env) {
    auto eq = entry.find('=');
    if (eq == std::string::npos || entry.rfind("SBX_", 0) != 0) continue;
    vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::vector<std::string> env_names;
  for (const auto& k : kKeys) env_names.push_back(EnvName(k.path));
  const std::string warm_prefix = EnvName(kWarmPool) + "_";
  for (const auto& [name, value] : vars) {
    if (name == kConfigEnv || name == kAdminTokenAliasEnv) continue;
    auto key = std::find_if(kKeys.begin(), kKeys.end(),
                            [&](const KeyInfo& k) { return EnvName(k.path) == name; });
    if (key != kKeys.end()) {
      if (auto st = SetFromText(c, *key, value, Source::kEnv, name); !st.ok()) {
        errors.push_back(std::string(st.message()));
      }
      continue;
    }
    if (name.rfind(warm_prefix, 0) == 0 && name.size() > warm_prefix.size()) {
      const std::string tmpl = Lower(name.substr(warm_prefix.size()));
      auto n = ParseInt(value);
      if (!n) {
        errors.push_back(fmt::format("{}='{}': expected an integer (sandboxes of template '{}' "
                                     "kept ready)",
                                     name, value, tmpl));
        continue;
      }
      c.warm_pool[tmpl] = *n;
      c.origins[WarmPoolPath(tmpl)] =
          Origin{Source::kEnv, name, fmt::format("{}={}", name, *n)};
      continue;
    }
    bool ours = std::any_of(EnvPrefixes().begin(), EnvPrefixes().end(),
                            [&](const std::string& p) { return name.rfind(p, 0) == 0; });
    if (ours) {
      errors.push_back(fmt::format(
          "unknown configuration variable {}{} (a variable starting with {} names a key of "
          "docs/config.md)",
          name, DidYouMean(name, env_names), Join(EnvPrefixes(), ", ")));
    }
  }
  // The alias fills in only where the canonical name is unset or empty (an empty
  // SBX_ADMIN_TOKEN always meant unset).
  const KeyInfo& token = *FindKey("server.admin_token");
  auto alias = vars.find(kAdminTokenAliasEnv);
  auto canonical = vars.find(EnvName(token.path));
  if (alias != vars.end() && !alias->second.empty()) {
    if (canonical != vars.end() && !canonical->second.empty()) {
      if (canonical->second != alias->second) {
        errors.push_back(fmt::format("{} and {} are both set, to different tokens: set one",
                                     kAdminTokenAliasEnv, EnvName(token.path)));
      }
    } else {
      (void)SetFromText(c, token, alias->second, Source::kEnv, kAdminTokenAliasEnv);
    }
  }
  return Errors(errors);
}

absl::Status ApplyFlags(Config& c, const CommandLine& cl) {
  std::vector<std::string> errors;
  for (const auto& [key, text] : cl.values) {
    if (auto st = SetFromText(c, *key, text, Source::kFlag, key->flag); !st.ok()) {
      errors.push_back(std::string(st.message()));
    }
  }
  for (const auto& spec : cl.warm_pools) {
    auto parsed = ParseWarmPoolFlag(spec);
    if (!parsed.ok()) {
      errors.push_back(std::string(parsed.status().message()));
      continue;
    }
    const std::string label = fmt::format("--warm-pool '{}'", spec);
    c.warm_pool[parsed->first] = parsed->second;
    c.origins[WarmPoolPath(parsed->first)] = Origin{Source::kFlag, label, label};
  }
  return Errors(errors);
}

absl::StatusOr<std::pair<std::string, uint16_t>> SplitListen(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError("expected HOST:PORT, e.g. 127.0.0.1:7070");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto port = ParseInt(std::string_view(listen).substr(colon + 1));
  if (!port || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError("bad port (0 to 65535; 0 picks a free one)");
  }
  return std::make_pair(host, static_cast<uint16_t>(*port));
}

absl::Status Validate(const Config& c) {
  std::vector<std::string> errors;
  for (const auto& k : kKeys) {
    if (k.type == Type::kInt) {
      const int64_t v = Num(c, k);
      if (v < k.min || v > k.max) {
        errors.push_back(fmt::format("{}: must be between {} and {} ({})", LabelOf(c, k), k.min,
                                     k.max, k.why));
      }
    }
    if (k.type == Type::kString && *k.choices) {
      std::vector<std::string> choices;
      std::stringstream in(k.choices);
      for (std::string ch; std::getline(in, ch, '|');) choices.push_back(ch);
      if (std::find(choices.begin(), choices.end(), Str(c, k)) == choices.end()) {
        std::string last = choices.back();
        choices.pop_back();
        errors.push_back(
            fmt::format("{}: expected {} or {}", LabelOf(c, k), Join(choices, ", "), last));
      }
    }
  }
  if (auto l = SplitListen(c.server.listen); !l.ok()) {
    errors.push_back(fmt::format("{}: {}", LabelOf(c, *FindKey("server.listen")),
                                 std::string(l.status().message())));
  }
  if (auto st = sbx::runtime::ns::ValidateCgroupParent(c.runtime.ns.cgroup_parent); !st.ok()) {
    errors.push_back(fmt::format("{}: {}", LabelOf(c, *FindKey("runtime.ns.cgroup_parent")),
                                 std::string(st.message())));
  }
  if (c.state.dir.empty()) {
    errors.push_back(fmt::format("{}: must not be empty", LabelOf(c, *FindKey("state.dir"))));
  }
  for (const auto& [name, n] : c.warm_pool) {
    const bool name_ok = !name.empty() && name.size() <= 255 &&
                         std::none_of(name.begin(), name.end(), [](unsigned char ch) {
                           return ch <= ' ' || ch == '=' || ch == 0x7f;
                         });
    if (!name_ok) {
      errors.push_back(fmt::format("{}: '{}' is not a template name", WarmLabel(c, name), name));
    }
    if (n < 0 || n > kMaxWarmPool) {
      errors.push_back(fmt::format("{}: must be between 0 and {} (sandboxes kept ready per "
                                   "template)",
                                   WarmLabel(c, name), kMaxWarmPool));
    }
  }
  // Relations: a default outside the limits would give sandboxes what no create may ask for.
  auto key = [&](const char* path) { return LabelOf(c, *FindKey(path)); };
  if (c.server.max_connections > 0 &&
      c.server.max_connections_per_ip > c.server.max_connections) {
    errors.push_back(fmt::format("{} is above {}", key("server.max_connections_per_ip"),
                                 key("server.max_connections")));
  }
  const auto& d = c.sandbox.defaults;
  const auto& l = c.sandbox.limits;
  if (l.min_memory_mib > l.max_memory_mib) {
    errors.push_back(fmt::format("{} is above {}", key("sandbox.limits.min_memory_mib"),
                                 key("sandbox.limits.max_memory_mib")));
  } else if (d.memory_mib < l.min_memory_mib || d.memory_mib > l.max_memory_mib) {
    errors.push_back(fmt::format("{}: must be within {} and {}", key("sandbox.defaults.memory_mib"),
                                 key("sandbox.limits.min_memory_mib"),
                                 key("sandbox.limits.max_memory_mib")));
  }
  if (l.min_disk_mib > l.max_disk_mib) {
    errors.push_back(fmt::format("{} is above {}", key("sandbox.limits.min_disk_mib"),
                                 key("sandbox.limits.max_disk_mib")));
  } else if (d.disk_mib < l.min_disk_mib || d.disk_mib > l.max_disk_mib) {
    errors.push_back(fmt::format("{}: must be within {} and {}", key("sandbox.defaults.disk_mib"),
                                 key("sandbox.limits.min_disk_mib"),
                                 key("sandbox.limits.max_disk_mib")));
  }
  if (d.vcpu > l.max_vcpu) {
    errors.push_back(fmt::format("{}: must not be above {}", key("sandbox.defaults.vcpu"),
                                 key("sandbox.limits.max_vcpu")));
  }
  return Errors(errors);
}

absl::StatusOr<ConnectionLimits> ResolveConnectionLimits(const Config& c,
                                                         uint64_t open_files) {
  const auto& s = c.server;
  auto key = [&](const char* path) { return LabelOf(c, *FindKey(path)); };
  ConnectionLimits out;
  out.reserved_connections = static_cast<size_t>(s.reserved_connections);
  const uint64_t budget = open_files / 2;
  if (s.max_connections > 0) {
    out.max_connections = static_cast<size_t>(s.max_connections);
    if (out.max_connections + out.reserved_connections > budget) {
      return absl::InvalidArgumentError(fmt::format(
          "{} with {}: needs {} of sbxd's RLIMIT_NOFILE of {}, more than half of it (each "
          "connection may hold an agent socket too, and sandboxes need the rest): lower it or "
          "raise the limit (LimitNOFILE= in the systemd unit)",
          key("server.max_connections"), key("server.reserved_connections"),
          out.max_connections + out.reserved_connections, open_files));
    }
  } else {
    const uint64_t quarter = open_files / 4;
    uint64_t derived = std::min<uint64_t>(4096, quarter);
    if (derived + out.reserved_connections > budget) {
      derived = budget > out.reserved_connections ? budget - out.reserved_connections : 0;
    }
    if (derived == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "sbxd's RLIMIT_NOFILE of {} leaves no room for API connections beside {}: raise "
          "the limit (LimitNOFILE= in the systemd unit)",
          open_files, key("server.reserved_connections")));
    }
    out.max_connections = static_cast<size_t>(derived);
  }
  if (s.max_connections_per_ip > 0) {
    out.max_connections_per_ip = static_cast<size_t>(s.max_connections_per_ip);
    if (out.max_connections_per_ip > out.max_connections) {
      return absl::InvalidArgumentError(
          fmt::format("{} is above the {} API connections of {} (derived from RLIMIT_NOFILE {})",
                      key("server.max_connections_per_ip"), out.max_connections,
                      key("server.max_connections"), open_files));
    }
  } else {
    out.max_connections_per_ip = std::max<size_t>(1, out.max_connections / 4);
  }
  return out;
}

absl::StatusOr<Loaded> Load(const CommandLine& cl, const std::vector<std::string>& env,
                            const std::string& default_file) {
  Loaded out;
  std::optional<std::string> file = cl.config_file;
  std::string named_by = "--config";
  if (!file) {
    const std::string prefix = std::string(kConfigEnv) + "=";
    for (const auto& e : env) {
      if (e.rfind(prefix, 0) == 0) {
        file = e.substr(prefix.size());
        named_by = kConfigEnv;
      }
    }
  }
  if (!file) {
    // Absent is fine for the default file only; anything else (EACCES) is reported by the read.
    struct stat st{};
    if (::stat(default_file.c_str(), &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) {
      file = default_file;
      named_by = "the default configuration file";
    }
  }
  if (file && !file->empty()) {
    std::ifstream in(*file, std::ios::binary);
    if (!in) {
      return ErrnoStatus(errno, fmt::format("configuration file {} (from {}): open", *file,
                                            named_by));
    }
    std::stringstream text;
    text << in.rdbuf();
    if (in.bad()) {
      return ErrnoStatus(errno, fmt::format("configuration file {}: read", *file));
    }
    SBX_RETURN_IF_ERROR(ApplyToml(out.config, text.str(), *file));
    out.file = *file;
    struct stat st{};
    if (out.config.origins.count("server.admin_token") &&
        out.config.origins.at("server.admin_token").source == Source::kFile &&
        ::stat(file->c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      out.warnings.push_back(fmt::format(
          "{} holds server.admin_token but is readable by others than its owner (mode {:04o}): "
          "chmod 600 it",
          *file, st.st_mode & 07777));
    }
  }
  SBX_RETURN_IF_ERROR(ApplyEnv(out.config, env));
  SBX_RETURN_IF_ERROR(ApplyFlags(out.config, cl));
  SBX_RETURN_IF_ERROR(Validate(out.config));
  return out;
}

std::string ShowValue(const Config& c, const std::string& path) {
  if (IsWarmPoolPath(path)) {
    auto it = c.warm_pool.find(path.substr(sizeof(kWarmPool)));
    return std::to_string(it == c.warm_pool.end() ? 0 : it->second);
  }
  const KeyInfo* k = FindKey(path);
  return k ? Shown(c, *k) : std::string();
}

std::string Describe(const Config& c, const std::string& path) {
  if (IsWarmPoolPath(path)) {
    const std::string name = path.substr(sizeof(kWarmPool));
    if (c.warm_pool.count(name)) return WarmLabel(c, name);
    return path;
  }
  const KeyInfo* k = FindKey(path);
  return k ? LabelOf(c, *k) : path;
}

std::string ToToml(const Config& c, bool redact) {
  auto comment = [&](const std::string& path) {
    auto it = c.origins.find(path);
    if (it == c.origins.end()) return std::string();
    const Origin& o = it->second;
    // A line number is enough in a file; the column is for error messages.
    std::string where = o.where;
    if (o.source == Source::kFile) where = where.substr(0, where.rfind(':'));
    return "  # " + where;
  };
  std::string out =
      "# sbxd's effective configuration (sbxd --print-config); a comment names where a value\n"
      "# came from when it is not the built-in default. See docs/config.md.\n";
  std::string table = "-";
  for (const auto& k : kKeys) {
    if (TableOf(k.path) != table) {
      table = TableOf(k.path);
      out += fmt::format("\n[{}]\n", table);
    }
    out += fmt::format("{} = {}{}\n", LeafOf(k.path), redact ? Shown(c, k) : ValueText(c, k),
                       comment(k.path));
  }
  out += fmt::format("\n[{}]\n", kWarmPool);
  for (const auto& [name, n] : c.warm_pool) {
    out += fmt::format("{} = {}{}\n", TomlKey(name), n, comment(WarmPoolPath(name)));
  }
  return out;
}

ReloadPlan PlanReload(const Config& running, const Config& loaded) {
  ReloadPlan plan;
  plan.config = loaded;
  for (const auto& k : kKeys) {
    if (ValueText(running, k) == ValueText(loaded, k)) continue;
    ReloadPlan::Change change{k.path, Shown(running, k), Shown(loaded, k)};
    if (k.reloadable) {
      plan.applied.push_back(std::move(change));
      continue;
    }
    plan.needs_restart.push_back(std::move(change));
    switch (k.type) {
      case Type::kString: *k.str(plan.config) = Str(running, k); break;
      case Type::kInt: *k.num(plan.config) = Num(running, k); break;
      case Type::kBool: *k.boolean(plan.config) = Bool(running, k); break;
    }
    if (auto it = running.origins.find(k.path); it != running.origins.end()) {
      plan.config.origins[k.path] = it->second;
    } else {
      plan.config.origins.erase(k.path);
    }
  }
  std::set<std::string> names;
  for (const auto& [name, n] : running.warm_pool) names.insert(name);
  for (const auto& [name, n] : loaded.warm_pool) names.insert(name);
  for (const auto& name : names) {
    const std::string path = WarmPoolPath(name);
    std::string from = ShowValue(running, path), to = ShowValue(loaded, path);
    if (from != to) plan.applied.push_back({path, from, to});
  }
  return plan;
}

}  // namespace sbx::daemon

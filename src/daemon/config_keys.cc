#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config.h"
#include "daemon/config_internal.h"
#include "runtime/ns/disk_image.h"

namespace sbx::daemon {
namespace {

using config_internal::Type;

// The ranges a default and the limits on it share: what sbxd can enforce at all.
constexpr int64_t kLeastVcpu = runtime::ResourceLimits{}.min_vcpu;
constexpr int64_t kMostVcpu = 1024;
constexpr int64_t kLeastMemoryMib = 16;
constexpr int64_t kMostMemoryMib = 4194304;
constexpr int64_t kLeastDiskMib = runtime::ns::kMinDiskMib;
constexpr int64_t kMostDiskMib = runtime::ns::kMaxDiskMib;

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
    {.path = "tls.cert_file", .type = Type::kString, .flag = "--tls-cert-file",
     .reloadable = true,
     .help = "PEM certificate chain (the leaf first) of the API's listener; with tls.key_file "
             "the listener speaks only HTTPS (TLS 1.2 at least). Empty: plain HTTP. SIGHUP "
             "reads both files again; a pair that fails to load keeps the running one",
     SBX_STR(tls.cert_file)},
    {.path = "tls.key_file", .type = Type::kString, .flag = "--tls-key-file", .reloadable = true,
     .help = "PEM private key of tls.cert_file's certificate (both or neither)",
     SBX_STR(tls.key_file)},
    {.path = "state.dir", .type = Type::kString, .flag = "--state-dir", .reloadable = false,
     .help = "where the database, tokens and sandboxes live", SBX_STR(state.dir)},
    {.path = "store.url", .type = Type::kString, .flag = "--store", .reloadable = false,
     .secret = true,
     .help = "the database: empty for SQLite at STATE_DIR/sbx.db, an absolute path or "
             "sqlite:///PATH for SQLite elsewhere, postgresql://USER:PASSWORD@HOST:PORT/DB "
             "(libpq's URL; postgres:// too) for PostgreSQL (docs/store.md)",
     SBX_STR(store.url)},
    {.path = "store.pool_size", .type = Type::kInt, .flag = "--store-pool-size",
     .reloadable = false, .min = 1, .max = 256, .why = "connections to PostgreSQL",
     .help = "connections sbxd keeps to PostgreSQL, i.e. its transactions at once (SQLite: "
             "unused, one connection)",
     SBX_NUM(store.pool_size)},
    {.path = "node.role", .type = Type::kString, .flag = "--role", .reloadable = false,
     .choices = "all|api|node",
     .help = "all: one sbxd does everything (the default); api: a stateless replica (the API, "
             "placement, forwarding to nodes; no runtime); node: runtimes and the sandboxes "
             "placed here. api and node need a PostgreSQL store.url (docs/scale.md)",
     SBX_STR(node.role)},
    {.path = "node.name", .type = Type::kString, .flag = "--node-name", .reloadable = false,
     .help = "this node's name in the store, stamped on its sandboxes (empty: the host name); "
             "keep it stable across restarts",
     SBX_STR(node.name)},
    {.path = "node.url", .type = Type::kString, .flag = "--node-url", .reloadable = false,
     .help = "the http:// URL api replicas reach this node's API at (empty: from "
             "server.listen, with the host name for a wildcard address)",
     SBX_STR(node.url)},
    {.path = "node.heartbeat_ms", .type = Type::kInt, .flag = "--node-heartbeat-ms",
     .reloadable = false, .min = 100, .max = 60000, .why = "0.1 s to a minute",
     .help = "how often a node writes its heartbeat (load, capacity) to the store",
     SBX_NUM(node.heartbeat_ms)},
    {.path = "node.lost_after_ms", .type = Type::kInt, .flag = "--node-lost-after-ms",
     .reloadable = false, .min = 500, .max = 3600000, .why = "0.5 s to an hour",
     .help = "a node whose last heartbeat is older than this is declared lost: its sandboxes "
             "become `lost`, its operations fail; at least 3 heartbeats",
     SBX_NUM(node.lost_after_ms)},
    {.path = "node.restart_grace_ms", .type = Type::kInt, .flag = "--node-restart-grace-ms",
     .reloadable = false, .min = 0, .max = 86400000, .why = "0 (off) to a day",
     .help = "a node stopped on purpose (SIGTERM) is not declared lost for this long, and "
             "nothing is placed on it meanwhile: a rolling restart keeps its sandboxes; 0: a "
             "stopped node is judged by its heartbeats alone (node.lost_after_ms)",
     SBX_NUM(node.restart_grace_ms)},
    {.path = "runtime.default", .type = Type::kString, .flag = "--runtime", .reloadable = false,
     .choices = "ns|microvm|fake",
     .help = "default runtime: ns (namespaces), microvm (a guest kernel per sandbox) or fake "
             "(no isolation, tests only)",
     SBX_STR(runtime.default_runtime)},
    {.path = "runtime.agent_path", .type = Type::kString, .flag = "--agent-path",
     .reloadable = false, .help = "sbx-agent binary (empty: the one beside sbxd)",
     SBX_STR(runtime.agent_path)},
    {.path = "runtime.workers", .type = Type::kInt, .flag = "--workers", .reloadable = false,
     .min = 1, .max = 64, .why = "threads running lifecycle operations",
     .help = "threads running lifecycle operations (creates, deletes, pauses)",
     SBX_NUM(runtime.workers)},
    {.path = "runtime.microvm.enabled", .type = Type::kBool, .flag = "--microvm",
     .reloadable = false,
     .help = "offer the microvm runtime (a QEMU microVM per sandbox, `runtime: \"microvm\"` on "
             "create) beside runtime.default when this host can run it; sbxd logs why not "
             "otherwise, and such creates get 501 with that reason",
     SBX_BOOL(runtime.microvm.enabled)},
    {.path = "runtime.microvm.vmm", .type = Type::kString, .flag = "--microvm-vmm",
     .reloadable = false, .choices = "qemu|firecracker",
     .help = "the VMM of new microVMs: qemu (Debian's qemu-system-x86) or firecracker (its release "
             "binaries, installed by the operator; needs KVM)",
     SBX_STR(runtime.microvm.vmm)},
    {.path = "runtime.microvm.qemu", .type = Type::kString, .flag = "--microvm-qemu",
     .reloadable = false, .help = "QEMU binary of the microvm runtime (a name is looked up in PATH)",
     SBX_STR(runtime.microvm.qemu)},
    {.path = "runtime.microvm.firecracker", .type = Type::kString, .flag = "--microvm-firecracker",
     .reloadable = false,
     .help = "Firecracker binary with runtime.microvm.vmm = firecracker (a name is looked up in PATH)",
     SBX_STR(runtime.microvm.firecracker)},
    {.path = "runtime.microvm.jailer", .type = Type::kString, .flag = "--microvm-jailer",
     .reloadable = false,
     .help = "Firecracker's jailer binary (it ships beside firecracker; a name is looked up in PATH)",
     SBX_STR(runtime.microvm.jailer)},
    {.path = "runtime.microvm.kernel", .type = Type::kString, .flag = "--microvm-kernel",
     .reloadable = false,
     .help = "guest kernel (a bzImage, e.g. /boot/vmlinuz-6.1.0-27-amd64) whose modules are in "
             "/lib/modules/<version>; empty: the newest /boot/vmlinuz-* (linux-image-amd64)",
     SBX_STR(runtime.microvm.kernel)},
    {.path = "runtime.microvm.accel", .type = Type::kString, .flag = "--microvm-accel",
     .reloadable = false, .choices = "auto|kvm|tcg",
     .help = "how QEMU runs guests: kvm, tcg (software emulation, seconds per boot), or auto: kvm "
             "when /dev/kvm is usable and the CPU shows vmx/svm, tcg otherwise",
     SBX_STR(runtime.microvm.accel)},
    {.path = "runtime.microvm.boot_timeout_s", .type = Type::kInt, .flag = "--microvm-boot-timeout",
     .reloadable = false, .min = 5, .max = 3600, .why = "seconds a guest may take to boot",
     .help = "seconds a microVM's guest may take to boot before its create fails",
     SBX_NUM(runtime.microvm.boot_timeout_s)},
    {.path = "runtime.ns.enabled", .type = Type::kBool, .flag = "--ns", .reloadable = false,
     .help = "with runtime.default = \"microvm\": also offer the ns runtime (`runtime: \"ns\"` "
             "on create, and the sandboxes of template builds) where this host can run it",
     SBX_BOOL(runtime.ns.enabled)},
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
    {.path = "runtime.ns.cgroup_pool", .type = Type::kInt, .flag = "--cgroup-pool",
     .reloadable = false, .min = 0, .max = 256, .why = "cgroup sets built ahead",
     .help = "sandbox cgroup directory sets (cgroup v1 hierarchies: memory, pids, cpu, each with "
             "its work child) built ahead by an idle-priority thread and renamed to the sandbox's "
             "id at launch; 0 makes each one during the launch. Pure cgroup v2 hosts make them at "
             "launch whatever this says (v2 has no rename)",
     SBX_NUM(runtime.ns.cgroup_pool)},
    {.path = "runtime.ns.removal_backlog", .type = Type::kInt, .flag = "--removal-backlog",
     .reloadable = false, .min = 0, .max = 4096, .why = "deleted sandboxes' files awaiting removal",
     .help = "deleted sandboxes whose files (disk image, upper layer, log) a low-priority thread "
             "removes after the delete has finished, at most; when full, or 0, a delete removes "
             "them itself before it finishes",
     SBX_NUM(runtime.ns.removal_backlog)},
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
     .reloadable = true, .min = kLeastVcpu, .max = kMostVcpu, .why = "whole CPUs of CPU quota",
     .help = "CPU quota (whole CPUs) of a sandbox whose create does not ask",
     SBX_NUM(sandbox.defaults.vcpu)},
    {.path = "sandbox.defaults.memory_mib", .type = Type::kInt, .flag = "--default-memory-mib",
     .reloadable = true, .min = kLeastMemoryMib, .max = kMostMemoryMib,
     .why = "a memory limit in MiB",
     .help = "memory limit in MiB of a sandbox whose create does not ask",
     SBX_NUM(sandbox.defaults.memory_mib)},
    {.path = "sandbox.defaults.disk_mib", .type = Type::kInt, .flag = "--default-disk-mib",
     .reloadable = true, .min = kLeastDiskMib, .max = kMostDiskMib,
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
     .reloadable = true, .min = kLeastVcpu, .max = kMostVcpu, .why = "whole CPUs of CPU quota",
     .help = "the most vcpu a create may ask for", SBX_NUM(sandbox.limits.max_vcpu)},
    {.path = "sandbox.limits.min_memory_mib", .type = Type::kInt, .flag = "--min-memory-mib",
     .reloadable = true, .min = kLeastMemoryMib, .max = kMostMemoryMib,
     .why = "a memory limit in MiB",
     .help = "the least memory_mib a create may ask for", SBX_NUM(sandbox.limits.min_memory_mib)},
    {.path = "sandbox.limits.max_memory_mib", .type = Type::kInt, .flag = "--max-memory-mib",
     .reloadable = true, .min = kLeastMemoryMib, .max = kMostMemoryMib,
     .why = "a memory limit in MiB",
     .help = "the most memory_mib a create may ask for", SBX_NUM(sandbox.limits.max_memory_mib)},
    {.path = "sandbox.limits.min_disk_mib", .type = Type::kInt, .flag = "--min-disk-mib",
     .reloadable = true, .min = kLeastDiskMib, .max = kMostDiskMib,
     .why = "the ns runtime's disk images hold 16 MiB to 1 TiB",
     .help = "the least disk_mib a create may ask for", SBX_NUM(sandbox.limits.min_disk_mib)},
    {.path = "sandbox.limits.max_disk_mib", .type = Type::kInt, .flag = "--max-disk-mib",
     .reloadable = true, .min = kLeastDiskMib, .max = kMostDiskMib,
     .why = "the ns runtime's disk images hold 16 MiB to 1 TiB",
     .help = "the most disk_mib a create may ask for", SBX_NUM(sandbox.limits.max_disk_mib)},
    {.path = "egress.enabled", .type = Type::kBool, .flag = "--egress", .reloadable = false,
     .help = "offer networked egress profiles (`open` and egress.profiles.*): turns on IPv4 and "
             "IPv6 forwarding and keeps sbx's own nftables table `inet sbx`; false: every "
             "sandbox is `none` (loopback only) and the host's network is left alone",
     SBX_BOOL(egress.enabled)},
    {.path = "egress.pool_v4", .type = Type::kString, .flag = "--egress-pool-v4",
     .reloadable = false,
     .help = "IPv4 range (/8 to /29) networked sandboxes take a /30 of each; refused to every "
             "sandbox as a destination",
     SBX_STR(egress.pool_v4)},
    {.path = "egress.pool_v6", .type = Type::kString, .flag = "--egress-pool-v6",
     .reloadable = false,
     .help = "IPv6 range (/64 to /125) networked sandboxes take a /126 of each",
     SBX_STR(egress.pool_v6)},
    {.path = "egress.uplink", .type = Type::kString, .flag = "--egress-uplink",
     .reloadable = false,
     .help = "interface sandbox traffic is masqueraded toward (empty: every interface)",
     SBX_STR(egress.uplink)},
    {.path = "egress.exempt", .type = Type::kString, .flag = "--egress-exempt",
     .reloadable = false,
     .help = "comma-separated CIDRs lifted from the always-blocked ranges (a lab network; "
             "never the metadata addresses, the host or other sandboxes)",
     SBX_STR(egress.exempt)},
    {.path = "egress.deny", .type = Type::kString, .flag = "--egress-deny", .reloadable = false,
     .help = "comma-separated CIDRs refused to every sandbox whatever its profile",
     SBX_STR(egress.deny)},
    {.path = "egress.dns_port", .type = Type::kInt, .flag = "--egress-dns-port",
     .reloadable = false, .min = 1, .max = 65535, .why = "a UDP and TCP port",
     .help = "port of sbxd's own DNS resolver on every host address; nftables redirects the "
             "networked sandboxes' DNS (port 53 to their veth's host end) to it and refuses "
             "DNS to other resolvers under domain rules",
     SBX_NUM(egress.dns_port)},
    {.path = "egress.dns_upstream", .type = Type::kString, .flag = "--egress-dns-upstream",
     .reloadable = false,
     .help = "comma-separated upstream resolvers of sbxd's resolver, ip[:port] or [ipv6]:port "
             "(empty: the nameservers of the host's /etc/resolv.conf)",
     SBX_STR(egress.dns_upstream)},
    {.path = "egress.proxy_port", .type = Type::kInt, .flag = "--egress-proxy-port",
     .reloadable = false, .min = 1, .max = 65535, .why = "a TCP port",
     .help = "port of sbxd's Host/SNI proxy, which checks each TCP connection of a sandbox with "
             "domain rules (nftables redirects them there; it listens on every address, and "
             "the port is dropped from every interface but the sandboxes' veths and loopback)",
     SBX_NUM(egress.proxy_port)},
    {.path = "egress.proxy_idle_timeout_s", .type = Type::kInt,
     .flag = "--egress-proxy-idle-timeout-s", .reloadable = false, .min = 10, .max = 86400,
     .why = "10 s to a day",
     .help = "a connection relayed by the proxy with no byte either way for this long is reset",
     SBX_NUM(egress.proxy_idle_timeout_s)},
    {.path = "egress.max_connections", .type = Type::kInt, .flag = "--egress-max-connections",
     .reloadable = false, .min = 0, .max = 1000000,
     .why = "0 turns the limit off; more than a million flows per sandbox is no limit at all",
     .help = "connections (conntrack entries: TCP, UDP and ICMP flows) one networked sandbox may "
             "have open at once; the next is refused (denial reason conn_limit); 0: no limit",
     SBX_NUM(egress.max_connections)},
    {.path = "egress.rate_mbit", .type = Type::kInt, .flag = "--egress-rate-mbit",
     .reloadable = false, .min = 0, .max = 100000,
     .why = "0 turns the limit off; 100 Gbit/s is beyond any veth",
     .help = "bandwidth of one networked sandbox in Mbit/s, each way (tc on its host veth: a "
             "token bucket toward it, policing from it); 0: no limit",
     SBX_NUM(egress.rate_mbit)},
    {.path = "egress.warm_pool", .type = Type::kInt, .flag = "--egress-warm-pool",
     .reloadable = true, .min = 0, .max = 256, .why = "as a warm_pool.<template> entry",
     .help = "network-ready sandboxes kept beside each warm pool (every warm_pool.<template> "
             "above 0) when egress.enabled: launched with a veth no sandbox has claimed yet, "
             "each serves one create with a networked profile and the default resources, which "
             "gets its rules at take (one nftables transaction); 0: networked creates are "
             "launched cold",
     SBX_NUM(egress.warm_pool)},
    {.path = "admission.enabled", .type = Type::kBool, .flag = "--admission", .reloadable = true,
     .help = "refuse a create (503 insufficient_capacity, or 422 exceeds_capacity when it can "
             "never fit) whose vcpu, memory or disk does not fit in what the host has beside "
             "the other sandboxes and the warm pool (false: admit everything)",
     SBX_BOOL(admission.enabled)},
    {.path = "admission.cpu_overcommit_percent", .type = Type::kInt,
     .flag = "--cpu-overcommit-percent", .reloadable = true, .min = 1, .max = 1000000,
     .why = "1% to 10000 times the host's CPUs (5,000 idle 1-vCPU sandboxes on 2 CPUs need "
            "250000)",
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
    {.path = "admission.max_sandboxes", .type = Type::kInt, .flag = "--max-sandboxes",
     .reloadable = false, .min = 0, .max = 1000000, .why = "0 (what the host's limits hold) to a million",
     .help = "sandboxes (warm pool included) held at once, even with admission off; past it a "
             "create is 503 insufficient_capacity. 0: what the host's limits hold (descriptors, "
             "pids, namespaces, uid ranges; sbxd logs it). More than they hold stops sbxd at "
             "start-up, naming each limit and its fix",
     SBX_NUM(admission.max_sandboxes)},
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
    {.path = "tenancy.rate_limit_rps", .type = Type::kInt, .flag = "--rate-limit-rps",
     .reloadable = true, .min = 0, .max = 1000000, .why = "0 (none) to a million",
     .help = "requests per second each management token of a tenant may make, unless the "
             "tenant has its own rate_limit (0: unlimited; the configured admin token is never "
             "limited)",
     SBX_NUM(tenancy.rate_limit_rps)},
    {.path = "tenancy.rate_limit_burst", .type = Type::kInt, .flag = "--rate-limit-burst",
     .reloadable = true, .min = 0, .max = 1000000, .why = "0 (the rate) to a million",
     .help = "how many requests a token may make at once above its rate (0: the rate, at "
             "least 1)",
     SBX_NUM(tenancy.rate_limit_burst)},
    {.path = "tenancy.max_token_ttl_s", .type = Type::kInt, .flag = "--max-token-ttl-s",
     .reloadable = true, .min = 0, .max = 316224000, .why = "0 (no bound) to ten years",
     .help = "the longest expires_in_s a new management token may ask for (0: no bound; a "
             "token without expires_in_s never expires)",
     SBX_NUM(tenancy.max_token_ttl_s)},
    {.path = "ports.domain", .type = Type::kString, .flag = "--ports-domain",
     .reloadable = false,
     .help = "host-name routing of sandbox ports: a request whose Host is "
             "{port}-{sandbox id}.{domain} goes to that port (point a wildcard DNS name at "
             "sbxd); empty: only the path form /v1/sandboxes/{id}/ports/{port}/...",
     SBX_STR(ports.domain)},
    {.path = "ports.connect_timeout_ms", .type = Type::kInt, .flag = "--ports-connect-timeout-ms",
     .reloadable = false, .min = 10, .max = 60000, .why = "10 ms to a minute",
     .help = "how long sbxd waits for a connection to a sandbox port before answering 504",
     SBX_NUM(ports.connect_timeout_ms)},
    {.path = "ports.idle_timeout_s", .type = Type::kInt, .flag = "--ports-idle-timeout-s",
     .reloadable = false, .min = 1, .max = 86400, .why = "a second to a day",
     .help = "a request or WebSocket relayed to a sandbox port is ended once no byte has "
             "moved either way for this long (a server that never answers holds nothing)",
     SBX_NUM(ports.idle_timeout_s)},
    {.path = "e2b.domain", .type = Type::kString, .flag = "--e2b-domain",
     .reloadable = false,
     .help = "the `domain` E2B answers give (create, connect, info): SDKs without "
             "E2B_SANDBOX_URL reach https://{port}-{sandbox id}.{domain}; may carry :PORT when "
             "sbxd's listener is not on 443; empty: ports.domain",
     SBX_STR(e2b.domain)},
    {.path = "templates.max_image_mib", .type = Type::kInt, .flag = "--templates-max-image-mib",
     .reloadable = false, .min = 1, .max = 16 << 20, .why = "1 MiB to 16 TiB",
     .help = "unpacked bytes of one template's layers; an import or pull past it fails "
             "(image_too_large) and leaves nothing behind",
     SBX_NUM(templates.max_image_mib)},
    {.path = "templates.max_store_mib", .type = Type::kInt, .flag = "--templates-max-store-mib",
     .reloadable = false, .min = 0, .max = 64 << 20, .why = "0 turns the bound off",
     .help = "unpacked bytes of every layer in the template store together; 0: only the disk "
             "bounds it (`sbx template gc` frees what no template uses)",
     SBX_NUM(templates.max_store_mib)},
    {.path = "templates.max_archive_mib", .type = Type::kInt,
     .flag = "--templates-max-archive-mib", .reloadable = false, .min = 1, .max = 64 << 20,
     .why = "1 MiB to 64 TiB",
     .help = "size of one archive uploaded to POST /v1/templates:import (413 past it)",
     SBX_NUM(templates.max_archive_mib)},
    {.path = "templates.max_entries_per_layer", .type = Type::kInt,
     .flag = "--templates-max-entries-per-layer", .reloadable = false, .min = 1,
     .max = 100000000, .why = "1 to 100 million",
     .help = "files, directories and links in one layer; a layer with more fails its import",
     SBX_NUM(templates.max_entries_per_layer)},
    {.path = "templates.registry_auth_file", .type = Type::kString,
     .flag = "--templates-registry-auth-file", .reloadable = false,
     .help = "JSON file of registry credentials in Docker's config.json form "
             "({\"auths\": {\"HOST[:PORT]\": {\"auth\": base64(user:pass)} or {\"username\", "
             "\"password\"}}}), read at start-up; used for basic and token auth, never sent into "
             "a sandbox; empty: anonymous pulls",
     SBX_STR(templates.registry_auth_file)},
    {.path = "templates.registry_insecure", .type = Type::kString,
     .flag = "--templates-registry-insecure", .reloadable = false,
     .help = "comma-separated HOST[:PORT] of registries reached over plain http or TLS without "
             "verification (labs only)",
     SBX_STR(templates.registry_insecure)},
    {.path = "templates.registry_ca_file", .type = Type::kString,
     .flag = "--templates-registry-ca-file", .reloadable = false,
     .help = "PEM bundle of extra CAs that registry certificates are verified against",
     SBX_STR(templates.registry_ca_file)},
    {.path = "templates.registry_proxy", .type = Type::kString,
     .flag = "--templates-registry-proxy", .reloadable = false,
     .help = "HTTP proxy for registry pulls (http://HOST:PORT); empty: direct (the *_proxy "
             "variables of sbxd's environment are ignored)",
     SBX_STR(templates.registry_proxy)},
    {.path = "templates.registry_no_proxy", .type = Type::kString,
     .flag = "--templates-registry-no-proxy", .reloadable = false,
     .help = "comma-separated hosts reached without templates.registry_proxy",
     SBX_STR(templates.registry_no_proxy)},
    {.path = "templates.registry_parallel_layers", .type = Type::kInt,
     .flag = "--templates-registry-parallel-layers", .reloadable = false, .min = 1, .max = 16,
     .why = "1 to 16", .help = "layers of one pull fetched at once",
     SBX_NUM(templates.registry_parallel_layers)},
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

}  // namespace

namespace config_internal {

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
    std::set<std::string> t = {kWarmPool, kEgressProfiles};
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

std::vector<std::string> AllPaths() {
  std::vector<std::string> out(Tables().begin(), Tables().end());
  for (const auto& k : kKeys) out.push_back(k.path);
  return out;
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

}  // namespace config_internal

const std::vector<KeyInfo>& Keys() { return kKeys; }

const KeyInfo* FindKey(std::string_view path) {
  for (const auto& k : kKeys) {
    if (path == k.path) return &k;
  }
  return nullptr;
}

std::string EnvName(std::string_view path) { return "SBX_" + config_internal::Upper(path); }

}  // namespace sbx::daemon

// sbxd's configuration: built-in defaults, overridden by one TOML file, overridden by SBX_*
// environment variables, overridden by command-line flags. docs/config.md is the operator's
// reference; config_test checks that it and deploy/sbxd.toml name every key.
//
// Every setting is one key in the table in config_keys.cc (its TOML path, flag, type, range,
// whether a reload applies it): adding a setting is a field in Config plus one row there. The
// environment name derives from the path (EnvName); the three sources share one parser per type
// and one Validate(), so a value is checked the same way wherever it came from.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/ns/ns_backend.h"
#include "runtime/resources.h"
#include "service/admission.h"
#include "service/sandbox_service.h"

namespace CLI {
class App;
}

namespace sbx::daemon {

// Read when it exists and neither --config nor SBX_CONFIG names another file.
inline constexpr char kDefaultConfigFile[] = "/etc/sbx/sbxd.toml";

// Where a value came from, for messages and --print-config.
struct Origin {
  enum class Source { kDefault, kFile, kEnv, kFlag };
  Source source = Source::kDefault;
  std::string where;  // "/etc/sbx/sbxd.toml:12:8", "SBX_SERVER_LISTEN", "--listen"
  // How to name the value in a message: "--default-pids 10", "SBX_LOG_LEVEL='loud'",
  // "sandbox.defaults.pids = 10 in /etc/sbx/sbxd.toml:12:8" (never a secret's value).
  std::string label;
};

struct Config {
  struct Server {
    std::string listen = "127.0.0.1:7070";
    int64_t http_threads = 2;
    // Secret. Empty: the token in STATE_DIR/admin-token, generated there on first start.
    std::string admin_token;
    // Connection caps; 0: derived from RLIMIT_NOFILE (ResolveConnectionLimits).
    int64_t max_connections = 0;
    int64_t max_connections_per_ip = 0;
    int64_t reserved_connections = 16;
    int64_t header_timeout_s = 10;
    int64_t idle_timeout_s = 75;
    // Guest-sized agent replies ("processes", "list") held at once (service/reply_gate.h).
    int64_t guest_replies_in_flight = 8;
    int64_t guest_replies_per_sandbox = 2;
    bool operator==(const Server&) const = default;
  };
  // TLS on the API's listener (http/tls.h): both files or neither.
  struct Tls {
    std::string cert_file;
    std::string key_file;
    bool enabled() const { return !cert_file.empty(); }
    bool operator==(const Tls&) const = default;
  };
  struct State {
    std::string dir = "/var/lib/sbx";
    bool operator==(const State&) const = default;
  };
  // The database (docs/store.md): SQLite in the state dir unless url names another.
  struct Store {
    std::string url;  // "" | /abs/path | sqlite:///abs/path | postgresql://... (a secret)
    int64_t pool_size = 4;
    bool operator==(const Store&) const = default;
  };
  // This process's place in a cluster (docs/scale.md).
  struct Node {
    std::string role = "all";  // all | api | node
    std::string name;          // empty: the host name
    std::string url;           // empty: from server.listen (a wildcard address: the host name)
    int64_t heartbeat_ms = 2000;
    int64_t lost_after_ms = 30000;
    int64_t restart_grace_ms = 120000;
    bool operator==(const Node&) const = default;
  };
  struct Ns {
    bool user_namespaces = true;
    int64_t userns_pool = 4;
    int64_t netns_pool = 4;
    int64_t disk_pool = 2;
    int64_t cgroup_pool = 4;
    int64_t removal_backlog = 0;
    std::string seccomp_policy;  // empty: the policy embedded at build time
    bool cgroup_favor_dynmods = true;
    std::string cgroup_parent;  // empty: <sbxd's own cgroup>/sbx
    bool enabled = true;  // offered beside a microvm default
    // The agent's own cgroup budget; built-in values from the runtime's options.
    int64_t agent_memory_mib = runtime::ns::NsOptions{}.agent_memory_mib;
    int64_t agent_pids = runtime::ns::NsOptions{}.agent_pids;
    bool operator==(const Ns&) const = default;
  };
  // The microvm runtime (docs/microvm.md): offered beside the default one when enabled and
  // the host can run it.
  struct Microvm {
    bool enabled = true;
    std::string vmm = "qemu";     // qemu | firecracker
    std::string qemu = "qemu-system-x86_64";
    std::string firecracker = "firecracker";
    std::string jailer = "jailer";
    std::string kernel;           // empty: the newest /boot/vmlinuz-*
    std::string accel = "auto";   // auto | kvm | tcg
    int64_t boot_timeout_s = 120;
    bool operator==(const Microvm&) const = default;
  };
  struct Runtime {
    std::string default_runtime = "ns";  // key runtime.default
    std::string agent_path;              // empty: sbx-agent beside sbxd
    // Most of a delete and much of a create is waiting (for a killed sandbox's exit, for the
    // agent's first answer), not CPU: with 4, 8 clients looping create/exec/delete kept all 4
    // busy (3.98 worker-seconds per second) while the CPU had room.
    int64_t workers = 16;
    Ns ns;
    Microvm microvm;
    bool operator==(const Runtime&) const = default;
  };
  // Server-side timers of new sandboxes (keys sandbox.defaults.timeout_s and idle_suspend_s).
  struct SandboxTimers {
    // TTL when a create has none (0: no TTL); idle suspension likewise (0: never).
    int64_t timeout_s = service::TimerSettings{}.default_timeout_s;
    int64_t idle_suspend_s = service::TimerSettings{}.default_idle_suspend_s;
    bool operator==(const SandboxTimers&) const = default;
  };
  struct Sandbox {
    // Applied where a create omits a resource (pids, open_files, tmp_mib and shm_mib are not
    // requestable), and what a create may ask for. Their built-in values are resources.h's.
    runtime::Resources defaults;
    runtime::ResourceLimits limits;
    SandboxTimers timers;
    bool operator==(const Sandbox&) const = default;
  };
  // Admission control: creates are refused once what sandboxes hold reaches host x overcommit -
  // reserve. The service's own settings (service/admission.h), whose built-in values these are.
  using Admission = service::AdmissionSettings;
  struct Sessions {
    int64_t output_buffer_bytes = service::ServiceOptions{}.output_buffer_bytes;
    int64_t attach_token_ttl_s = service::ServiceOptions{}.attach_token_ttl.count();
    bool operator==(const Sessions&) const = default;
  };
  struct Retention {
    int64_t idempotency_keys_s = service::TimerSettings{}.idempotency_retention.count();
    int64_t deleted_sandboxes_s = service::TimerSettings{}.deleted_retention.count();
    bool operator==(const Retention&) const = default;
  };
  struct Metrics {
    bool public_endpoint = false;  // key metrics.public: /metrics without the admin token
    bool operator==(const Metrics&) const = default;
  };
  // Tenants' management tokens (service/tenancy.h, docs/tenancy.md).
  struct Tenancy {
    int64_t rate_limit_rps = 0;    // per token of a tenant without its own rate_limit; 0: none
    int64_t rate_limit_burst = 0;  // 0: the rate, at least 1
    int64_t max_token_ttl_s = 0;   // longest expires_in_s a new token may ask for; 0: no bound
    bool operator==(const Tenancy&) const = default;
  };
  // Port exposure (api/port_routes.cc, docs/api.md "Ports").
  struct Ports {
    std::string domain;  // host-name routing {port}-{id}.{domain}; empty: path form only
    int64_t connect_timeout_ms = 5000;
    int64_t idle_timeout_s = 600;
    bool operator==(const Ports&) const = default;
  };
  // Sandbox networking (src/net, docs/isolation.md §2.3b). Off: only `none`, and sbxd touches
  // neither forwarding nor nftables, as before networking existed.
  struct Egress {
    bool enabled = false;
    std::string pool_v4 = "10.233.0.0/16";      // AddrPool: a /30 per sandbox
    std::string pool_v6 = "fd5b:5bd0:0:1::/64"; // and a /126
    std::string uplink;  // masquerade toward it; empty: every interface
    std::string exempt;  // comma-separated CIDRs lifted from the always-blocked ranges
    std::string deny;    // comma-separated CIDRs refused whatever the profile
    // sbxd's resolver (net/dns_server.h): the port it takes on every address (nft redirects
    // the sandboxes' port 53 to it), and its upstreams ("ip[:port]", comma-separated; empty:
    // the nameservers of the host's /etc/resolv.conf).
    int64_t dns_port = 10053;
    std::string dns_upstream;
    // sbxd's Host/SNI proxy for domain rules (net/conn_proxy.h): its port on the veths' host
    // ends, and how long a relayed connection may stay idle.
    int64_t proxy_port = 10080;
    int64_t proxy_idle_timeout_s = 600;
    int64_t max_connections = 1024;  // conntrack entries per sandbox at once; 0: no limit
    int64_t rate_mbit = 0;           // bandwidth per sandbox each way; 0: no limit
    // Network-ready warm-pool members per template pool (service/warm_pool.h); 0: none.
    int64_t warm_pool = 2;
    // egress.profiles.<name> tables of the file: {"NAME": {"description", "allow", "deny"}},
    // as ProfileCatalog::FromJson reads them (file only: no flag or variable holds a table).
    nlohmann::json profiles = nlohmann::json::object();
    bool operator==(const Egress&) const = default;
  };
  // Templates users bring (service/template_service.h, docs/templates.md).
  struct Templates {
    int64_t max_image_mib = 16384;    // unpacked bytes of one image's layers
    int64_t max_store_mib = 0;        // the whole layer store; 0: only the disk bounds it
    int64_t max_archive_mib = 32768;  // one uploaded archive
    int64_t max_entries_per_layer = 1000000;
    // Registry pulls: credentials ({"auths": {"HOST[:PORT]": {"username", "password"} or
    // {"auth": base64("user:pass")}}}, Docker's config.json form), hosts reached by plain http
    // or unverified TLS, an extra CA bundle, a proxy, and layers fetched at once.
    std::string registry_auth_file;
    std::string registry_insecure;  // comma-separated HOST[:PORT]
    std::string registry_ca_file;
    std::string registry_proxy;
    std::string registry_no_proxy;
    int64_t registry_parallel_layers = 3;
    bool operator==(const Templates&) const = default;
  };
  struct Log {
    std::string level = "info";
    std::string format = "auto";  // json, text, auto (text on a terminal)
    std::string file;             // empty: stderr
    bool operator==(const Log&) const = default;
  };

  Server server;
  Tls tls;
  State state;
  Store store;
  Node node;
  Runtime runtime;
  Sandbox sandbox;
  Admission admission;
  Sessions sessions;
  Retention retention;
  Metrics metrics;
  Tenancy tenancy;
  Ports ports;
  // The E2B-compatible API (docs/e2b.md).
  struct E2b {
    // What E2B answers say as a sandbox's `domain`, for SDKs that build host names
    // {port}-{id}.{domain} (with :port when sbxd's listener is not on 443); empty: ports.domain.
    std::string domain;
    bool operator==(const E2b&) const = default;
  };
  E2b e2b;
  // Template name -> sandboxes kept ready on the default runtime. Each entry is its own key
  // (warm_pool.<template>): layers override entries, not the whole table.
  std::map<std::string, int64_t> warm_pool = {{"base", 2}};
  Egress egress;
  Templates templates;
  Log log;

  // Key path -> where its value came from; absent: the built-in default.
  std::map<std::string, Origin> origins;

  // Equal settings, wherever they came from.
  bool SameSettings(const Config& o) const {
    return server == o.server && tls == o.tls && state == o.state && store == o.store && node == o.node && runtime == o.runtime &&
           sandbox == o.sandbox && admission == o.admission && sessions == o.sessions && retention == o.retention && metrics == o.metrics && ports == o.ports && e2b == o.e2b &&
           warm_pool == o.warm_pool && egress == o.egress && templates == o.templates &&
           log == o.log && tenancy == o.tenancy;
  }
};

// One setting. Every key has a flag; the environment name is EnvName(path).
struct KeyInfo {
  enum class Type { kString, kInt, kBool };
  const char* path = "";  // "sandbox.defaults.memory_mib"
  Type type = Type::kString;
  const char* flag = "";      // "--default-memory-mib"
  bool reloadable = false;    // a SIGHUP applies it; otherwise a change waits for a restart
  bool secret = false;        // never printed or logged
  int64_t min = 0, max = 0;   // kInt: the accepted range
  const char* why = "";       // kInt: why that range, shown with a range error
  const char* choices = "";   // kString: "ns|fake" when only these are valid, else ""
  const char* help = "";
  // The field in a Config (exactly one is set, by type).
  std::string* (*str)(Config&) = nullptr;
  int64_t* (*num)(Config&) = nullptr;
  bool* (*boolean)(Config&) = nullptr;
};

// Every key but the warm_pool.<template> entries, in --print-config order.
const std::vector<KeyInfo>& Keys();
const KeyInfo* FindKey(std::string_view path);
// "sandbox.defaults.memory_mib" -> "SBX_SANDBOX_DEFAULTS_MEMORY_MIB". A warm pool entry is
// SBX_WARM_POOL_<TEMPLATE> (the template name upper-cased).
std::string EnvName(std::string_view path);
// Variables read besides the keys': SBX_CONFIG (the file) and SBX_ADMIN_TOKEN (an alias of
// SBX_SERVER_ADMIN_TOKEN, kept from before the configuration file).
inline constexpr char kConfigEnv[] = "SBX_CONFIG";
inline constexpr char kAdminTokenAliasEnv[] = "SBX_ADMIN_TOKEN";

// The command line as given, before it is applied over the file and the environment.
struct CommandLine {
  std::optional<std::string> config_file;  // --config FILE ("" reads no file)
  bool print_config = false;               // --print-config
  std::vector<std::pair<const KeyInfo*, std::string>> values;  // key flags, as given
  std::vector<std::string> warm_pools;                          // --warm-pool TEMPLATE=N
};
// Registers --config, --print-config and every key's flag on `app`; parsing fills `cl`.
void AddFlags(CLI::App& app, CommandLine& cl);

// The layers, for Load and for tests. Each reports every problem it finds, joined by "; ".
absl::Status ApplyToml(Config& c, std::string_view text, const std::string& file_name);
// `env`: "NAME=VALUE" entries (environ). A variable is a configuration override when its name
// starts with SBX_ and a table's name (SBX_SERVER_, SBX_TLS_, SBX_STATE_, SBX_RUNTIME_,
// SBX_SANDBOX_, SBX_ADMISSION_, SBX_SESSIONS_, SBX_WARM_POOL_, SBX_LOG_): it must then name a
// key. Other SBX_ variables (SBX_TOKEN, SBX_CACERT, SBX_TESTS_MUST_RUN, ...) belong to other
// tools and are ignored.
absl::Status ApplyEnv(Config& c, const std::vector<std::string>& env);
absl::Status ApplyFlags(Config& c, const CommandLine& cl);
// Ranges, choices, HOST:PORT and the relations between keys (defaults within limits).
absl::Status Validate(const Config& c);
// server.listen -> host (brackets of an IPv6 literal removed) and port.
absl::StatusOr<std::pair<std::string, uint16_t>> SplitListen(const std::string& listen);

// The HTTP server's connection caps for a process whose RLIMIT_NOFILE (soft) is
// `open_files`: server.max_connections and server.max_connections_per_ip as set, or derived
// when 0 (max: a quarter of the limit, at most 4096; per address: a quarter of max). Each
// connection may hold a second descriptor (its agent socket) and the reserve holds spares, so
// the caps and the reserve together must fit in half the limit; what does not is an error
// naming the keys and the limit.
struct ConnectionLimits {
  size_t max_connections = 0;
  size_t max_connections_per_ip = 0;
  size_t reserved_connections = 0;
};
absl::StatusOr<ConnectionLimits> ResolveConnectionLimits(const Config& c, uint64_t open_files);

struct Loaded {
  Config config;
  std::string file;                   // the file read; empty: none
  std::vector<std::string> warnings;  // to log (e.g. a readable file holding the admin token)
};
// Picks the file (--config, else $SBX_CONFIG, else kDefaultConfigFile if it exists), applies
// the layers in order and validates the result. `default_file` is a parameter for tests.
absl::StatusOr<Loaded> Load(const CommandLine& cl, const std::vector<std::string>& env,
                            const std::string& default_file = kDefaultConfigFile);

// The configuration as TOML that Load reads back, every key present, with where each value
// came from as a comment. Secrets print as "<redacted>" unless `redact` is false (tests).
std::string ToToml(const Config& c, bool redact = true);
// A key's value as TOML ("<redacted>" for a set secret); also "warm_pool.<template>".
std::string ShowValue(const Config& c, const std::string& path);
// How a message names a key's value and where it came from, e.g. "--seccomp-policy '/x.json'"
// or "warm_pool.python = 2 in /etc/sbx/sbxd.toml:9:10" (never a secret's value).
std::string Describe(const Config& c, const std::string& path);

// What a reload applies: `loaded` for the reloadable keys, `running` for the rest.
struct ReloadPlan {
  struct Change {
    std::string key, from, to;  // values as ShowValue prints them
  };
  Config config;
  std::vector<Change> applied;        // reloadable keys that changed
  std::vector<Change> needs_restart;  // other keys that changed; kept as running
};
ReloadPlan PlanReload(const Config& running, const Config& loaded);

}  // namespace sbx::daemon

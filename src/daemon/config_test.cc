#include "daemon/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/requests.h"
#include "runtime/backend.h"

namespace sbx::daemon {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using Type = KeyInfo::Type;

std::string Leaf(const std::string& path) { return path.substr(path.rfind('.') + 1); }
std::string Table(const std::string& path) { return path.substr(0, path.rfind('.')); }

// A valid value other than the default, as text for a flag or a variable and as TOML.
struct Other {
  std::string text, toml;
};
Other OtherValue(const KeyInfo& k) {
  Config d;
  switch (k.type) {
    case Type::kString: {
      std::string v = std::string("/x/") + k.path;
      if (*k.choices) {
        std::string choices = k.choices;
        std::string first = choices.substr(0, choices.find('|'));
        std::string second = choices.substr(first.size() + 1);
        second = second.substr(0, second.find('|'));
        v = *k.str(d) == first ? second : first;
      }
      if (std::string(k.path) == "server.listen") v = "[::1]:7171";
      return {v, fmt::format("\"{}\"", v)};
    }
    case Type::kInt: {
      int64_t v = *k.num(d) == k.max ? k.min : k.max;
      return {std::to_string(v), std::to_string(v)};
    }
    case Type::kBool: {
      bool v = !*k.boolean(d);
      return {v ? "true" : "false", v ? "true" : "false"};
    }
  }
  return {};
}

std::string Get(Config& c, const KeyInfo& k) {
  switch (k.type) {
    case Type::kString: return *k.str(c);
    case Type::kInt: return std::to_string(*k.num(c));
    case Type::kBool: return *k.boolean(c) ? "true" : "false";
  }
  return "";
}

// Parses argv (without the program name) through AddFlags, as sbxd does.
absl::StatusOr<CommandLine> ParseArgs(std::vector<std::string> args) {
  CommandLine cl;
  CLI::App app{"test"};
  AddFlags(app, cl);
  // parse(vector) takes the arguments without the program name, last first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return cl;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sbx-config-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string Write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    std::string p = (path_ / name).string();
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Config, DefaultsAreTheLibrariesDefaults) {
  Config c;
  runtime::Resources r;
  EXPECT_EQ(c.sandbox.defaults.vcpu, r.vcpu);
  EXPECT_EQ(c.sandbox.defaults.memory_mib, r.memory_mib);
  EXPECT_EQ(c.sandbox.defaults.disk_mib, r.disk_mib);
  EXPECT_EQ(c.sandbox.defaults.pids, r.pids);
  EXPECT_EQ(c.sandbox.defaults.open_files, r.open_files);
  EXPECT_EQ(c.sandbox.defaults.tmp_mib, r.tmp_mib);
  EXPECT_EQ(c.sandbox.defaults.shm_mib, r.shm_mib);
  api::ResourceLimits l;
  EXPECT_EQ(c.sandbox.limits.max_vcpu, l.max_vcpu);
  EXPECT_EQ(c.sandbox.limits.min_memory_mib, l.min_memory_mib);
  EXPECT_EQ(c.sandbox.limits.max_memory_mib, l.max_memory_mib);
  EXPECT_EQ(c.sandbox.limits.min_disk_mib, l.min_disk_mib);
  EXPECT_EQ(c.sandbox.limits.max_disk_mib, l.max_disk_mib);
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(Config, EveryKeyHasAUniqueFlagAndEnvNameAndOneField) {
  std::set<std::string> flags, envs;
  for (const auto& k : Keys()) {
    EXPECT_TRUE(flags.insert(k.flag).second) << k.flag;
    EXPECT_TRUE(envs.insert(EnvName(k.path)).second) << k.path;
    int fields = (k.str != nullptr) + (k.num != nullptr) + (k.boolean != nullptr);
    EXPECT_EQ(fields, 1) << k.path;
    EXPECT_EQ(k.str != nullptr, k.type == Type::kString) << k.path;
    EXPECT_EQ(k.num != nullptr, k.type == Type::kInt) << k.path;
    if (k.type == Type::kInt) {
      Config d;
      EXPECT_LE(k.min, *k.num(d)) << k.path;
      EXPECT_GE(k.max, *k.num(d)) << k.path;
    }
  }
  EXPECT_EQ(EnvName("sandbox.defaults.memory_mib"), "SBX_SANDBOX_DEFAULTS_MEMORY_MIB");
  EXPECT_EQ(EnvName("runtime.ns.userns_pool"), "SBX_RUNTIME_NS_USERNS_POOL");
}

TEST(Config, EveryKeyRoundTripsFromTheFile) {
  for (const auto& k : Keys()) {
    Other v = OtherValue(k);
    Config c;
    std::string text = fmt::format("# a comment\n[{}]\n{} = {}\n", Table(k.path), Leaf(k.path), v.toml);
    ASSERT_TRUE(ApplyToml(c, text, "/etc/sbx/sbxd.toml").ok()) << text;
    EXPECT_EQ(Get(c, k), v.text) << k.path;
    ASSERT_TRUE(c.origins.count(k.path)) << k.path;
    EXPECT_EQ(c.origins[k.path].source, Origin::Source::kFile);
    EXPECT_EQ(c.origins[k.path].where, "/etc/sbx/sbxd.toml:3:" + std::to_string(Leaf(k.path).size() + 4));
  }
}

TEST(Config, EveryKeyRoundTripsFromTheEnvironment) {
  for (const auto& k : Keys()) {
    Other v = OtherValue(k);
    Config c;
    ASSERT_TRUE(ApplyEnv(c, {EnvName(k.path) + "=" + v.text}).ok()) << k.path;
    EXPECT_EQ(Get(c, k), v.text) << k.path;
    EXPECT_EQ(c.origins[k.path].where, EnvName(k.path));
  }
}

TEST(Config, EveryKeyRoundTripsFromItsFlag) {
  for (const auto& k : Keys()) {
    Other v = OtherValue(k);
    auto cl = ParseArgs({k.flag, v.text});
    ASSERT_TRUE(cl.ok()) << k.flag << ": " << cl.status();
    Config c;
    ASSERT_TRUE(ApplyFlags(c, *cl).ok()) << k.flag;
    EXPECT_EQ(Get(c, k), v.text) << k.path;
    EXPECT_EQ(c.origins[k.path].where, k.flag);
  }
}

TEST(Config, EveryKeyRoundTripsThroughPrintConfig) {
  // Every key at a non-default value (the limits stay consistent: each is at its max or min).
  Config c;
  for (const auto& k : Keys()) {
    ASSERT_TRUE(ApplyEnv(c, {EnvName(k.path) + "=" + OtherValue(k).text}).ok()) << k.path;
  }
  c.warm_pool["python-3"] = 5;
  c.warm_pool["odd name"] = 1;
  std::string text = ToToml(c, /*redact=*/false);
  Config back;
  ASSERT_TRUE(ApplyToml(back, text, "printed.toml").ok()) << text;
  EXPECT_TRUE(back.SameSettings(c)) << text;
}

TEST(Config, PrecedenceIsDefaultThenFileThenEnvThenFlag) {
  TempDir dir;
  std::string file = dir.Write("sbxd.toml",
                               "[server]\nlisten = \"127.0.0.1:1\"\nhttp_threads = 3\n"
                               "[runtime]\nworkers = 5\n"
                               "[warm_pool]\nbase = 4\npython = 1\n");
  auto cl = ParseArgs({"--config", file, "--listen", "127.0.0.1:3", "--warm-pool", "python=7"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  auto loaded = Load(*cl,
                     {"SBX_SERVER_LISTEN=127.0.0.1:2", "SBX_SERVER_HTTP_THREADS=4",
                      "SBX_WARM_POOL_BASE=6", "PATH=/bin"},
                     "/nonexistent/sbxd.toml");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Config& c = loaded->config;
  EXPECT_EQ(loaded->file, file);
  EXPECT_EQ(c.server.listen, "127.0.0.1:3");        // flag over env over file
  EXPECT_EQ(c.server.http_threads, 4);              // env over file
  EXPECT_EQ(c.runtime.workers, 5);                  // file over default
  EXPECT_EQ(c.state.dir, "/var/lib/sbx");           // default
  EXPECT_EQ(c.warm_pool.at("base"), 6);             // env over file, per entry
  EXPECT_EQ(c.warm_pool.at("python"), 7);           // flag over file
  EXPECT_EQ(c.origins.at("server.listen").where, "--listen");
  EXPECT_EQ(c.origins.at("server.http_threads").where, "SBX_SERVER_HTTP_THREADS");
  EXPECT_EQ(c.origins.at("runtime.workers").where, file + ":5:11");
  EXPECT_FALSE(c.origins.count("state.dir"));
}

TEST(Config, WarmPoolEntriesMergeAcrossLayers) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[warm_pool]\npython = 3\n\"my.tmpl\" = 1\n", "f.toml").ok());
  EXPECT_EQ(c.warm_pool, (std::map<std::string, int64_t>{{"base", 2}, {"my.tmpl", 1}, {"python", 3}}));
  ASSERT_TRUE(ApplyEnv(c, {"SBX_WARM_POOL_BASE=0", "SBX_WARM_POOL_RUBY=2"}).ok());
  EXPECT_EQ(c.warm_pool.at("base"), 0);
  EXPECT_EQ(c.warm_pool.at("ruby"), 2);
  auto cl = ParseArgs({"--warm-pool", "python=9", "--warm-pool", "go=0"});
  ASSERT_TRUE(cl.ok());
  ASSERT_TRUE(ApplyFlags(c, *cl).ok());
  EXPECT_EQ(c.warm_pool.at("python"), 9);
  EXPECT_EQ(c.warm_pool.at("go"), 0);
  EXPECT_EQ(c.origins.at("warm_pool.python").label, "--warm-pool 'python=9'");
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(Config, BadWarmPoolFlagsKeepTheirMessage) {
  for (std::string spec : {"base=x", "base=257", "=2", "base", "base=-1", "base=2x"}) {
    auto cl = ParseArgs({"--warm-pool", spec});
    ASSERT_TRUE(cl.ok());
    Config c;
    absl::Status st = ApplyFlags(c, *cl);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr(fmt::format("--warm-pool '{}': expected TEMPLATE=N with N from 0 to 256",
                                      spec)));
  }
}

TEST(Config, BadWarmPoolValuesInTheFileAndEnvironment) {
  Config c;
  absl::Status st = ApplyToml(c, "[warm_pool]\nbase = \"two\"\n", "f.toml");
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("warm_pool.base in f.toml:2:8: expected an integer"));
  st = ApplyToml(c, "warm_pool = 3\n", "f.toml");
  EXPECT_THAT(std::string(st.message()), HasSubstr("warm_pool in f.toml:1:13: expected a table"));
  ASSERT_TRUE(ApplyToml(c, "[warm_pool]\nbase = 300\n", "f.toml").ok());
  EXPECT_THAT(std::string(Validate(c).message()),
              HasSubstr("warm_pool.base = 300 in f.toml:2:8: must be between 0 and 256"));
  Config e;
  st = ApplyEnv(e, {"SBX_WARM_POOL_BASE=lots"});
  EXPECT_THAT(std::string(st.message()), HasSubstr("SBX_WARM_POOL_BASE='lots': expected an integer"));
  ASSERT_TRUE(ApplyEnv(e, {"SBX_WARM_POOL_BASE=-1"}).ok());
  EXPECT_THAT(std::string(Validate(e).message()),
              HasSubstr("SBX_WARM_POOL_BASE=-1: must be between 0 and 256"));
}

TEST(Config, UnknownKeysAreRejectedWithTheirFullPath) {
  struct Case {
    std::string text, message;
  } cases[] = {
      {"[sandbox.defaults]\nmemroy_mib = 1\n",
       "unknown key 'sandbox.defaults.memroy_mib' in /etc/sbx/sbxd.toml:2:1 (did you mean "
       "'sandbox.defaults.memory_mib'?)"},
      {"bogus = 1\n", "unknown key 'bogus' in /etc/sbx/sbxd.toml:1:1"},
      {"[bogus]\nx = 1\n", "unknown key 'bogus' in /etc/sbx/sbxd.toml:1:2"},
      {"[runtime.ns]\nuserns = true\n", "unknown key 'runtime.ns.userns' in /etc/sbx/sbxd.toml:2:1"},
      {"[sandbox]\ndefaults = { pids = 100, nope = 1 }\n",
       "unknown key 'sandbox.defaults.nope' in /etc/sbx/sbxd.toml:2:26"},
      {"[server]\nlisten = \"127.0.0.1:1\"\n[server.tls]\ncert = \"x\"\n",
       "unknown key 'server.tls' in /etc/sbx/sbxd.toml:3:9"},
  };
  for (const auto& tc : cases) {
    Config c;
    absl::Status st = ApplyToml(c, tc.text, "/etc/sbx/sbxd.toml");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << tc.text;
    EXPECT_THAT(std::string(st.message()), HasSubstr(tc.message)) << tc.text;
  }
  // Every problem at once, so that one start-up names them all.
  Config c;
  absl::Status st = ApplyToml(c, "a = 1\n[log]\nlevl = \"x\"\n", "f.toml");
  EXPECT_THAT(std::string(st.message()), HasSubstr("unknown key 'a'"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("unknown key 'log.levl' in f.toml:3:1 (did you mean 'log.level'?)"));
}

TEST(Config, UnknownConfigVariablesAreRejectedOthersIgnored) {
  Config c;
  absl::Status st = ApplyEnv(c, {"SBX_SANDBOX_DEFAULTS_MEMROY_MIB=1"});
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("unknown configuration variable SBX_SANDBOX_DEFAULTS_MEMROY_MIB (did you "
                        "mean 'SBX_SANDBOX_DEFAULTS_MEMORY_MIB'?)"));
  for (std::string var : {"SBX_SERVER_LISTN", "SBX_LOG_FORMATS", "SBX_RUNTIME_NS_FOO", "SBX_STATE_DIRECTORY",
                          "SBX_SESSIONS_X", "SBX_WARM_POOL_"}) {
    EXPECT_FALSE(ApplyEnv(c, {var + "=1"}).ok()) << var;
  }
  // Variables of the tests, the CLI, the agent and the tools are not sbxd's.
  Config d;
  ASSERT_TRUE(ApplyEnv(d, {"SBX_TESTS_MUST_RUN=1", "SBX_TOKEN=t", "SBX_URL=http://x", "SBX_E2E_RUNTIME=fake",
                           "SBX_BUILD_DIR=b", "SBX_LISTEN=1.2.3.4:5", "SBX_AGENT_SECRET=s",
                           "SBX_SKIP_INSTALL=1", "SBX_BENCH_WARM_POOL=base=1", "SBX_CONFIG=/x",
                           "SBX_SECURITY_TIMEOUT_S=1", "NOT_SBX=1", "SBX_=1"})
                  .ok());
  EXPECT_TRUE(d.SameSettings(Config{}));
}

TEST(Config, AdminTokenAliasAndItsConflict) {
  Config c;
  ASSERT_TRUE(ApplyEnv(c, {"SBX_ADMIN_TOKEN=tok"}).ok());
  EXPECT_EQ(c.server.admin_token, "tok");
  EXPECT_EQ(c.origins["server.admin_token"].where, "SBX_ADMIN_TOKEN");
  Config empty;
  ASSERT_TRUE(ApplyEnv(empty, {"SBX_ADMIN_TOKEN="}).ok());
  EXPECT_EQ(empty.server.admin_token, "");
  Config same;
  ASSERT_TRUE(ApplyEnv(same, {"SBX_ADMIN_TOKEN=a", "SBX_SERVER_ADMIN_TOKEN=a"}).ok());
  EXPECT_EQ(same.server.admin_token, "a");
  Config both;
  absl::Status st = ApplyEnv(both, {"SBX_ADMIN_TOKEN=a", "SBX_SERVER_ADMIN_TOKEN=b"});
  EXPECT_THAT(std::string(st.message()), HasSubstr("SBX_ADMIN_TOKEN and SBX_SERVER_ADMIN_TOKEN"));
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr("=a")));
}

TEST(Config, WrongTypesNameTheKeyAndWhatWasExpected) {
  struct Case {
    std::string text, message;
  } cases[] = {
      {"[sandbox.defaults]\npids = \"many\"\n",
       "sandbox.defaults.pids in f.toml:2:8: expected an integer, got a string"},
      {"[sandbox.defaults]\npids = 1.5\n",
       "sandbox.defaults.pids in f.toml:2:8: expected an integer, got a floating-point number"},
      {"[server]\nlisten = 7070\n", "server.listen in f.toml:2:10: expected a string, got an integer"},
      {"[runtime.ns]\nuser_namespaces = \"yes\"\n",
       "runtime.ns.user_namespaces in f.toml:2:19: expected a boolean (true or false), got a string"},
      {"sandbox = 3\n", "sandbox in f.toml:1:11: expected a table, got an integer"},
      {"[[server]]\nlisten = \"x\"\n", "server in f.toml:1:1: expected a table, got an array"},
      {"[log]\nlevel = [\"info\"]\n", "log.level in f.toml:2:9: expected a string, got an array"},
  };
  for (const auto& tc : cases) {
    Config c;
    EXPECT_THAT(std::string(ApplyToml(c, tc.text, "f.toml").message()), HasSubstr(tc.message))
        << tc.text;
  }
  Config c;
  EXPECT_THAT(std::string(ApplyEnv(c, {"SBX_RUNTIME_NS_USER_NAMESPACES=maybe"}).message()),
              HasSubstr("SBX_RUNTIME_NS_USER_NAMESPACES='maybe': expected a boolean (true or "
                        "false) (runtime.ns.user_namespaces)"));
  EXPECT_THAT(std::string(ApplyEnv(c, {"SBX_SANDBOX_DEFAULTS_PIDS=12k"}).message()),
              HasSubstr("SBX_SANDBOX_DEFAULTS_PIDS='12k': expected an integer"));
  auto cl = ParseArgs({"--tmp-mib", "lots"});
  ASSERT_TRUE(cl.ok());
  EXPECT_THAT(std::string(ApplyFlags(c, *cl).message()),
              HasSubstr("--tmp-mib 'lots': expected an integer (sandbox.defaults.tmp_mib)"));
  // Booleans written as the old flags took them.
  for (std::string v : {"false", "0", "no", "off", "FALSE"}) {
    Config b;
    ASSERT_TRUE(ApplyEnv(b, {"SBX_RUNTIME_NS_USER_NAMESPACES=" + v}).ok()) << v;
    EXPECT_FALSE(b.runtime.ns.user_namespaces) << v;
  }
}

TEST(Config, OutOfRangeValuesNameTheSourceAndTheRange) {
  Config f;
  ASSERT_TRUE(ApplyToml(f, "[sandbox.defaults]\npids = 10\n", "/etc/sbx/sbxd.toml").ok());
  EXPECT_THAT(std::string(Validate(f).message()),
              HasSubstr("sandbox.defaults.pids = 10 in /etc/sbx/sbxd.toml:2:8: must be between 16 "
                        "and 4194304"));
  Config e;
  ASSERT_TRUE(ApplyEnv(e, {"SBX_RUNTIME_WORKERS=0"}).ok());
  EXPECT_THAT(std::string(Validate(e).message()),
              HasSubstr("SBX_RUNTIME_WORKERS=0: must be between 1 and 64"));
  // The flags keep the messages they always had.
  auto cl = ParseArgs({"--default-open-files", "3", "--shm-mib", "-1", "--runtime", "vm",
                       "--listen", "localhost", "--log-level", "loud"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  Config g;
  ASSERT_TRUE(ApplyFlags(g, *cl).ok());
  std::string msg(Validate(g).message());
  EXPECT_THAT(msg, HasSubstr("--default-open-files 3: must be between 64 and 1048576"));
  EXPECT_THAT(msg, HasSubstr("--shm-mib -1: must be between 1 and 1048576"));
  EXPECT_THAT(msg, HasSubstr("--runtime 'vm': expected ns, microvm or fake"));
  EXPECT_THAT(msg, HasSubstr("--listen 'localhost': expected HOST:PORT"));
  EXPECT_THAT(msg, HasSubstr("--log-level 'loud': expected trace, debug, info, warn or error"));
  Config p;
  ASSERT_TRUE(ApplyEnv(p, {"SBX_SERVER_LISTEN=127.0.0.1:70000"}).ok());
  EXPECT_THAT(std::string(Validate(p).message()),
              HasSubstr("SBX_SERVER_LISTEN='127.0.0.1:70000': bad port"));
  Config s;
  ASSERT_TRUE(ApplyEnv(s, {"SBX_STATE_DIR="}).ok());
  EXPECT_THAT(std::string(Validate(s).message()), HasSubstr("SBX_STATE_DIR='': must not be empty"));
}

TEST(Config, TlsNeedsBothFilesOrNeither) {
  Config c;
  EXPECT_TRUE(Validate(c).ok());
  ASSERT_TRUE(ApplyEnv(c, {"SBX_TLS_CERT_FILE=/etc/sbx/tls.pem"}).ok());
  EXPECT_THAT(std::string(Validate(c).message()),
              HasSubstr("SBX_TLS_CERT_FILE='/etc/sbx/tls.pem': tls.key_file must be set too"));
  ASSERT_TRUE(ApplyToml(c, "[tls]\nkey_file = \"/etc/sbx/tls.key\"\n", "f.toml").ok());
  EXPECT_TRUE(Validate(c).ok());
  EXPECT_TRUE(c.tls.enabled());
  Config k;
  ASSERT_TRUE(ApplyToml(k, "[tls]\nkey_file = \"/etc/sbx/tls.key\"\n", "f.toml").ok());
  EXPECT_THAT(std::string(Validate(k).message()), HasSubstr("tls.cert_file must be set too"));
}

TEST(Config, DefaultsMustLieWithinTheLimits) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[sandbox.limits]\nmax_memory_mib = 256\n", "f.toml").ok());
  EXPECT_THAT(std::string(Validate(c).message()),
              HasSubstr("sandbox.defaults.memory_mib = 512 (built-in default): must be within "
                        "sandbox.limits.min_memory_mib = 32 (built-in default) and "
                        "sandbox.limits.max_memory_mib = 256 in f.toml:2:18"));
  ASSERT_TRUE(ApplyToml(c, "[sandbox.defaults]\nmemory_mib = 256\n", "f.toml").ok());
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);

  Config d;
  ASSERT_TRUE(ApplyEnv(d, {"SBX_SANDBOX_LIMITS_MIN_DISK_MIB=2048", "SBX_SANDBOX_LIMITS_MAX_DISK_MIB=1024"}).ok());
  EXPECT_THAT(std::string(Validate(d).message()),
              HasSubstr("SBX_SANDBOX_LIMITS_MIN_DISK_MIB=2048 is above SBX_SANDBOX_LIMITS_MAX_DISK_MIB=1024"));
  Config v;
  ASSERT_TRUE(ApplyEnv(v, {"SBX_SANDBOX_DEFAULTS_VCPU=8", "SBX_SANDBOX_LIMITS_MAX_VCPU=4"}).ok());
  EXPECT_THAT(std::string(Validate(v).message()),
              HasSubstr("SBX_SANDBOX_DEFAULTS_VCPU=8: must not be above SBX_SANDBOX_LIMITS_MAX_VCPU=4"));
}

TEST(Config, ParseErrorsGiveFileLineAndColumn) {
  Config c;
  absl::Status st = ApplyToml(c, "[server]\nlisten = \"127.0.0.1:1\"\nhttp_threads = = 2\n", "bad.toml");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("bad.toml:3:"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("TOML parse error"));
  st = ApplyToml(c, "[server\n", "bad.toml");
  EXPECT_THAT(std::string(st.message()), HasSubstr("bad.toml:1:"));
  st = ApplyToml(c, "[log]\nlevel = \"info\"\n[log]\nlevel = \"debug\"\n", "dup.toml");
  EXPECT_THAT(std::string(st.message()), HasSubstr("dup.toml:3:"));
}

TEST(Config, PrintConfigRedactsTheTokenAndNamesOrigins) {
  auto cl = ParseArgs({"--admin-token", "s3cret-token", "--listen", "127.0.0.1:0"});
  ASSERT_TRUE(cl.ok());
  auto loaded = Load(*cl, {"SBX_LOG_LEVEL=debug"}, "/nonexistent");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::string out = ToToml(loaded->config);
  EXPECT_THAT(out, Not(HasSubstr("s3cret-token")));
  EXPECT_THAT(out, HasSubstr("admin_token = \"<redacted>\"  # --admin-token\n"));
  EXPECT_THAT(out, HasSubstr("listen = \"127.0.0.1:0\"  # --listen\n"));
  EXPECT_THAT(out, HasSubstr("level = \"debug\"  # SBX_LOG_LEVEL\n"));
  EXPECT_THAT(out, HasSubstr("\n[sandbox.defaults]\nvcpu = 1\n"));
  EXPECT_THAT(out, HasSubstr("\npids = 512\n"));
  EXPECT_THAT(out, HasSubstr("\n[warm_pool]\nbase = 2\n"));
  // An unset token is not a secret.
  EXPECT_THAT(ToToml(Config{}), HasSubstr("admin_token = \"\"\n"));
  // Every key is printed, in its table.
  for (const auto& k : Keys()) {
    EXPECT_THAT(out, HasSubstr(fmt::format("[{}]\n", Table(k.path)))) << k.path;
    EXPECT_THAT(out, HasSubstr("\n" + Leaf(k.path) + " = ")) << k.path;
  }
  // The secret stays out of messages too.
  Config c;
  ASSERT_TRUE(ApplyEnv(c, {"SBX_SERVER_ADMIN_TOKEN=s3cret-token", "SBX_RUNTIME_WORKERS=0"}).ok());
  EXPECT_THAT(std::string(Validate(c).message()), Not(HasSubstr("s3cret")));
}

TEST(Config, LoadPicksTheFile) {
  TempDir dir;
  const std::string def = dir.Write("default.toml", "[log]\nlevel = \"warn\"\n");
  const std::string other = dir.Write("other.toml", "[log]\nlevel = \"error\"\n");
  CommandLine none;
  auto l = Load(none, {}, def);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->config.log.level, "warn");
  EXPECT_EQ(l->file, def);

  l = Load(none, {}, (dir.path() / "absent.toml").string());
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->file, "");
  EXPECT_EQ(l->config.log.level, "info");

  l = Load(none, {"SBX_CONFIG=" + other}, def);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->config.log.level, "error");

  auto cl = ParseArgs({"--config", other});
  ASSERT_TRUE(cl.ok());
  l = Load(*cl, {"SBX_CONFIG=" + def}, def);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->file, other);

  // "" reads none, not even the default.
  cl = ParseArgs({"--config", ""});
  ASSERT_TRUE(cl.ok());
  l = Load(*cl, {}, def);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->file, "");
  EXPECT_EQ(l->config.log.level, "info");

  // A file named explicitly must exist.
  cl = ParseArgs({"--config", (dir.path() / "missing.toml").string()});
  ASSERT_TRUE(cl.ok());
  l = Load(*cl, {}, def);
  EXPECT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("configuration file (from --config): read file: open(" +
                                                          (dir.path() / "missing.toml").string() + ")"));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("No such file"));

  // Errors of any layer stop the load.
  l = Load(none, {"SBX_RUNTIME_WORKERS=100"}, def);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("SBX_RUNTIME_WORKERS=100: must be between 1 and 64"));
}

TEST(Config, WarnsWhenAReadableFileHoldsTheAdminToken) {
  TempDir dir;
  const std::string open = dir.Write("open.toml", "[server]\nadmin_token = \"t\"\n", 0644);
  const std::string closed = dir.Write("closed.toml", "[server]\nadmin_token = \"t\"\n", 0600);
  CommandLine none;
  auto l = Load(none, {}, open);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->warnings.size(), 1u);
  EXPECT_THAT(l->warnings[0], HasSubstr("mode 0644"));
  l = Load(none, {}, closed);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->warnings.empty());
}

TEST(Config, ReloadAppliesLiveKeysAndKeepsTheOthers) {
  Config running;
  running.server.admin_token = "old";
  Config loaded = running;
  ASSERT_TRUE(ApplyToml(loaded,
                        "[server]\nlisten = \"0.0.0.0:1\"\nadmin_token = \"new\"\n"
                        "[runtime.ns]\nnetns_pool = 0\n"
                        "[sandbox.limits]\nmax_memory_mib = 1024\n"
                        "[sessions]\nattach_token_ttl_s = 60\n"
                        "[log]\nlevel = \"debug\"\n"
                        "[warm_pool]\nbase = 0\npython = 1\n",
                        "f.toml")
                  .ok());
  ReloadPlan plan = PlanReload(running, loaded);
  std::vector<std::string> applied, restart;
  for (const auto& ch : plan.applied) applied.push_back(ch.key);
  for (const auto& ch : plan.needs_restart) restart.push_back(ch.key);
  EXPECT_THAT(applied, ::testing::UnorderedElementsAre(
                           "sandbox.limits.max_memory_mib", "sessions.attach_token_ttl_s",
                           "log.level", "warm_pool.base", "warm_pool.python"));
  EXPECT_THAT(restart, ::testing::UnorderedElementsAre("server.listen", "server.admin_token",
                                                       "runtime.ns.netns_pool"));
  EXPECT_EQ(plan.config.server.listen, running.server.listen);
  EXPECT_FALSE(plan.config.origins.count("server.listen"));
  EXPECT_EQ(plan.config.server.admin_token, "old");
  EXPECT_EQ(plan.config.runtime.ns.netns_pool, 4);
  EXPECT_EQ(plan.config.sandbox.limits.max_memory_mib, 1024);
  EXPECT_EQ(plan.config.sessions.attach_token_ttl_s, 60);
  EXPECT_EQ(plan.config.warm_pool.at("python"), 1);
  for (const auto& ch : plan.needs_restart) {
    if (ch.key == "server.admin_token") {
      EXPECT_EQ(ch.from, "\"<redacted>\"");
      EXPECT_EQ(ch.to, "\"<redacted>\"");
    }
    if (ch.key == "server.listen") {
      EXPECT_EQ(ch.from, "\"127.0.0.1:7070\"");
      EXPECT_EQ(ch.to, "\"0.0.0.0:1\"");
    }
  }
  // A pool dropped from the file is turned off.
  Config without = running;
  without.warm_pool.clear();
  plan = PlanReload(running, without);
  ASSERT_EQ(plan.applied.size(), 1u);
  EXPECT_EQ(plan.applied[0].key, "warm_pool.base");
  EXPECT_EQ(plan.applied[0].to, "0");
  // Nothing changed, nothing to say.
  plan = PlanReload(running, running);
  EXPECT_TRUE(plan.applied.empty() && plan.needs_restart.empty());
}

TEST(Config, ConnectionLimitsDeriveFromTheFdLimit) {
  Config c;
  auto l = ResolveConnectionLimits(c, 20000);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_connections, 4096u);  // a quarter would be 5000
  EXPECT_EQ(l->max_connections_per_ip, 1024u);
  EXPECT_EQ(l->reserved_connections, 16u);
  l = ResolveConnectionLimits(c, 1024);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_connections, 256u);
  EXPECT_EQ(l->max_connections_per_ip, 64u);
  // A tiny limit still leaves the reserve inside half of it.
  l = ResolveConnectionLimits(c, 40);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_connections, 4u);
  EXPECT_EQ(l->max_connections_per_ip, 1u);
  EXPECT_FALSE(ResolveConnectionLimits(c, 30).ok());
}

TEST(Config, ANodesPerAddressLimitIsItsWholeLimit) {
  // Behind the api tier every connection comes from a replica's address.
  Config c;
  c.node.role = "node";
  auto l = ResolveConnectionLimits(c, 20000);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_connections_per_ip, l->max_connections);
  // Set explicitly, it is what the operator said.
  c.server.max_connections_per_ip = 10;
  l = ResolveConnectionLimits(c, 20000);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_connections_per_ip, 10u);
  c.node.role = "api";
  c.server.max_connections_per_ip = 0;
  l = ResolveConnectionLimits(c, 20000);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_connections_per_ip, 1024u);
}

TEST(Config, ExplicitConnectionLimitsAreCheckedAgainstTheFdLimit) {
  Config c;
  CommandLine cl;
  const KeyInfo* max = FindKey("server.max_connections");
  const KeyInfo* per_ip = FindKey("server.max_connections_per_ip");
  ASSERT_NE(max, nullptr);
  ASSERT_NE(per_ip, nullptr);
  cl.values = {{max, "9984"}};  // + 16 reserved = half of 20000
  ASSERT_TRUE(ApplyFlags(c, cl).ok());
  EXPECT_TRUE(ResolveConnectionLimits(c, 20000).ok());
  cl.values = {{max, "9995"}};
  ASSERT_TRUE(ApplyFlags(c, cl).ok());
  auto l = ResolveConnectionLimits(c, 20000);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()),
              HasSubstr("--max-connections 9995 with server.reserved_connections = 16 "
                        "(built-in default): needs 10011 of sbxd's RLIMIT_NOFILE of 20000"));
  // Per address above the derived global cap.
  Config d;
  cl.values = {{per_ip, "300"}};
  ASSERT_TRUE(ApplyFlags(d, cl).ok());
  l = ResolveConnectionLimits(d, 1024);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("--max-connections-per-ip 300"));
  // Both explicit: Validate compares them.
  cl.values = {{max, "10"}, {per_ip, "11"}};
  Config e;
  ASSERT_TRUE(ApplyFlags(e, cl).ok());
  EXPECT_THAT(std::string(Validate(e).message()),
              HasSubstr("--max-connections-per-ip 11 is above --max-connections 10"));
}

// docs/config.md and deploy/sbxd.toml are the operator's view of the table: they must not drift.
TEST(Config, EgressProfilesComeFromTheFileAndBadOnesNameTheKey) {
  Config c;
  ASSERT_TRUE(ApplyToml(c,
                        "[egress]\nenabled = true\nexempt = \"198.18.0.0/15\"\n"
                        "[egress.profiles.lab]\ndescription = \"the lab\"\n"
                        "allow = [{cidr = \"198.18.0.0/15\", ports = \"80\", protocol = \"tcp\"}]\n",
                        "/etc/sbx/sbxd.toml")
                  .ok());
  ASSERT_TRUE(Validate(c).ok()) << Validate(c);
  EXPECT_EQ(c.egress.profiles["lab"]["description"], "the lab");
  EXPECT_EQ(c.origins.at("egress.profiles.lab").where, "/etc/sbx/sbxd.toml:4:1");

  struct Case {
    std::string toml, message;
  } cases[] = {
      {"[egress]\npool_v4 = \"10.0.0.1/8\"\n", "egress.pool_v4"},
      {"[egress]\npool_v4 = \"fd00::/64\"\n", "egress.pool_v4"},
      {"[egress]\npool_v6 = \"fd00::/48\"\n", "egress.pool_v6"},
      {"[egress]\nexempt = \"198.18.0.0/15, nope\"\n", "egress.exempt"},
      {"[egress]\ndeny = \"300.1.1.1\"\n", "egress.deny"},
      {"[egress]\nuplink = \"eth0 x\"\n", "egress.uplink"},
      {"[egress.profiles.lab]\nallow = [{cidr = \"1.2.3.0/24\", ports = \"70000\"}]\n",
       "egress.profiles.lab.allow[0]"},
      {"[egress.profiles.lab]\nallow = []\n", "egress.profiles.lab.allow"},
      {"[egress.profiles.open]\nallow = [{cidr = \"1.2.3.0/24\"}]\n", "open"},
  };
  for (const auto& tc : cases) {
    Config bad;
    ASSERT_TRUE(ApplyToml(bad, tc.toml, "f.toml").ok()) << tc.toml;
    absl::Status st = Validate(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << tc.toml;
    EXPECT_THAT(std::string(st.message()), HasSubstr(tc.message)) << tc.toml;
  }
  Config not_table;
  EXPECT_THAT(std::string(ApplyToml(not_table, "[egress]\nprofiles = 1\n", "f.toml").message()),
              HasSubstr("egress.profiles in f.toml:2:12: expected a table"));
  // A reload keeps the running profiles: they wait for a restart.
  Config running, loaded = c;
  ReloadPlan plan = PlanReload(running, loaded);
  EXPECT_EQ(plan.config.egress.profiles, running.egress.profiles);
  bool listed = false;
  for (const auto& ch : plan.needs_restart) listed |= ch.key == "egress.profiles";
  EXPECT_TRUE(listed);
}

TEST(Config, DocsAndTheExampleFileCoverEveryKey) {
  const std::string docs = ReadFile(std::string(SBX_SOURCE_DIR) + "/docs/config.md");
  const std::string example = ReadFile(std::string(SBX_SOURCE_DIR) + "/deploy/sbxd.toml");
  ASSERT_FALSE(docs.empty());
  ASSERT_FALSE(example.empty());
  for (const auto& k : Keys()) {
    EXPECT_THAT(docs, HasSubstr(fmt::format("`{}`", k.path))) << k.path;
    EXPECT_THAT(docs, HasSubstr(fmt::format("`{}`", EnvName(k.path)))) << k.path;
    EXPECT_THAT(docs, HasSubstr(fmt::format("`{}", k.flag))) << k.path;
  }
  // Uncommented, the example sets every key to its default.
  std::string uncommented;
  std::istringstream in(example);
  std::set<std::string> seen;
  std::string table;
  // "#[table]" and "#key = value" are settings commented out; "# ..." is prose.
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.rfind("# ", 0) == 0 || line == "#") continue;
    if (line[0] != '#') {
      ADD_FAILURE() << "deploy/sbxd.toml sets something: " << line;
      continue;
    }
    line = line.substr(1);
    if (line.rfind("[", 0) == 0) {
      table = line.substr(1, line.find(']') - 1);
    } else {
      seen.insert(table + "." + line.substr(0, line.find(' ')));
    }
    uncommented += line + "\n";
  }
  Config c;
  ASSERT_TRUE(ApplyToml(c, uncommented, "deploy/sbxd.toml").ok()) << ApplyToml(c, uncommented, "x");
  EXPECT_TRUE(c.SameSettings(Config{})) << uncommented;
  for (const auto& k : Keys()) EXPECT_TRUE(seen.count(k.path)) << k.path << " missing";
  EXPECT_TRUE(seen.count("warm_pool.base"));
}

}  // namespace
}  // namespace sbx::daemon

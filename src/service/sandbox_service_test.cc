// SandboxService lifecycle paths (pause, suspend, wake, delete-wins, restart) on the fake
// runtime and a real SQLite store in a temp dir. No root needed.
#include "service/sandbox_service.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "common/build_info.h"
#include "common/ids.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "net/profiles.h"
#include "runtime/fake/fake_backend.h"
#include "service/sandbox_state.h"
#include "service/views.h"
#include "store/sqlite_store.h"

#ifndef SBX_AGENT_PATH
#error "SBX_AGENT_PATH must point at the sbx-agent binary"
#endif

namespace sbx::service {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// A result's JSON as the API renders it (api/render.cc), for the assertions below.
json Body(const Result& r) {
  struct {
    json operator()(const SandboxCreated& c) const {
      return {{"sandbox", SandboxView(c.sandbox)}, {"operation", OperationView(c.operation)}};
    }
    json operator()(const OperationStarted& o) const {
      return {{"operation", OperationView(o.operation)}};
    }
    json operator()(const SessionCreated& s) const {
      return {{"session_id", s.session.id}, {"sandbox_id", s.session.sandbox_id},
              {"state", s.session.state}, {"attach", {{"token", s.attach.token}}}};
    }
  } visit;
  return std::visit(visit, r);
}

template <typename T>
json Body(const Answer<T>& a) {
  if (a.replay) return json::parse(a.replay->body);
  EXPECT_TRUE(a.result.has_value());
  return a.result ? Body(Result(*a.result)) : json();
}

// An Idempotency-Key scoped to `route`; what it stores is the result's Body.
std::optional<Idempotency> Key(std::optional<std::string> key, const std::string& route) {
  if (!key) return std::nullopt;
  return Idempotency{*key, "POST", route,
                     [](const Result& r) { return Rendered{1, Body(r).dump()}; }};
}

// The fake runtime without pause support: requests must be refused before any change.
class NoPauseBackend : public runtime::Backend {
 public:
  explicit NoPauseBackend(runtime::Backend& inner) : inner_(inner) {}
  std::string Name() const override { return "nopause"; }
  runtime::Capabilities GetCapabilities() const override { return {}; }
  absl::Status Probe() override { return inner_.Probe(); }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec& s) override {
    return inner_.Create(s);
  }
  absl::StatusOr<runtime::InstancePtr> Adopt(const std::string& id, const json& p) override {
    return inner_.Adopt(id, p);
  }
  absl::Status Remove(const std::string& id) override { return inner_.Remove(id); }
  absl::Status Sweep(const std::set<std::string>&) override { return absl::OkStatus(); }

 private:
  runtime::Backend& inner_;
};

// A runtime whose creates always fail (after the service admitted them).
class FailingBackend : public NoPauseBackend {
 public:
  explicit FailingBackend(runtime::Backend& inner) : NoPauseBackend(inner) {}
  std::string Name() const override { return "failing"; }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec&) override {
    return absl::InternalError("create: the test's runtime always fails");
  }
};

// A runtime whose creates throw: a bug in a job must still finish its operation.
class ThrowingBackend : public NoPauseBackend {
 public:
  explicit ThrowingBackend(runtime::Backend& inner) : NoPauseBackend(inner) {}
  std::string Name() const override { return "throwing"; }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec&) override {
    throw std::runtime_error("basic_filebuf::underflow error reading the file: No such process");
  }
};

// The fake runtime, remembering the spec of the last create.
class RecordingBackend : public NoPauseBackend {
 public:
  explicit RecordingBackend(runtime::Backend& inner) : NoPauseBackend(inner) {}
  std::string Name() const override { return "recording"; }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec& s) override {
    {
      std::lock_guard lock(mu_);
      last_ = s;
    }
    return NoPauseBackend::Create(s);
  }
  runtime::SandboxSpec last() {
    std::lock_guard lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  runtime::SandboxSpec last_;
};

// The fake runtime, whose instances report denied-egress counts by reason that the test sets.
class EgressBackend : public NoPauseBackend {
 public:
  using Counts = std::map<std::string, uint64_t>;
  explicit EgressBackend(runtime::Backend& inner) : NoPauseBackend(inner) {}
  std::string Name() const override { return "egress"; }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec& s) override {
    SBX_ASSIGN_OR_RETURN(runtime::InstancePtr inner, NoPauseBackend::Create(s));
    return Wrap(std::move(inner));
  }
  absl::StatusOr<runtime::InstancePtr> Adopt(const std::string& id, const json& p) override {
    SBX_ASSIGN_OR_RETURN(runtime::InstancePtr inner, NoPauseBackend::Adopt(id, p));
    return Wrap(std::move(inner));
  }
  void Set(const std::string& id, const std::string& reason, uint64_t n) {
    std::lock_guard lock(mu_);
    counts_[id][reason] = n;
  }
  Counts Get(const std::string& id) {
    std::lock_guard lock(mu_);
    return counts_[id];
  }

 private:
  class Instance : public runtime::Instance {
   public:
    Instance(runtime::InstancePtr inner, EgressBackend* backend)
        : inner_(std::move(inner)), backend_(backend) {}
    const std::string& id() const override { return inner_->id(); }
    std::string AgentSocketPath() const override { return inner_->AgentSocketPath(); }
    json Persist() const override { return inner_->Persist(); }
    bool Alive() const override { return inner_->Alive(); }
    absl::Status Destroy() override { return inner_->Destroy(); }
    absl::StatusOr<Counts> DeniedEgress() const override { return backend_->Get(id()); }

   private:
    runtime::InstancePtr inner_;
    EgressBackend* backend_;
  };
  runtime::InstancePtr Wrap(runtime::InstancePtr inner) {
    return std::make_unique<Instance>(std::move(inner), this);
  }
  std::mutex mu_;
  std::map<std::string, Counts> counts_;  // by sandbox id; outlive restarts
};

// The fake runtime, whose agents the test can declare dead (as a host OOM or a kernel bug
// would end them: nothing the guest does can).
class MortalBackend : public NoPauseBackend {
 public:
  explicit MortalBackend(runtime::Backend& inner) : NoPauseBackend(inner) {}
  std::string Name() const override { return "mortal"; }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec& s) override {
    SBX_ASSIGN_OR_RETURN(runtime::InstancePtr inner, NoPauseBackend::Create(s));
    auto dead = std::make_shared<std::atomic<bool>>(false);
    {
      std::lock_guard lock(mu_);
      dead_[s.id] = dead;
    }
    return runtime::InstancePtr(std::make_unique<Instance>(std::move(inner), std::move(dead)));
  }
  void Kill(const std::string& id) {
    std::lock_guard lock(mu_);
    dead_[id]->store(true);
  }

 private:
  class Instance : public runtime::Instance {
   public:
    Instance(runtime::InstancePtr inner, std::shared_ptr<std::atomic<bool>> dead)
        : inner_(std::move(inner)), dead_(std::move(dead)) {}
    const std::string& id() const override { return inner_->id(); }
    std::string AgentSocketPath() const override { return inner_->AgentSocketPath(); }
    json Persist() const override { return inner_->Persist(); }
    bool Alive() const override { return !dead_->load(); }
    std::string DeathReason() const override { return "it was killed by SIGKILL"; }
    absl::Status Destroy() override { return inner_->Destroy(); }

   private:
    runtime::InstancePtr inner_;
    std::shared_ptr<std::atomic<bool>> dead_;
  };
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> dead_;
};

// The fake runtime with network-ready sandboxes (runtime::SandboxSpec::network_ready): it
// records what each create asked and each AttachEgress was given, and the test can make
// AttachEgress fail.
class NetReadyBackend : public NoPauseBackend {
 public:
  explicit NetReadyBackend(runtime::Backend& inner) : NoPauseBackend(inner) {}
  std::string Name() const override { return "netready"; }
  runtime::Capabilities GetCapabilities() const override { return {.network_ready = true}; }
  absl::StatusOr<runtime::InstancePtr> Create(const runtime::SandboxSpec& s) override {
    SBX_ASSIGN_OR_RETURN(runtime::InstancePtr inner, NoPauseBackend::Create(s));
    std::lock_guard lock(st_->mu);
    st_->network_ready[s.id] = s.network_ready;
    return runtime::InstancePtr(std::make_unique<Instance>(std::move(inner), st_, s.network_ready));
  }
  bool NetworkReady(const std::string& id) {
    std::lock_guard lock(st_->mu);
    return st_->network_ready.count(id) && st_->network_ready[id];
  }
  std::optional<json> Attached(const std::string& id) {
    std::lock_guard lock(st_->mu);
    auto it = st_->attached.find(id);
    return it == st_->attached.end() ? std::nullopt : std::optional<json>(it->second);
  }
  std::vector<std::string> AttachTried() {
    std::lock_guard lock(st_->mu);
    std::vector<std::string> out;
    for (const auto& [id, egress] : st_->attached) out.push_back(id);
    return out;
  }
  bool Destroyed(const std::string& id) {
    std::lock_guard lock(st_->mu);
    return st_->destroyed.count(id) > 0;
  }
  void FailAttach(bool fail) { st_->fail = fail; }

 private:
  struct State {
    std::mutex mu;
    std::map<std::string, bool> network_ready;
    std::map<std::string, json> attached;  // tried, failed ones included
    std::set<std::string> destroyed;
    std::atomic<bool> fail = false;
  };
  class Instance : public runtime::Instance {
   public:
    Instance(runtime::InstancePtr inner, std::shared_ptr<State> st, bool ready)
        : inner_(std::move(inner)), st_(std::move(st)), ready_(ready) {}
    const std::string& id() const override { return inner_->id(); }
    std::string AgentSocketPath() const override { return inner_->AgentSocketPath(); }
    json Persist() const override {
      json p = inner_->Persist();
      p["egress"] = egress_;
      return p;
    }
    bool Alive() const override { return inner_->Alive(); }
    absl::Status Destroy() override {
      {
        std::lock_guard lock(st_->mu);
        st_->destroyed.insert(id());
      }
      return inner_->Destroy();
    }
    absl::Status AttachEgress(const json& egress) override {
      {
        std::lock_guard lock(st_->mu);
        st_->attached[id()] = egress;
      }
      if (!ready_ || !egress_.is_null()) return absl::FailedPreconditionError("not network-ready");
      if (st_->fail) return absl::InternalError("attach egress: the test's nft transaction failed");
      egress_ = egress;
      return absl::OkStatus();
    }

   private:
    runtime::InstancePtr inner_;
    std::shared_ptr<State> st_;
    bool ready_;
    json egress_ = nullptr;
  };
  std::shared_ptr<State> st_ = std::make_shared<State>();
};

class SandboxServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sbx-service-test." + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto store = store::OpenSqliteStore((dir_ / "sbx.db").string(), registry_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    fake_ = std::make_unique<runtime::FakeBackend>(dir_.string(), SBX_AGENT_PATH);
    ASSERT_TRUE(fake_->Probe().ok());
    nopause_ = std::make_unique<NoPauseBackend>(*fake_);
    recording_ = std::make_unique<RecordingBackend>(*fake_);
    egress_ = std::make_unique<EgressBackend>(*fake_);
    failing_ = std::make_unique<FailingBackend>(*fake_);
    throwing_ = std::make_unique<ThrowingBackend>(*fake_);
    mortal_ = std::make_unique<MortalBackend>(*fake_);
    netready_ = std::make_unique<NetReadyBackend>(*fake_);
    Start();
  }

  void TearDown() override {
    // Delete whatever is left through the service (paused sandboxes included), then sweep.
    if (svc_) {
      store::SandboxFilter f;
      f.tenant_id = "default";
      auto page = svc_->ListSandboxes(caller_, f);
      if (page.ok()) {
        for (const auto& sb : page->items) {
          auto r = svc_->DeleteSandbox(caller_, sb.id, std::nullopt);
          if (r.ok()) WaitOp(Body(*r)["operation"]["id"]);
        }
      }
    }
    Stop();
    (void)fake_->Sweep({});
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A fresh service and engine over the same store and runtimes, as after an sbxd restart.
  void Start() {
    engine_ = std::make_unique<ops::OperationEngine>(2);
    auto templates = TemplateRegistry::Create(dir_.string());
    ASSERT_TRUE(templates.ok()) << templates.status();
    ServiceOptions opts;
    opts.default_runtime = "fake";
    opts.defaults = defaults_;
    opts.output_buffer_bytes = output_buffer_bytes_;
    opts.attach_keys = {AttachTokens::MakeKey("test-key", {})};
    opts.timers.default_timeout_s = default_timeout_s_;
    opts.warm_pools = warm_pools_;
    opts.metrics = &registry_;
    opts.admission = admission_;
    opts.egress_catalog = egress_catalog_;
    if (host_) {
      opts.host_capacity = [this]() -> absl::StatusOr<HostCapacity> {
        std::lock_guard lock(host_mu_);
        return *host_;
      };
    }
    svc_ = std::make_unique<SandboxService>(
        opts, *store_, *engine_, std::move(*templates),
        std::map<std::string, runtime::Backend*>{{"fake", fake_.get()},
                                                 {"nopause", nopause_.get()},
                                                 {"recording", recording_.get()},
                                                 {"egress", egress_.get()},
                                                 {"failing", failing_.get()},
                                                 {"throwing", throwing_.get()},
                                                 {"mortal", mortal_.get()},
                                                 {"netready", netready_.get()}});
    ASSERT_TRUE(svc_->Reconcile().ok());
  }
  void Stop() {
    if (engine_) engine_->Shutdown();
    svc_.reset();  // instances are dropped, sandboxes keep running (like a killed sbxd)
    engine_.reset();
  }

  store::OperationRecord WaitOp(const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      auto op = svc_->GetOperation(caller_, id);
      EXPECT_TRUE(op.ok()) << op.status();
      if (!op.ok() || op->state == "succeeded" || op->state == "failed") return op.value_or(store::OperationRecord{});
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "operation " << id << " still " << op->state;
        return *op;
      }
      std::this_thread::sleep_for(5ms);
    }
  }

  std::string CreateRunning(const std::string& runtime = "fake") {
    CreateSandboxRequest req;
    req.runtime = runtime;
    req.canonical = json{{"runtime", runtime}};
    auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    json body = Body(*r);
    EXPECT_EQ(WaitOp(body["operation"]["id"]).state, "succeeded");
    return body["sandbox"]["id"];
  }

  // Starts `kind` and returns the operation JSON of the 202.
  absl::StatusOr<json> Request(const std::string& id, const std::string& kind,
                               std::optional<std::string> key = std::nullopt) {
    SBX_ASSIGN_OR_RETURN(auto r, svc_->RequestLifecycle(caller_, id, kind,
                                                         Key(key, id + "/" + kind)));
    EXPECT_TRUE(r.result.has_value() != r.replay.has_value());
    return Body(r)["operation"];
  }

  void Do(const std::string& id, const std::string& kind) {
    auto op = Request(id, kind);
    ASSERT_TRUE(op.ok()) << op.status();
    EXPECT_EQ((*op)["kind"], kind);
    auto done = WaitOp((*op)["id"]);
    EXPECT_EQ(done.state, "succeeded") << done.error.dump();
  }

  std::string StateOf(const std::string& id) {
    auto sb = svc_->GetSandbox(caller_, id);
    EXPECT_TRUE(sb.ok()) << sb.status();
    return sb.ok() ? sb->state : "";
  }

  static CreateSessionRequest TrueRequest() {
    CreateSessionRequest req;
    req.argv = {"true"};
    req.canonical = json{{"argv", req.argv}};
    return req;
  }

  absl::Status NewSession(const std::string& id) {
    return svc_->CreateSession(caller_, id, TrueRequest(), std::nullopt).status();
  }

  // A session of `true` in sandbox `id`; its id ("" after a failed expectation).
  std::string TrueSession(const std::string& id) {
    auto r = svc_->CreateSession(caller_, id, TrueRequest(), std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? Body(*r)["session_id"].get<std::string>() : "";
  }

  // The value of one series in this test's registry ("" when absent).
  std::string Metric(const std::string& series) {
    const std::string text = "\n" + registry_.Expose();
    const std::string key = "\n" + series + " ";
    size_t at = text.find(key);
    if (at == std::string::npos) return "";
    at += key.size();
    return text.substr(at, text.find('\n', at) - at);
  }

  // Metric(series) once it equals `want`, waiting at most 10 s: an operation's job counts it
  // just after committing it, so a test that saw it finished in the store can read the
  // counter a moment early. Any other value is returned (and fails the test) after the wait.
  std::string MetricSoon(const std::string& series, const std::string& want) {
    for (int i = 0; i < 2000 && Metric(series) != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return Metric(series);
  }

  fs::path dir_;
  Caller caller_{"default", std::nullopt};
  metrics::Registry registry_;  // before the store and the service, which hold its children
  std::vector<WarmPoolConfig> warm_pools_;  // ServiceOptions of the next Start()
  store::StorePtr store_;
  std::unique_ptr<runtime::FakeBackend> fake_;
  std::unique_ptr<NoPauseBackend> nopause_;
  std::unique_ptr<RecordingBackend> recording_;
  std::unique_ptr<EgressBackend> egress_;
  std::unique_ptr<FailingBackend> failing_;
  std::unique_ptr<ThrowingBackend> throwing_;
  std::unique_ptr<MortalBackend> mortal_;
  std::unique_ptr<NetReadyBackend> netready_;
  std::shared_ptr<const net::ProfileCatalog> egress_catalog_;  // ServiceOptions of the next Start()
  runtime::Resources defaults_;  // ServiceOptions of the next Start()
  // Admission of the next Start(): without host_, no probe (nothing refused).
  AdmissionSettings admission_;
  std::mutex host_mu_;
  std::optional<HostCapacity> host_;
  int64_t output_buffer_bytes_ = 8 << 20;
  int64_t default_timeout_s_ = 0;
  std::unique_ptr<ops::OperationEngine> engine_;
  std::unique_ptr<SandboxService> svc_;
};

TEST_F(SandboxServiceTest, EffectiveResourcesCombineTheRequestAndDeploymentDefaults) {
  Stop();
  defaults_.pids = 100;
  defaults_.open_files = 1000;
  defaults_.tmp_mib = 32;
  defaults_.shm_mib = 16;
  output_buffer_bytes_ = 1 << 20;
  Start();
  CreateSandboxRequest req;
  req.runtime = "recording";
  req.memory_mib = 256;
  req.canonical = json{{"runtime", "recording"}, {"resources", {{"memory_mib", 256}}}};
  auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  json body = Body(*r);
  const json want = {{"vcpu", 1},      {"memory_mib", 256}, {"disk_mib", 1024},
                     {"pids", 100},    {"open_files", 1000}, {"tmp_mib", 32},
                     {"shm_mib", 16},  {"output_buffer_bytes", 1 << 20}};
  EXPECT_EQ(body["sandbox"]["effective_resources"], want);
  ASSERT_EQ(WaitOp(body["operation"]["id"]).state, "succeeded");
  const std::string id = body["sandbox"]["id"];
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_EQ(sb->effective_resources, want);
  // The runtime gets the same numbers.
  runtime::Resources got = recording_->last().resources;
  EXPECT_EQ(got.memory_mib, 256);
  EXPECT_EQ(got.pids, 100);
  EXPECT_EQ(got.open_files, 1000);
  EXPECT_EQ(got.tmp_mib, 32);
  EXPECT_EQ(got.shm_mib, 16);
}

TEST_F(SandboxServiceTest, ReconfigureChangesWhatNewCreatesGetAndNothingOnError) {
  const std::string before = CreateRunning("recording");
  LiveOptions live;
  live.defaults.pids = 77;
  live.defaults.memory_mib = 300;
  live.attach_token_ttl = 60s;
  live.warm_pools = {{"fake", "base", 1}};
  ASSERT_TRUE(svc_->Reconfigure(live).ok());
  EXPECT_EQ(svc_->attach_tokens().ttl(), 60s);
  EXPECT_EQ(svc_->WarmPoolSizes().at("fake/base"), 1);

  const std::string after = CreateRunning("recording");
  EXPECT_EQ(recording_->last().resources.pids, 77);
  EXPECT_EQ(recording_->last().resources.memory_mib, 300);
  auto sb = svc_->GetSandbox(caller_, after);
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_EQ(sb->effective_resources["pids"], 77);
  EXPECT_EQ(sb->effective_resources["memory_mib"], 300);
  // A sandbox that exists keeps what it was created with.
  sb = svc_->GetSandbox(caller_, before);
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_EQ(sb->effective_resources["pids"], runtime::Resources{}.pids);

  // A pool of a template that does not exist: refused, and nothing else changes either.
  LiveOptions bad = live;
  bad.defaults.pids = 99;
  bad.attach_token_ttl = 5s;
  bad.warm_pools = {{"fake", "base", 0}, {"fake", "nope", 1}};
  absl::Status st = svc_->Reconfigure(bad);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("warm pool nope=1"), std::string::npos) << st;
  EXPECT_EQ(svc_->defaults().pids, 77);
  EXPECT_EQ(svc_->attach_tokens().ttl(), 60s);
  EXPECT_EQ(svc_->WarmPoolSizes().at("fake/base"), 1);
}

TEST_F(SandboxServiceTest, SandboxesStoredBeforeNewResourceKeysShowDefaults) {
  const std::string id = CreateRunning();
  // What a record written by an older sbxd holds.
  ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(id));
    sb.effective_resources = {{"vcpu", 2}, {"memory_mib", 300}, {"disk_mib", 1024}, {"pids", 64}};
    return tx.PutSandbox(sb);
  }).ok());
  const runtime::Resources d;
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_EQ(sb->effective_resources,
            (json{{"vcpu", 2}, {"memory_mib", 300}, {"disk_mib", 1024}, {"pids", 64},
                  {"open_files", d.open_files}, {"tmp_mib", d.tmp_mib}, {"shm_mib", d.shm_mib},
                  {"output_buffer_bytes", 8 << 20}}));
  store::SandboxFilter f;
  auto page = svc_->ListSandboxes(caller_, f);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->items.size(), 1u);
  EXPECT_EQ(page->items[0].effective_resources["open_files"], d.open_files);
}

TEST_F(SandboxServiceTest, AJobThatThrowsFailsItsOperationAndSandboxWhichCanBeDeleted) {
  CreateSandboxRequest req;
  req.runtime = "throwing";
  req.canonical = json{{"runtime", "throwing"}};
  auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  const json body = Body(*r);
  const store::OperationRecord done = WaitOp(body["operation"]["id"]);
  EXPECT_EQ(done.state, "failed");
  EXPECT_EQ(done.error.value("code", ""), "internal") << done.error.dump();
  EXPECT_NE(done.error.value("message", "").find("No such process"), std::string::npos);
  const std::string id = body["sandbox"]["id"];
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_EQ(sb->state, kFailed);
  EXPECT_FALSE(sb->current_operation_id.has_value());
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  // The engine's worker survived: the next create on a working runtime runs.
  CreateRunning();
}

TEST_F(SandboxServiceTest, PauseRefusesSessionsUntilWake) {
  const std::string id = CreateRunning();
  ASSERT_TRUE(svc_->AgentSocketFor(id).has_value());
  Do(id, "pause");
  EXPECT_EQ(StateOf(id), kPaused);
  EXPECT_FALSE(svc_->AgentSocketFor(id).has_value()) << "data plane must not call a frozen agent";
  absl::Status s = NewSession(id);
  EXPECT_EQ(ApiErrorCode(s), "sandbox_not_running") << s;
  EXPECT_NE(s.message().find("paused"), std::string::npos) << s;

  Do(id, "wake");
  EXPECT_EQ(StateOf(id), kRunning);
  EXPECT_TRUE(svc_->AgentSocketFor(id).has_value());
  EXPECT_TRUE(NewSession(id).ok());
}

// Port exposure's authorization is read from the store once per running sandbox and cached
// beside its instance: the cache must answer exactly as the record does, and never outlive the
// instance (a pause, a delete).
TEST_F(SandboxServiceTest, AuthorizePortAnswersAsTheRecordDoesThroughPauseAndDelete) {
  const std::string id = CreateRunning();
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok()) << sb.status();
  const std::string token = sb->port_access.value("traffic_token", std::string());
  ASSERT_FALSE(token.empty());
  auto with_token = [&](std::optional<std::string> t) {
    SandboxService::PortCredentials c;
    c.traffic_token = std::move(t);
    return svc_->AuthorizePort(id, c);
  };
  auto as_caller = [&](const Caller& who) {
    SandboxService::PortCredentials c;
    c.caller = who;
    return svc_->AuthorizePort(id, c);
  };
  // Twice each: the first answer reads the record, the second the cache.
  for (int round = 0; round < 2; ++round) {
    auto ok = with_token(token);
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(*ok, caller_.tenant_id);
    EXPECT_EQ(ApiErrorCode(with_token(token + "x").status()), "permission_denied");
    EXPECT_EQ(ApiErrorCode(with_token(std::nullopt).status()), "unauthenticated");
    EXPECT_TRUE(as_caller(caller_).ok());
    EXPECT_EQ(as_caller(Caller{"ten_other", std::nullopt}).status().code(),
              absl::StatusCode::kNotFound);
  }
  Do(id, "pause");
  auto paused = with_token(token);
  EXPECT_EQ(ApiErrorCode(paused.status()), "sandbox_not_running") << paused.status();
  EXPECT_NE(paused.status().message().find("paused"), std::string::npos) << paused.status();
  Do(id, "wake");
  EXPECT_TRUE(with_token(token).ok());
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(with_token(token).status().code(), absl::StatusCode::kNotFound);
  SandboxService::PortCredentials none;
  EXPECT_EQ(svc_->AuthorizePort("bad id", none).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SandboxServiceTest, SuspendAndInvalidStates) {
  const std::string id = CreateRunning();
  auto wake = Request(id, "wake");
  EXPECT_EQ(ApiErrorCode(wake.status()), "invalid_state") << wake.status();
  EXPECT_EQ(wake.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wake.status().message().find("running"), std::string::npos) << wake.status();

  Do(id, "suspend");
  EXPECT_EQ(StateOf(id), kSuspended);
  for (const char* kind : {"pause", "suspend"}) {
    auto again = Request(id, kind);
    EXPECT_EQ(ApiErrorCode(again.status()), "invalid_state") << again.status();
    EXPECT_NE(again.status().message().find("suspended"), std::string::npos) << again.status();
  }
  Do(id, "wake");
  EXPECT_EQ(StateOf(id), kRunning);
}

TEST_F(SandboxServiceTest, RuntimeWithoutPauseIs501BeforeAnyChange) {
  const std::string id = CreateRunning("nopause");
  auto r = Request(id, "pause");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_EQ(ApiErrorCode(r.status()), "not_implemented");
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->state, kRunning);
  EXPECT_FALSE(sb->current_operation_id.has_value());
}

TEST_F(SandboxServiceTest, UnknownAndForeignSandboxesAreNotFound) {
  const std::string id = CreateRunning();
  EXPECT_EQ(Request(NewId("sbx"), "pause").status().code(), absl::StatusCode::kNotFound);
  auto other = svc_->RequestLifecycle(Caller{"ten_other", std::nullopt}, id, "pause", std::nullopt);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << other.status();
  EXPECT_EQ(Request("not-an-id", "wake").status().code(), absl::StatusCode::kInvalidArgument);
}

// A read that fails for another reason than a missing row is that failure, never a 404: a
// client told "not found" would take its sandbox for gone when the store only failed (here a
// row whose JSON no longer decodes, DataLoss; in production PostgreSQL gone, Unavailable).
TEST_F(SandboxServiceTest, AFailedReadIsNeverANotFound) {
  const std::string id = CreateRunning();
  const std::string sid = TrueSession(id);
  ASSERT_FALSE(sid.empty());
  auto op = Request(id, "pause");
  ASSERT_TRUE(op.ok()) << op.status();
  const std::string op_id = (*op)["id"];
  WaitOp(op_id);
  auto sql = [&](const std::string& statement) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "sbx.db").string().c_str(), &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, statement.c_str(), nullptr, nullptr, &err), SQLITE_OK)
        << (err != nullptr ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
  };
  const auto kDataLoss = absl::StatusCode::kDataLoss;
  sql("UPDATE sandboxes SET env = '{not json' WHERE id = '" + id + "'");
  EXPECT_EQ(svc_->GetSandbox(caller_, id).status().code(), kDataLoss);
  EXPECT_EQ(Request(id, "wake").status().code(), kDataLoss);
  EXPECT_EQ(NewSession(id).code(), kDataLoss);
  // A missing sandbox is still a 404, and so is another tenant's readable one.
  EXPECT_EQ(svc_->GetSandbox(caller_, NewId("sbx")).status().code(), absl::StatusCode::kNotFound);
  sql("UPDATE sandboxes SET env = '{}' WHERE id = '" + id + "'");
  EXPECT_EQ(svc_->GetSandbox(Caller{"ten_other", std::nullopt}, id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(svc_->GetSandbox(caller_, id).ok());

  sql("UPDATE sessions SET spec = '{not json' WHERE id = '" + sid + "'");
  EXPECT_EQ(svc_->GetSession(caller_, sid).status().code(), kDataLoss);
  EXPECT_EQ(svc_->GetSession(caller_, NewId("ses")).status().code(), absl::StatusCode::kNotFound);
  sql("UPDATE sessions SET spec = '{}' WHERE id = '" + sid + "'");
  EXPECT_TRUE(svc_->GetSession(caller_, sid).ok());

  sql("UPDATE operations SET result = '{not json' WHERE id = '" + op_id + "'");
  EXPECT_EQ(svc_->GetOperation(caller_, op_id).status().code(), kDataLoss);
  EXPECT_EQ(svc_->GetOperation(caller_, NewId("op")).status().code(),
            absl::StatusCode::kNotFound);
  sql("UPDATE operations SET result = NULL WHERE id = '" + op_id + "'");
  EXPECT_TRUE(svc_->GetOperation(caller_, op_id).ok());
}

TEST_F(SandboxServiceTest, InFlightConflictsRepeatsAndDeleteWins) {
  const std::string id = CreateRunning();
  // Hold the sandbox's operation queue so that the pause stays pending.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  engine_->Submit(id, [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  auto pause = Request(id, "pause", "key-1");
  ASSERT_TRUE(pause.ok()) << pause.status();
  EXPECT_EQ((*pause)["state"], "pending");

  // Same kind: the in-flight operation. Same key: a replay.
  auto repeat = Request(id, "pause");
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_EQ((*repeat)["id"], (*pause)["id"]);
  auto replay = svc_->RequestLifecycle(caller_, id, "pause", Key("key-1", id + "/pause"));
  ASSERT_TRUE(replay.ok());
  ASSERT_TRUE(replay->replay.has_value());
  EXPECT_FALSE(replay->result.has_value());
  EXPECT_EQ(Body(*replay)["operation"]["id"], (*pause)["id"]);
  EXPECT_EQ(replay->replay->status, 1);  // what the caller's render said, stored as it was
  // Another kind: 409 naming the operation in flight.
  auto wake = Request(id, "wake");
  EXPECT_EQ(ApiErrorCode(wake.status()), "operation_in_progress") << wake.status();
  EXPECT_EQ(ApiErrorDetail(wake.status(), "operation_id"), (*pause)["id"].get<std::string>());

  // Delete wins: accepted while the pause is queued; the pause is then cancelled.
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  auto suspend = Request(id, "suspend");
  EXPECT_EQ(ApiErrorCode(suspend.status()), "operation_in_progress") << suspend.status();
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  auto paused = WaitOp((*pause)["id"]);
  EXPECT_EQ(paused.state, "failed");
  EXPECT_EQ(paused.error.value("code", ""), "cancelled");
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(StateOf(id), kDeleted);
}

TEST_F(SandboxServiceTest, DeleteOfPausedSandbox) {
  const std::string id = CreateRunning();
  Do(id, "pause");
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(StateOf(id), kDeleted);
  EXPECT_FALSE(fs::exists(dir_ / "sandboxes" / id));
}

TEST_F(SandboxServiceTest, RestartKeepsPausedSandboxFrozenAndFailsInterruptedOps) {
  const std::string paused = CreateRunning();
  const std::string running = CreateRunning();
  Do(paused, "pause");
  // A wake of `paused` and a pause of `running` were in flight when sbxd died.
  std::string wake_op, pause_op;
  ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
    for (auto [id, kind, out] : {std::tuple{paused, "wake", &wake_op},
                                 std::tuple{running, "pause", &pause_op}}) {
      store::OperationRecord op;
      op.id = NewId("op");
      op.tenant_id = "default";
      op.kind = kind;
      op.sandbox_id = id;
      op.state = "running";
      op.created_at = op.updated_at = "2026-01-01T00:00:00.000Z";
      SBX_RETURN_IF_ERROR(tx.PutOperation(op));
      SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(id));
      sb.current_operation_id = op.id;
      SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
      *out = op.id;
    }
    return absl::OkStatus();
  }).ok());

  Stop();
  Start();
  for (const auto& op_id : {wake_op, pause_op}) {
    auto op = svc_->GetOperation(caller_, op_id);
    ASSERT_TRUE(op.ok()) << op.status();
    EXPECT_EQ(op->state, "failed");
    EXPECT_EQ(op->error.value("code", ""), "interrupted");
  }
  // The kernel (here: the stopped fake agent) decides: still frozen -> paused; else running.
  auto sb = svc_->GetSandbox(caller_, paused);
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->state, kPaused);
  EXPECT_FALSE(sb->current_operation_id.has_value());
  EXPECT_FALSE(svc_->AgentSocketFor(paused).has_value());
  EXPECT_EQ(StateOf(running), kRunning);
  EXPECT_TRUE(svc_->AgentSocketFor(running).has_value());

  Do(paused, "wake");
  EXPECT_EQ(StateOf(paused), kRunning);
  EXPECT_TRUE(NewSession(paused).ok());
}

TEST_F(SandboxServiceTest, OperationMetricsCountWhatFinished) {
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"running\"}"), "0");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"create\",result=\"succeeded\"}", "0"), "0");
  EXPECT_EQ(Metric("sbx_build_info{version=\"" + std::string(BuildVersion()) + "\",commit=\"" +
                   std::string(BuildCommit()) + "\",runtime=\"fake\"}"),
            "1");

  const std::string id = CreateRunning();
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"create\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operation_duration_seconds_count{kind=\"create\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_sandbox_create_to_running_seconds_count"
                       "{runtime=\"fake\",source=\"cold\"}", "1"),
            "1");
  EXPECT_EQ(MetricSoon("sbx_sandbox_create_to_running_seconds_count"
                       "{runtime=\"fake\",source=\"warm\"}", "0"),
            "0");
  // Every live state is reported, the empty ones as 0.
  for (std::string_view state : kLiveStates) {
    EXPECT_EQ(Metric("sbx_sandboxes{state=\"" + std::string(state) + "\"}"),
              state == kRunning ? "1" : "0")
        << state;
  }
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"deleted\"}"), "");

  Do(id, "pause");
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"paused\"}"), "1");
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"running\"}"), "0");
  Do(id, "wake");
  auto wake = Request(id, "wake");  // refused before it became an operation: not counted
  EXPECT_FALSE(wake.ok());
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"pause\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"wake\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operation_duration_seconds_count{kind=\"wake\"}", "1"), "1");

  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"delete\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"running\"}"), "0");
  // A repeated delete answers with the finished operation and counts nothing new.
  ASSERT_TRUE(svc_->DeleteSandbox(caller_, id, std::nullopt).ok());
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"delete\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operation_duration_seconds_count{kind=\"delete\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"create\",result=\"failed\"}", "0"), "0");
  // The store timed the statements of all this.
  EXPECT_NE(Metric("sbx_store_query_duration_seconds_count{op=\"PutOperation\"}"), "0");
}

TEST_F(SandboxServiceTest, FailedAndCancelledOperationsAreCountedApart) {
  const std::string id = CreateRunning();
  // A pause queued behind a blocker, then overtaken by a delete: cancelled.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  engine_->Submit(id, [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  auto pause = Request(id, "pause");
  ASSERT_TRUE(pause.ok()) << pause.status();
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_EQ(WaitOp((*pause)["id"]).error.value("code", ""), "cancelled");
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"pause\",result=\"cancelled\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"pause\",result=\"failed\"}", "0"), "0");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"pause\",result=\"succeeded\"}", "0"), "0");

  // A create whose template changed while it was queued fails in its job. Both engine workers
  // are held so that the job waits behind them.
  release = false;
  for (const char* key : {"blocker-1", "blocker-2"}) {
    engine_->Submit(key, [&] {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return release; });
    });
  }
  CreateSandboxRequest req;
  req.runtime = "fake";
  req.canonical = json{{"runtime", "fake"}};
  auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  json body = Body(*r);
  ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(body["sandbox"]["id"]));
    sb.template_digest = "sha256:changed";
    return tx.PutSandbox(sb);
  }).ok());
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_EQ(WaitOp(body["operation"]["id"]).state, "failed");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"create\",result=\"failed\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"create\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(MetricSoon("sbx_operation_duration_seconds_count{kind=\"create\"}", "2"), "2");
  // Only the create that reached running has a create-to-running time.
  EXPECT_EQ(MetricSoon("sbx_sandbox_create_to_running_seconds_count"
                       "{runtime=\"fake\",source=\"cold\"}", "1"),
            "1");
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"failed\"}"), "1");
}

TEST_F(SandboxServiceTest, InterruptedOperationsAreCountedAsFailedAfterARestart) {
  const std::string id = CreateRunning();
  ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
    store::OperationRecord op;
    op.id = NewId("op");
    op.tenant_id = "default";
    op.kind = "suspend";
    op.sandbox_id = id;
    op.state = "running";
    op.created_at = op.updated_at = "2026-01-01T00:00:00.000Z";
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(id));
    sb.current_operation_id = op.id;
    return tx.PutSandbox(sb);
  }).ok());
  Stop();
  Start();
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"suspend\",result=\"failed\"}", "1"), "1");
  // Accepted by another process: no duration to observe.
  EXPECT_EQ(MetricSoon("sbx_operation_duration_seconds_count{kind=\"suspend\"}", "0"), "0");
}

TEST_F(SandboxServiceTest, WarmPoolMetricsAndWarmCreates) {
  Stop();
  warm_pools_ = {WarmPoolConfig{"fake", "base", 1}};
  Start();
  EXPECT_EQ(Metric("sbx_warm_pool_target{runtime=\"fake\",template=\"base\",egress=\"none\"}"), "1");
  EXPECT_EQ(Metric("sbx_warm_pool_ready{runtime=\"fake\",template=\"base\",egress=\"none\"}"), "0");
  svc_->StartWarmPools();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (Metric("sbx_warm_pool_ready{runtime=\"fake\",template=\"base\",egress=\"none\"}") != "1") {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the pool never filled";
    std::this_thread::sleep_for(10ms);
  }
  CreateSandboxRequest req;
  req.canonical = json::object();
  auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  json body = Body(*r);
  ASSERT_EQ(body["operation"]["state"], "succeeded") << "not served from the pool: " << body;
  EXPECT_EQ(MetricSoon("sbx_sandbox_create_to_running_seconds_count"
                       "{runtime=\"fake\",source=\"warm\"}", "1"),
            "1");
  EXPECT_EQ(MetricSoon("sbx_sandbox_create_to_running_seconds_count"
                       "{runtime=\"fake\",source=\"cold\"}", "0"),
            "0");
  EXPECT_EQ(MetricSoon("sbx_operations_total{kind=\"create\",result=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(Metric("sbx_sandboxes{state=\"running\"}"), "1");
}

// Networked creates from the warm pool's network-ready twin (warm_pool.h): the member is given
// the create's egress before the create is answered, a `none` create never takes one, and a
// member whose AttachEgress failed is destroyed and the create built cold.
TEST_F(SandboxServiceTest, NetworkedCreatesTakeNetworkReadyMembersOnly) {
  Stop();
  auto catalog = net::ProfileCatalog::FromJson(json::parse(
      R"({"lab": {"description": "one address", "allow": [{"cidr": "93.184.216.34/32", "ports": "443", "protocol": "tcp"}]}})"));
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  egress_catalog_ = std::make_shared<const net::ProfileCatalog>(std::move(*catalog));
  warm_pools_ = {WarmPoolConfig{"netready", "base", 1}, WarmPoolConfig{"netready", "base", 1, true}};
  Start();
  EXPECT_EQ(Metric("sbx_warm_pool_target{runtime=\"netready\",template=\"base\",egress=\"networked\"}"), "1");
  svc_->StartWarmPools();
  auto wait_full = [&] {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (svc_->WarmPoolReady()["netready/base"] != 1 ||
           svc_->WarmPoolReady()["netready/base/networked"] != 1) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the pools never filled";
      std::this_thread::sleep_for(10ms);
    }
  };
  auto create = [&](const std::string& profile, std::optional<int64_t> memory = std::nullopt) {
    CreateSandboxRequest req;
    req.runtime = "netready";
    req.egress_profile = profile;
    req.memory_mib = memory;
    req.canonical = json{{"egress_profile", profile}, {"n", NewId("x")}};
    auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? Body(*r) : json();
  };
  const json lab = {{"profile", "lab"}, {"narrowed", nullptr}};

  wait_full();
  json body = create("lab");
  ASSERT_EQ(body["operation"]["result"], json({{"warm_pool", true}})) << body;
  const std::string networked = body["sandbox"]["id"];
  EXPECT_TRUE(netready_->NetworkReady(networked));
  EXPECT_EQ(netready_->Attached(networked), lab);
  // What a restart adopts was read after the attach.
  auto stored = svc_->GetSandbox(caller_, networked);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->runtime_state["egress"], lab);
  EXPECT_EQ(stored->egress, lab);

  // `none` takes the loopback-only member, never a network-ready one.
  wait_full();
  body = create("none");
  ASSERT_EQ(body["operation"]["result"], json({{"warm_pool", true}})) << body;
  const std::string plain = body["sandbox"]["id"];
  EXPECT_FALSE(netready_->NetworkReady(plain));
  EXPECT_FALSE(netready_->Attached(plain).has_value());
  EXPECT_EQ(svc_->WarmPoolReady()["netready/base/networked"], 1);

  // Non-default resources: cold, the pooled member untouched.
  body = create("lab", 256);
  EXPECT_TRUE(body["operation"]["result"].is_null()) << body;
  WaitOp(body["operation"]["id"]);
  EXPECT_EQ(svc_->WarmPoolReady()["netready/base/networked"], 1);

  // A failed attach: the member is destroyed, never pooled again, and the create goes cold.
  wait_full();
  netready_->FailAttach(true);
  body = create("lab");
  EXPECT_TRUE(body["operation"]["result"].is_null()) << body;
  const std::string cold = body["sandbox"]["id"];
  EXPECT_EQ(WaitOp(body["operation"]["id"]).state, "succeeded");
  EXPECT_FALSE(netready_->NetworkReady(cold));
  EXPECT_FALSE(netready_->Attached(cold).has_value());
  netready_->FailAttach(false);
  // The member it tried: destroyed, no sandbox of anyone's, and its capacity given back (the
  // pool refills).
  std::vector<std::string> tried = netready_->AttachTried();
  ASSERT_EQ(tried.size(), 2u);
  const std::string failed = tried[0] == networked ? tried[1] : tried[0];
  EXPECT_TRUE(netready_->Destroyed(failed));
  EXPECT_EQ(svc_->GetSandbox(caller_, failed).status().code(), absl::StatusCode::kNotFound);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (svc_->WarmPoolReady()["netready/base/networked"] != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the networked pool never refilled";
    std::this_thread::sleep_for(10ms);
  }
  body = create("lab");
  ASSERT_EQ(body["operation"]["result"], json({{"warm_pool", true}})) << body;
  EXPECT_EQ(netready_->Attached(body["sandbox"]["id"]), lab);
}

TEST_F(SandboxServiceTest, SessionMetricsFollowTheDataPlane) {
  const std::string id = CreateRunning();
  auto started = [&](const std::string& sid) {
    svc_->RecordSessionStarted(sid, true);
  };
  auto session = [&]() -> std::string {
    CreateSessionRequest req;
    req.argv = {"true"};
    req.canonical = json{{"argv", req.argv}, {"n", NewId("x")}};
    auto r = svc_->CreateSession(caller_, id, req, std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? Body(*r)["session_id"].get<std::string>() : "";
  };
  const std::string a = session(), b = session(), c = session(), d = session();
  EXPECT_EQ(Metric("sbx_sessions_active"), "0");
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "0");

  started(a);
  started(a);  // a second attach to a running session starts nothing
  started(b);
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "2");
  EXPECT_EQ(Metric("sbx_sessions_active"), "2");

  protocol::ExitEvent oom;
  oom.signal = "SIGKILL";
  oom.oom_killed = true;
  svc_->RecordSessionExit(a, oom);
  svc_->RecordSessionExit(a, oom);  // seen again by a second attached client
  EXPECT_EQ(Metric("sbx_oom_kills_total"), "1");
  EXPECT_EQ(Metric("sbx_sessions_active"), "1");

  // The status path (no client attached at exit) ends b, and starts and ends c at once.
  SessionStatus b_exit;
  b_exit.state = "exited";
  b_exit.exit_code = 0;
  svc_->RecordSessionStatus(b, b_exit);
  SessionStatus c_exit;
  c_exit.state = "exited";
  c_exit.signal = "SIGKILL";
  c_exit.oom_killed = true;
  svc_->RecordSessionStatus(c, c_exit);
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "3");
  EXPECT_EQ(Metric("sbx_sessions_active"), "0");
  EXPECT_EQ(Metric("sbx_oom_kills_total"), "2");

  // A running session survives an sbxd restart: active again, but not started again.
  started(d);
  EXPECT_EQ(Metric("sbx_sessions_active"), "1");
  Stop();
  Start();
  EXPECT_EQ(Metric("sbx_sessions_active"), "1");
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "4");
  // Deleting the sandbox ends it.
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  // The delete job ends the sessions' gauge just after committing the operation.
  EXPECT_EQ(MetricSoon("sbx_sessions_active", "0"), "0");
  EXPECT_EQ(Metric("sbx_oom_kills_total"), "2");
}

// An exec of a short command: its first attach finds the exit among the first frames
// (AttachStream::ExitWithin), and "running" and "exited" are stored in one transaction; the
// exit the attach then relays costs none, a second client's finds the store unchanged.
TEST_F(SandboxServiceTest, AProcessOverAtItsFirstAttachIsStoredInOneTransaction) {
  const std::string id = CreateRunning();
  const std::string sid = TrueSession(id);
  ASSERT_FALSE(sid.empty());
  // Counted by the session statements: the create's job may still be committing its own.
  auto count = [&](const char* op) {
    return std::stoi(
        Metric(fmt::format("sbx_store_query_duration_seconds_count{{op=\"{}\"}}", op)));
  };
  const int reads = count("GetSession"), writes = count("PutSession");
  protocol::ExitEvent ev;
  ev.event_id = 1;
  ev.exit_code = 7;
  svc_->RecordSessionStarted(sid, true, ev);
  svc_->RecordSessionExit(sid, ev);  // the attach relaying it
  EXPECT_EQ(count("GetSession"), reads + 1);
  EXPECT_EQ(count("PutSession"), writes + 1);
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "1");
  EXPECT_EQ(Metric("sbx_sessions_active"), "0");
  auto s = svc_->GetSession(caller_, sid);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state, "exited");
  EXPECT_EQ(s->exit_code, 7);
  EXPECT_TRUE(s->started_at.has_value());
  EXPECT_TRUE(s->exited_at.has_value());
  svc_->RecordSessionExit(sid, ev);  // a second attached client: read, nothing written
  svc_->RecordSessionStarted(sid, false);
  EXPECT_EQ(count("PutSession"), writes + 1);
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "1");
  EXPECT_EQ(Metric("sbx_sessions_active"), "0");
  auto again = svc_->GetSession(caller_, sid);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state, "exited");
  EXPECT_EQ(again->exited_at, s->exited_at);
}

// Issue 13: what an agent answers is the guest's to choose. A field of the wrong type is
// ignored; json::value() used to throw here, and the status path runs in the timer thread,
// where a throw ends sbxd.
TEST_F(SandboxServiceTest, AgentAnswersOfTheWrongTypeAreIgnored) {
  const std::string id = CreateRunning();
  CreateSessionRequest req;
  req.argv = {"true"};
  req.canonical = json{{"argv", req.argv}};
  auto r = svc_->CreateSession(caller_, id, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string sid = Body(*r)["session_id"].get<std::string>();
  // The answers are decoded (protocol/messages.h) before anything is recorded: a wrong type is
  // refused there, without a throw, and nothing reaches the store.
  std::optional<absl::StatusOr<protocol::AttachReply>> started;
  EXPECT_NO_THROW(started = protocol::ReplyFromJson<protocol::AttachReply>(
                      json{{"ok", true}, {"started", "yes"}}, "attach reply"));
  EXPECT_FALSE(started->ok());
  for (const json& answer : {json{{"ok", true}, {"state", 5}}, json::array({1, 2})}) {
    std::optional<absl::StatusOr<SessionStatus>> status;
    EXPECT_NO_THROW(status = protocol::ReplyFromJson<SessionStatus>(answer, "status reply"));
    EXPECT_FALSE(status->ok()) << answer;
  }
  EXPECT_EQ(Metric("sbx_sessions_started_total"), "0");
  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
}

TEST_F(SandboxServiceTest, DeniedEgressIsCountedOnceAcrossReadingsRestartsAndDelete) {
  const auto wall = std::chrono::system_clock::now();
  const auto mono = ActivityTracker::Clock::now();
  const std::string a = CreateRunning("egress"), b = CreateRunning("egress");
  auto series = [](const std::string& id, const std::string& reason) {
    return "sbx_egress_denied_total{sandbox=\"" + id + "\",reason=\"" + reason + "\"}";
  };
  // A series appears with its sandbox's first refusal of that reason.
  EXPECT_EQ(Metric(series(a, "host")), "");
  EXPECT_NE(registry_.Expose().find("# TYPE sbx_egress_denied_total counter"), std::string::npos);
  egress_->Set(a, "host", 3);
  egress_->Set(a, "dns_name", 1);  // sbxd's resolver refused a name: a reason of its own
  egress_->Set(b, "host", 4);
  egress_->Set(b, "not_allowed", 0);
  svc_->RunTimersOnce(wall + 10s, mono);
  EXPECT_EQ(Metric(series(a, "host")), "3");
  EXPECT_EQ(Metric(series(a, "dns_name")), "1");
  EXPECT_EQ(Metric(series(b, "host")), "4");
  EXPECT_EQ(Metric(series(b, "not_allowed")), "");
  // The same reasons and counts as the sandbox's GET egress (a `none` sandbox's no_route too).
  auto eg = svc_->SandboxEgress(caller_, a);
  ASSERT_TRUE(eg.ok()) << eg.status();
  EXPECT_EQ((*eg)["denied"]["host"], 3) << eg->dump();
  EXPECT_EQ((*eg)["denied"]["dns_name"], 1) << eg->dump();
  EXPECT_EQ((*eg)["denied"]["no_route"], 0) << eg->dump();
  // Each reading adds what was added since the sandbox's previous one.
  egress_->Set(a, "host", 5);
  svc_->RunTimersOnce(wall + 20s, mono);
  svc_->RunTimersOnce(wall + 30s, mono);
  EXPECT_EQ(Metric(series(a, "host")), "5");

  // After a restart the counts found are a baseline, not new denials: the new process's
  // series start again (as any counter of a restarted process does).
  egress_->Set(a, "host", 8);
  Stop();
  Start();
  svc_->RunTimersOnce(wall + 40s, mono);
  EXPECT_EQ(Metric(series(a, "host")), "");
  EXPECT_EQ(Metric(series(a, "dns_name")), "");
  egress_->Set(a, "host", 9);
  svc_->RunTimersOnce(wall + 45s, mono);
  EXPECT_EQ(Metric(series(a, "host")), "1");

  // A delete reads the sandbox a last time before destroying it; its series stay for the
  // scrapers to read the last count, then go.
  egress_->Set(a, "host", 10);
  auto del = svc_->DeleteSandbox(caller_, a, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(Metric(series(a, "host")), "2");
  egress_->Set(b, "host", 6);
  const auto after_delete = ActivityTracker::Clock::now();
  svc_->RunTimersOnce(wall + 50s, after_delete + ServiceMetrics::kEgressLinger - 1s);
  EXPECT_EQ(Metric(series(a, "host")), "2");
  EXPECT_EQ(Metric(series(b, "host")), "2");
  svc_->RunTimersOnce(wall + 55s, after_delete + ServiceMetrics::kEgressLinger);
  EXPECT_EQ(registry_.Expose().find("sandbox=\"" + a + "\""), std::string::npos);
  EXPECT_EQ(Metric(series(b, "host")), "2");

  // A runtime that cannot count (the fake) adds nothing and breaks nothing.
  const std::string f = CreateRunning("fake");
  svc_->RunTimersOnce(wall + 60s, after_delete + ServiceMetrics::kEgressLinger);
  EXPECT_EQ(registry_.Expose().find("sandbox=\"" + f + "\""), std::string::npos);
  EXPECT_EQ(Metric(series(b, "host")), "2");
}

TEST_F(SandboxServiceTest, InteractiveSessionSpecAndTimedOutExitSurviveARestart) {
  const std::string id = CreateRunning();
  CreateSessionRequest req;
  req.argv = {"bash"};
  req.tty = true;
  req.tty_cols = 120;
  req.timeout_s = 30;
  req.kill_grace_s = 2;
  req.canonical = json{{"argv", req.argv}, {"tty", true}};
  auto r = svc_->CreateSession(caller_, id, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string sid = Body(*r)["session_id"];
  auto s = svc_->GetSession(caller_, sid);
  ASSERT_TRUE(s.ok());
  // What the agent gets at the first attach (protocol.h); a tty always has stdin.
  EXPECT_EQ(s->spec["tty"], (json{{"rows", 24}, {"cols", 120}}));
  EXPECT_EQ(s->spec["stdin"], true);
  EXPECT_EQ(s->spec["timeout_s"], 30);
  EXPECT_EQ(s->spec["kill_grace_s"], 2);

  CreateSessionRequest plain_req;
  plain_req.argv = {"true"};
  plain_req.canonical = json{{"argv", plain_req.argv}, {"n", 2}};
  auto plain = svc_->CreateSession(caller_, id, plain_req, std::nullopt);
  ASSERT_TRUE(plain.ok());
  auto ps = svc_->GetSession(caller_, Body(*plain)["session_id"]);
  ASSERT_TRUE(ps.ok());
  EXPECT_FALSE(ps->spec.contains("tty") || ps->spec.contains("stdin") ||
               ps->spec.contains("timeout_s"))
      << ps->spec;

  // The agent reported the timeout while no client was attached (GET /v1/sessions path).
  svc_->RecordSessionStarted(sid, true);
  SessionStatus timed_out;
  timed_out.state = "exited";
  timed_out.signal = "SIGTERM";
  timed_out.timed_out = true;
  timed_out.exited_at = "2026-01-02T03:04:05.000Z";
  svc_->RecordSessionStatus(sid, timed_out);
  Stop();
  Start();
  auto after = svc_->GetSession(caller_, sid);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state, "exited");
  EXPECT_TRUE(after->timed_out);
  EXPECT_EQ(after->signal, "SIGTERM");
  EXPECT_EQ(after->exited_at, "2026-01-02T03:04:05.000Z");
}

// ---- admission ------------------------------------------------------------------------------

class AdmissionServiceTest : public SandboxServiceTest {
 protected:
  // A host with room for `n` sandboxes of the default 512 MiB (no ratio, no reserve).
  void StartWithRoomFor(int n) {
    Stop();
    admission_ = AdmissionSettings{};
    admission_.cpu_overcommit_percent = 100;
    admission_.memory_overcommit_percent = 100;
    admission_.disk_overcommit_percent = 100;
    admission_.reserve_memory_mib = 0;
    admission_.reserve_disk_mib = 0;
    host_ = HostCapacity{1000, n * 512, 1 << 30};
    Start();
  }
  absl::StatusOr<json> TryCreate(const std::string& runtime = "fake",
                                 std::optional<int> memory_mib = std::nullopt,
                                 std::optional<int> vcpu = std::nullopt) {
    CreateSandboxRequest req;
    req.runtime = runtime;
    req.memory_mib = memory_mib;
    req.vcpu = vcpu;
    req.canonical = json{{"runtime", runtime}, {"m", memory_mib ? *memory_mib : 0},
                         {"v", vcpu ? *vcpu : 0}};
    SBX_ASSIGN_OR_RETURN(auto r, svc_->CreateSandbox(caller_, req, std::nullopt));
    return Body(r);
  }
  size_t Listed() {
    store::SandboxFilter f;
    auto page = svc_->ListSandboxes(caller_, f);
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? page->items.size() : 0;
  }
  void Delete(const std::string& id) {
    auto r = svc_->DeleteSandbox(caller_, id, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(WaitOp(Body(*r)["operation"]["id"]).state, "succeeded");
  }
};

TEST_F(AdmissionServiceTest, RefusesWhatDoesNotFitBeforeAnythingIsRecordedAndDeletesGiveBack) {
  StartWithRoomFor(3);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(CreateRunning());
  auto full = TryCreate();
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(ApiErrorCode(full.status()), "insufficient_capacity") << full.status();
  EXPECT_EQ(ApiErrorDetail(full.status(), "resource"), "memory");
  EXPECT_EQ(ApiErrorDetail(full.status(), "available"), "0");
  EXPECT_EQ(Listed(), 3u);  // no row, no operation for the refused one
  // Bigger than the whole host: 422, whatever is free.
  auto never = TryCreate("fake", 4096);
  EXPECT_EQ(ApiErrorCode(never.status()), "exceeds_capacity") << never.status();
  EXPECT_EQ(svc_->AdmissionSnapshot().reserved.memory_mib, 3 * 512);

  Delete(ids[0]);
  EXPECT_EQ(svc_->AdmissionSnapshot().reserved.memory_mib, 2 * 512);
  ids[0] = CreateRunning();
  EXPECT_FALSE(TryCreate().ok());

  // A smaller sandbox fits where a default one does not; a reload with a larger ratio makes
  // room without a restart.
  Delete(ids[1]);
  auto small = TryCreate("fake", 256);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(WaitOp((*small)["operation"]["id"]).state, "succeeded");
  EXPECT_EQ(ApiErrorCode(TryCreate().status()), "insufficient_capacity");
  LiveOptions live;
  live.admission = admission_;
  live.admission.memory_overcommit_percent = 200;
  ASSERT_TRUE(svc_->Reconfigure(live).ok());
  EXPECT_TRUE(TryCreate().ok());
}

TEST_F(AdmissionServiceTest, AFailedCreateGivesItsCapacityBack) {
  StartWithRoomFor(1);
  auto failed = TryCreate("failing");
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(WaitOp((*failed)["operation"]["id"]).state, "failed");
  EXPECT_EQ(StateOf((*failed)["sandbox"]["id"]), kFailed);
  EXPECT_EQ(svc_->AdmissionSnapshot().reserved.memory_mib, 0);
  CreateRunning();
}

TEST_F(AdmissionServiceTest, ConcurrentCreatesNeverOvershoot) {
  StartWithRoomFor(4);
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 12; ++t) {
    threads.emplace_back([&] {
      auto r = TryCreate();
      if (r.ok()) {
        ok.fetch_add(1);
      } else {
        EXPECT_EQ(ApiErrorCode(r.status()), "insufficient_capacity") << r.status();
        refused.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(refused.load(), 8);
  EXPECT_EQ(Listed(), 4u);
  EXPECT_EQ(svc_->AdmissionSnapshot().reserved.memory_mib, 4 * 512);
}

TEST_F(AdmissionServiceTest, ARestartRecomputesTheLedgerFromTheStore) {
  StartWithRoomFor(3);
  const std::string paused = CreateRunning();
  CreateRunning();
  Do(paused, "pause");
  auto failed = TryCreate("failing");
  ASSERT_TRUE(failed.ok());
  WaitOp((*failed)["operation"]["id"]);
  Stop();
  Start();
  // Paused and running sandboxes hold their memory; the failed one does not.
  Admission::Snapshot snap = svc_->AdmissionSnapshot();
  EXPECT_EQ(snap.reserved.memory_mib, 2 * 512);
  EXPECT_EQ(snap.holders, 2);
  CreateRunning();
  EXPECT_EQ(ApiErrorCode(TryCreate().status()), "insufficient_capacity");
}

TEST_F(AdmissionServiceTest, WarmPoolMembersHoldCapacityAndAFullHostMakesThePoolWait) {
  warm_pools_ = {WarmPoolConfig{"fake", "base", 1}};
  StartWithRoomFor(2);
  svc_->StartWarmPools();
  auto ready = [&] { return svc_->WarmPoolReady()["fake/base"]; };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (ready() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the pool never filled";
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(svc_->AdmissionSnapshot().reserved.memory_mib, 512);
  // A cold sandbox takes the rest; then a default create is served by the pool member (which
  // holds its capacity already) and the refill has no room: it waits.
  auto cold = TryCreate("fake", std::nullopt, 2);
  ASSERT_TRUE(cold.ok()) << cold.status();
  ASSERT_EQ(WaitOp((*cold)["operation"]["id"]).state, "succeeded");
  auto warm = TryCreate("fake");
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ((*warm)["operation"]["result"], json({{"warm_pool", true}})) << *warm;
  EXPECT_EQ(ApiErrorCode(TryCreate("fake", 256).status()), "insufficient_capacity");
  Admission::Snapshot snap = svc_->AdmissionSnapshot();
  EXPECT_EQ(snap.reserved.memory_mib, 2 * 512);
  EXPECT_EQ(snap.holders, 2);
  EXPECT_EQ(ready(), 0);
  // A delete makes room: the waiting pool refills into it.
  Delete((*cold)["sandbox"]["id"]);
  while (ready() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline + 30s) << "the pool did not refill";
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(svc_->AdmissionSnapshot().reserved.memory_mib, 2 * 512);
}

}  // namespace
}  // namespace sbx::service

namespace sbx::service {
namespace {

class SandboxTimersTest : public SandboxServiceTest {
 protected:
  std::string Create(std::optional<int64_t> timeout_s, std::optional<int64_t> idle_s) {
    CreateSandboxRequest req;
    req.runtime = "fake";
    req.timeout_s = timeout_s;
    req.idle_suspend_s = idle_s;
    req.canonical = json{{"runtime", "fake"}, {"timeout_s", timeout_s ? json(*timeout_s) : json()},
                         {"idle_suspend_s", idle_s ? json(*idle_s) : json()}};
    auto r = svc_->CreateSandbox(caller_, req, std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    json body = Body(*r);
    EXPECT_EQ(WaitOp(body["operation"]["id"]).state, "succeeded");
    return body["sandbox"]["id"];
  }
  // The operation the timers started on `id` (its newest), waited for. Found in the sandbox's
  // operation history, not as its operation in flight: a fast delete may have finished, and
  // cleared that, before the test looks.
  store::OperationRecord TimerOp(const std::string& id) {
    std::string op_id;
    EXPECT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(std::vector<store::OperationRecord> ops, tx.ListOperations(id));
      if (ops.size() >= 2) op_id = ops.back().id;  // the first is the create
      return absl::OkStatus();
    }).ok());
    EXPECT_FALSE(op_id.empty()) << id << ": the timers started no operation";
    if (op_id.empty()) return {};
    return WaitOp(op_id);
  }
  std::chrono::system_clock::time_point wall_ = std::chrono::system_clock::now();
  ActivityTracker::Clock::time_point mono_ = ActivityTracker::Clock::now();
};

TEST_F(SandboxTimersTest, TtlDeletesTheSandboxAtItsDeadlineAndNotBefore) {
  const std::string id = Create(60, 0);
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->timeout_s, 60);
  EXPECT_EQ(ExpiresAt(*sb), FormatRfc3339(*ParseRfc3339(sb->created_at) + 60s));
  svc_->RunTimersOnce(wall_ + 55s, mono_);
  EXPECT_EQ(StateOf(id), kRunning);
  svc_->RunTimersOnce(wall_ + 61s, mono_);
  store::OperationRecord op = TimerOp(id);
  EXPECT_EQ(op.kind, "delete");
  EXPECT_EQ(op.initiator, "ttl");
  EXPECT_EQ(op.state, "succeeded");
  EXPECT_EQ(StateOf(id), kDeleted);
}

TEST_F(SandboxTimersTest, DeploymentDefaultTtlAppliesWhenTheRequestHasNone) {
  Stop();
  default_timeout_s_ = 30;
  Start();
  const std::string with_default = Create(std::nullopt, 0);
  const std::string own = Create(3600, 0);
  auto sb = svc_->GetSandbox(caller_, with_default);
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->timeout_s, 30);
  svc_->RunTimersOnce(wall_ + 31s, mono_);
  EXPECT_EQ(TimerOp(with_default).initiator, "ttl");
  EXPECT_EQ(StateOf(with_default), kDeleted);
  EXPECT_EQ(StateOf(own), kRunning);
}

TEST_F(SandboxTimersTest, IdleSandboxIsSuspendedUnlessAStreamIsOpen) {
  const std::string id = Create(std::nullopt, 30);
  const std::string never = Create(std::nullopt, 0);
  // A call on the sandbox restarts its idle count.
  ASSERT_TRUE(svc_->GetSandbox(caller_, id).ok());
  const auto touched = ActivityTracker::Clock::now();
  {
    auto stream = svc_->activity().StreamOpened(id);
    svc_->RunTimersOnce(wall_, touched + 1h);
    EXPECT_EQ(StateOf(id), kRunning);
  }
  const auto closed = ActivityTracker::Clock::now();
  svc_->RunTimersOnce(wall_, closed + 20s);
  EXPECT_EQ(StateOf(id), kRunning);
  svc_->RunTimersOnce(wall_, closed + 31s);
  store::OperationRecord op = TimerOp(id);
  EXPECT_EQ(op.kind, "suspend");
  EXPECT_EQ(op.initiator, "idle");
  EXPECT_EQ(op.state, "succeeded") << op.error.dump();
  EXPECT_EQ(StateOf(id), kSuspended);
  EXPECT_EQ(StateOf(never), kRunning);
  // A suspended sandbox is left alone by later ticks, and wakes on request.
  svc_->RunTimersOnce(wall_, closed + 1h);
  EXPECT_EQ(StateOf(id), kSuspended);
  Do(id, "wake");
  EXPECT_EQ(StateOf(id), kRunning);
}

TEST_F(SandboxTimersTest, RetentionPurgesDeletedSandboxesOnly) {
  const std::string gone = CreateRunning();
  const std::string kept = CreateRunning();
  auto r = svc_->DeleteSandbox(caller_, gone, std::nullopt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(WaitOp(Body(*r)["operation"]["id"]).state, "succeeded");
  svc_->RunTimersOnce(wall_ + 24h, mono_);  // inside the 7-day retention
  EXPECT_EQ(StateOf(gone), kDeleted);
  svc_->RunTimersOnce(wall_ + 8 * 24h, mono_);
  EXPECT_TRUE(absl::IsNotFound(svc_->GetSandbox(caller_, gone).status()));
  EXPECT_EQ(StateOf(kept), kRunning);
}

}  // namespace
// A dead agent is noticed by the timers, with no client asking: the sandbox is failed with the
// reason, its unfinished sessions ended with an error, and it deletes cleanly. Once only.
TEST_F(SandboxServiceTest, DeadAgentFailsTheSandboxAndItsSessions) {
  const std::string id = CreateRunning("mortal");
  auto session = [&]() -> std::string {
    CreateSessionRequest req;
    req.argv = {"sleep", "100"};
    req.canonical = json{{"argv", req.argv}, {"n", NewId("x")}};
    auto r = svc_->CreateSession(caller_, id, req, std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? Body(*r)["session_id"].get<std::string>() : "";
  };
  const std::string running = session(), created = session();
  svc_->RecordSessionStarted(running, true);
  EXPECT_EQ(Metric("sbx_sessions_active"), "1");
  const auto wall = std::chrono::system_clock::now();
  const auto mono = ActivityTracker::Clock::now();
  svc_->RunTimersOnce(wall, mono);
  EXPECT_EQ(svc_->GetSandbox(caller_, id)->state, "running");
  EXPECT_FALSE(svc_->CheckAgentLost(id).has_value());

  mortal_->Kill(id);
  EXPECT_FALSE(svc_->AgentSocketFor(id).has_value());  // at once, before any tick
  svc_->RunTimersOnce(wall + 1s, mono);
  auto sb = svc_->GetSandbox(caller_, id);
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->state, "failed");
  EXPECT_EQ(sb->error.value("code", ""), "agent_lost");
  EXPECT_NE(sb->error.value("message", "").find("killed by SIGKILL"), std::string::npos) << sb->error;
  auto r = svc_->GetSession(caller_, running);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, "exited");
  EXPECT_EQ(r->signal.value_or(""), "SIGKILL");
  EXPECT_EQ(r->error.value("code", ""), "sandbox_failed");
  auto c = svc_->GetSession(caller_, created);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state, "exited");
  EXPECT_FALSE(c->signal.has_value());
  EXPECT_EQ(c->error.value("code", ""), "sandbox_failed");
  EXPECT_EQ(Metric("sbx_sessions_active"), "0");

  // Later ticks change nothing; attach and new sessions say why.
  const std::string updated = sb->updated_at;
  svc_->RunTimersOnce(wall + 2s, mono);
  EXPECT_EQ(svc_->GetSandbox(caller_, id)->updated_at, updated);
  auto attach = svc_->PrepareAttach(caller_, running);
  ASSERT_FALSE(attach.ok());
  EXPECT_NE(std::string(attach.status().message()).find("failed"), std::string::npos) << attach.status();
  CreateSessionRequest req;
  req.argv = {"true"};
  req.canonical = json{{"argv", req.argv}};
  EXPECT_EQ(svc_->CreateSession(caller_, id, req, std::nullopt).status().code(),
            absl::StatusCode::kFailedPrecondition);

  auto del = svc_->DeleteSandbox(caller_, id, std::nullopt);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(WaitOp(Body(*del)["operation"]["id"]).state, "succeeded");
}

}  // namespace sbx::service

namespace sbx::service {

// The first attach after create uses the record just committed: it must answer exactly as the
// store would, to the right tenant and session scope only, and later attaches as well.
TEST_F(SandboxServiceTest, AttachRightAfterCreateAnswersAsTheStoreDoes) {
  const std::string id = CreateRunning();
  CreateSessionRequest req;
  req.argv = {"echo", "hi"};
  req.canonical = json{{"argv", req.argv}};
  auto r = svc_->CreateSession(caller_, id, req, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string ses = Body(*r)["session_id"].get<std::string>();
  EXPECT_TRUE(absl::IsNotFound(svc_->PrepareAttach(Caller{"other", std::nullopt}, ses).status()));
  EXPECT_TRUE(absl::IsNotFound(
      svc_->PrepareAttach(Caller{"default", std::string("ses_other")}, ses).status()));
  for (int round = 0; round < 2; ++round) {
    auto t = svc_->PrepareAttach(caller_, ses);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->session.id, ses);
    EXPECT_EQ(t->session.sandbox_id, id);
    EXPECT_EQ(t->session.state, "created");
    EXPECT_EQ(t->spec.argv, req.argv);
  }
  // A second fresh session whose first attach is the owner's.
  auto r2 = svc_->CreateSession(caller_, id, req, std::nullopt);
  ASSERT_TRUE(r2.ok()) << r2.status();
  auto t2 = svc_->PrepareAttach(caller_, Body(*r2)["session_id"].get<std::string>());
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->spec.argv, req.argv);
}

}  // namespace sbx::service

#include "service/tenancy.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_util.h"
#include "common/time_util.h"
#include "store/sqlite_store.h"

namespace sbx::service {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::system_clock;

class TenancyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-tenancy-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto s = store::OpenSqliteStore((dir_ / "sbx.db").string(), registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    tenancy_ = std::make_unique<Tenancy>(*store_, TenancyOptions{});
    op_ = tenancy_->Bootstrap().caller;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string NewTenant(json quotas = json::object(), json rate = json::object()) {
    TenantSpec spec;
    spec.name = "t";
    spec.quotas = quotas;
    spec.rate_limit = rate;
    auto t = tenancy_->CreateTenant(op_, spec);
    EXPECT_TRUE(t.ok()) << t.status();
    return (*t)["tenant"]["id"];
  }

  json NewToken(const std::string& tenant, std::vector<std::string> scopes,
                std::optional<int64_t> expires = std::nullopt, const Caller* by = nullptr) {
    TokenSpec spec{"t", std::move(scopes), expires};
    auto t = tenancy_->CreateToken(by ? *by : op_, tenant, spec);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? (*t)["token"] : json();
  }

  void PutSandbox(const std::string& id, const std::string& tenant, const std::string& state,
                  int64_t vcpu, int64_t mem, int64_t disk) {
    store::SandboxRecord sb;
    sb.id = id;
    sb.tenant_id = tenant;
    sb.state = state;
    sb.template_ref = "base";
    sb.template_digest = "sha256:x";
    sb.runtime = "fake";
    sb.egress_profile = "none";
    sb.effective_resources = {{"vcpu", vcpu}, {"memory_mib", mem}, {"disk_mib", disk}};
    sb.created_at = sb.updated_at = NowRfc3339();
    ASSERT_TRUE(store_->Transact([&](store::Tx& tx) { return tx.PutSandbox(sb); }).ok());
  }

  absl::Status Check(const std::string& tenant, int64_t vcpu, int64_t mem, int64_t disk,
                     bool new_sandbox = true) {
    runtime::Resources r;
    r.vcpu = vcpu;
    r.memory_mib = mem;
    r.disk_mib = disk;
    return store_->Transact(
        [&](store::Tx& tx) { return CheckSandboxQuota(tx, tenant, r, new_sandbox); });
  }

  fs::path dir_;
  metrics::Registry registry_;
  store::StorePtr store_;
  std::unique_ptr<Tenancy> tenancy_;
  Caller op_;
};

TEST_F(TenancyTest, ATokenAuthenticatesUntilRevokedOrExpired) {
  const std::string ten = NewTenant();
  json tok = NewToken(ten, {"read", "files"});
  const auto now = system_clock::now();
  auto p = tenancy_->Authenticate(tok["token"].get<std::string>(), now);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->caller.tenant_id, ten);
  EXPECT_EQ(p->caller.token_id, tok["id"]);
  EXPECT_TRUE(HasScope(p->caller.scopes, Scope::kFiles));
  EXPECT_FALSE(HasScope(p->caller.scopes, Scope::kSandboxes));
  // One byte off the secret: unauthenticated, and the message does not say the id exists.
  std::string wrong = tok["token"];
  char& c = wrong[wrong.size() - 10];  // inside the secret, where any base64url letter may be
  c = c == 'a' ? 'b' : 'a';
  auto bad = tenancy_->Authenticate(wrong, now);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(bad.status().message(), "invalid token");
  ASSERT_TRUE(tenancy_->RevokeToken(op_, tok["id"]).ok());
  EXPECT_EQ(tenancy_->Authenticate(tok["token"].get<std::string>(), now).status().message(),
            "token revoked");
  json exp = NewToken(ten, {"read"}, 60);
  EXPECT_TRUE(tenancy_->Authenticate(exp["token"].get<std::string>(), now).ok());
  EXPECT_EQ(tenancy_->Authenticate(exp["token"].get<std::string>(), now + std::chrono::seconds(61))
                .status()
                .message(),
            "token expired");
}

TEST_F(TenancyTest, ScopesNeverWidenAndOtherTenantsAreNotFound) {
  const std::string a = NewTenant(), b = NewTenant();
  json admin_a = NewToken(a, {"admin"});
  auto pa = tenancy_->Authenticate(admin_a["token"].get<std::string>(), system_clock::now());
  ASSERT_TRUE(pa.ok());
  // A tenant's admin mints within its own tenant only, and sees only itself.
  EXPECT_TRUE(tenancy_->CreateToken(pa->caller, a, TokenSpec{"x", {"read"}, {}}).ok());
  EXPECT_TRUE(absl::IsNotFound(tenancy_->CreateToken(pa->caller, b, TokenSpec{"x", {"read"}, {}}).status()));
  EXPECT_TRUE(absl::IsNotFound(tenancy_->GetTenant(pa->caller, b).status()));
  auto list = tenancy_->ListTenants(pa->caller);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ((*list)["tenants"].size(), 1u);
  EXPECT_EQ((*list)["tenants"][0]["id"], a);
  EXPECT_EQ(tenancy_->CreateTenant(pa->caller, TenantSpec{"x", {}, {}}).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A read-only token cannot mint a files token.
  json ro = NewToken(a, {"read", "admin"});
  auto pro = tenancy_->Authenticate(ro["token"].get<std::string>(), system_clock::now());
  Caller reader = pro->caller;
  reader.scopes = static_cast<Scopes>(Scope::kRead);
  auto widened = tenancy_->CreateToken(reader, a, TokenSpec{"x", {"files"}, {}});
  EXPECT_EQ(ApiErrorCode(widened.status()), "missing_scope");
  // Another tenant's token id is 404 to get and to revoke.
  json tb = NewToken(b, {"read"});
  EXPECT_TRUE(absl::IsNotFound(tenancy_->GetToken(pa->caller, tb["id"]).status()));
  EXPECT_TRUE(absl::IsNotFound(tenancy_->RevokeToken(pa->caller, tb["id"]).status()));
}

TEST_F(TenancyTest, QuotasCountWhatEachStateHolds) {
  const std::string t = NewTenant({{"max_sandboxes", 3}, {"max_vcpu", 4}, {"max_disk_mib", 300}});
  PutSandbox("sbx_aaaaaaaaaaaaaaaaaaaa", t, "running", 1, 100, 100);
  PutSandbox("sbx_bbbbbbbbbbbbbbbbbbbb", t, "suspended", 2, 100, 100);  // disk only
  PutSandbox("sbx_cccccccccccccccccccc", t, "deleted", 8, 100, 100);    // nothing
  PutSandbox("sbx_dddddddddddddddddddd", "other", "running", 8, 100, 100);
  // vcpu: 1 held, 3 more fit, 4 do not.
  EXPECT_TRUE(Check(t, 3, 0, 0).ok());
  absl::Status over = Check(t, 4, 0, 0);
  EXPECT_EQ(ApiErrorCode(over), "quota_exceeded");
  EXPECT_EQ(ApiErrorDetail(over, "quota"), "max_vcpu");
  EXPECT_EQ(ApiErrorDetail(over, "limit"), "4");
  EXPECT_EQ(ApiErrorDetail(over, "used"), "1");
  // disk: the suspended one's counts.
  EXPECT_EQ(ApiErrorDetail(Check(t, 0, 0, 101), "quota"), "max_disk_mib");
  EXPECT_TRUE(Check(t, 0, 0, 100).ok());
  // Waking the suspended one adds its vcpu, not another sandbox.
  EXPECT_TRUE(Check(t, 2, 100, 0, /*new_sandbox=*/false).ok());
  PutSandbox("sbx_eeeeeeeeeeeeeeeeeeee", t, "paused", 0, 0, 0);
  EXPECT_EQ(ApiErrorDetail(Check(t, 0, 0, 0), "quota"), "max_sandboxes");
  // Exactly at a limit is allowed; a tenant without quotas has none.
  EXPECT_TRUE(Check(NewTenant(), 1000, 1000000, 1000000).ok());
}

TEST_F(TenancyTest, TemplateUsageCountsNamesAndDistinctReleasesOfItsNamespace) {
  const std::string t = NewTenant({{"max_templates", 2}, {"max_template_bytes", 300}});
  std::vector<store::TagRecord> tags = {
      {t + "/a", "latest", "sha256:1", ""}, {t + "/a", "v2", "sha256:1", ""},  // one release
      {t + "/b", "latest", "sha256:2", ""},
      {"shared", "latest", "sha256:3", ""},  // the operator's: not the tenant's
      {"ten_other/a", "latest", "sha256:4", ""}};
  auto size = [](const std::string& d) -> int64_t {
    return d == "sha256:1" ? 100 : d == "sha256:2" ? 150 : 1000;
  };
  TemplateUsage u = UsageOfNamespace(t, tags, std::nullopt, size);
  EXPECT_EQ(u.names, 2);
  EXPECT_EQ(u.bytes, 250);
  // Moving a tag replaces it; a new tag of a counted release adds no bytes.
  u = UsageOfNamespace(t, tags, store::TagRecord{t + "/b", "latest", "sha256:1", ""}, size);
  EXPECT_EQ(u.names, 2);
  EXPECT_EQ(u.bytes, 100);
  u = UsageOfNamespace("", tags, std::nullopt, size);
  EXPECT_EQ(u.names, 1);
  EXPECT_EQ(u.bytes, 1000);

  auto check = [&](TemplateUsage now, TemplateUsage after) {
    return store_->Transact(
        [&](store::Tx& tx) { return CheckTemplateQuota(tx, t, now, after); });
  };
  EXPECT_TRUE(check({2, 250}, {2, 300}).ok());  // exactly at both limits
  absl::Status over = check({2, 250}, {3, 250});
  EXPECT_EQ(ApiErrorCode(over), "quota_exceeded");
  EXPECT_EQ(ApiErrorDetail(over, "quota"), "max_templates");
  EXPECT_EQ(ApiErrorDetail(over, "used"), "2");
  over = check({2, 250}, {2, 301});
  EXPECT_EQ(ApiErrorDetail(over, "quota"), "max_template_bytes");
  EXPECT_EQ(ApiErrorDetail(over, "requested"), "51");
  // A tenant over a lowered quota may still shrink, or stay as it is.
  EXPECT_TRUE(check({5, 900}, {4, 800}).ok());
  EXPECT_TRUE(check({5, 900}, {5, 900}).ok());
  // A tenant being deleted, or gone, takes no new template.
  EXPECT_EQ(ApiErrorCode(store_->Transact([&](store::Tx& tx) {
              return CheckTemplateQuota(tx, "ten_gone", {0, 0}, {1, 1});
            })),
            "tenant_deleting");
}

TEST_F(TenancyTest, EgressProfilesPerTenant) {
  const std::string all = NewTenant();
  TenantSpec spec;
  spec.name = "limited";
  spec.egress_profiles = json::array({"lab"});
  auto made = tenancy_->CreateTenant(op_, spec);
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string limited = (*made)["tenant"]["id"];
  EXPECT_EQ((*made)["tenant"]["egress_profiles"], json::array({"lab"}));
  auto check = [&](const std::string& t, const std::string& p) {
    return store_->Transact([&](store::Tx& tx) { return CheckEgressProfile(tx, t, p); });
  };
  for (const char* p : {"none", "open", "lab", "anything"}) EXPECT_TRUE(check(all, p).ok()) << p;
  EXPECT_TRUE(check(limited, "lab").ok());
  EXPECT_TRUE(check(limited, "none").ok());  // always
  absl::Status refused = check(limited, "open");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApiErrorField(refused), "egress_profile");
  EXPECT_NE(std::string(refused.message()).find("unknown profile 'open' (available: lab, none)"),
            std::string::npos)
      << refused;
  // null gives every profile back; [] leaves `none` alone.
  TenantSpec change;
  change.egress_profiles = json::array();
  ASSERT_TRUE(tenancy_->UpdateTenant(op_, limited, change).ok());
  EXPECT_FALSE(check(limited, "lab").ok());
  EXPECT_TRUE(check(limited, "none").ok());
  change.egress_profiles = json(nullptr);
  ASSERT_TRUE(tenancy_->UpdateTenant(op_, limited, change).ok());
  EXPECT_TRUE(check(limited, "open").ok());
  auto got = tenancy_->GetTenant(op_, limited);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE((*got)["tenant"]["egress_profiles"].is_null());
  EXPECT_EQ((*got)["tenant"]["usage"]["templates"], 0);
  EXPECT_EQ((*got)["tenant"]["usage"]["template_bytes"], 0);
}

TEST_F(TenancyTest, ADeletingTenantStopsAuthenticatingAndGoesWhenEmpty) {
  const std::string t = NewTenant();
  json tok = NewToken(t, {"read"});
  PutSandbox("sbx_ffffffffffffffffffff", t, "running", 1, 1, 1);
  auto live = tenancy_->BeginDeleteTenant(op_, t);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(*live, std::vector<std::string>{"sbx_ffffffffffffffffffff"});
  EXPECT_EQ(tenancy_->Authenticate(tok["token"].get<std::string>(), system_clock::now())
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ApiErrorCode(Check(t, 0, 0, 0)), "tenant_deleting");
  EXPECT_EQ(*tenancy_->FinishDeletions(), 0);  // a sandbox is left
  PutSandbox("sbx_ffffffffffffffffffff", t, "deleted", 1, 1, 1);
  EXPECT_EQ(*tenancy_->FinishDeletions(), 1);
  EXPECT_TRUE(absl::IsNotFound(tenancy_->GetTenant(op_, t).status()));
  EXPECT_EQ(tenancy_->BeginDeleteTenant(op_, kOperatorTenant).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(TenancyTest, AuditRowsAreListedByTenantAndPaged) {
  const std::string a = NewTenant(), b = NewTenant();
  for (int i = 0; i < 5; ++i) {
    store::AuditRecord r;
    r.tenant_id = i % 2 ? a : b;
    r.token_id = "tok_x";
    r.action = "POST /v1/sandboxes";
    r.status = 202;
    r.request_id = "req";
    tenancy_->Audit(r);
  }
  store::AuditFilter f;
  f.limit = 2;
  auto page = tenancy_->ListAudit(op_, f);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ((*page)["audit"].size(), 2u);
  ASSERT_TRUE((*page)["next_page_token"].is_string());
  json admin_a = NewToken(a, {"admin"});
  auto pa = tenancy_->Authenticate(admin_a["token"].get<std::string>(), system_clock::now());
  f.limit = 100;
  auto mine = tenancy_->ListAudit(pa->caller, f);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ((*mine)["audit"].size(), 2u);
  for (const auto& r : (*mine)["audit"]) EXPECT_EQ(r["tenant_id"], a);
  f.tenant_id = b;
  EXPECT_TRUE(absl::IsNotFound(tenancy_->ListAudit(pa->caller, f).status()));
}

}  // namespace
// Lines from many request threads, more than the queue holds at once (Add waits for room):
// every one is stored once, in the order each thread added its own, and a listing sees them
// all (ListAudit flushes).
TEST_F(TenancyTest, AuditLinesFromManyThreadsAreAllStoredOnceAndListed) {
  constexpr int kThreads = 4;
  const int per_thread = static_cast<int>(AuditWriter::kMaxQueued);  // 4x what the queue holds
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        store::AuditRecord r;
        r.tenant_id = kOperatorTenant;
        r.token_id = "tok_x";
        r.action = "POST /v1/sandboxes";
        r.status = 202;
        r.request_id = "req_" + std::to_string(t) + "_" + std::to_string(i);
        tenancy_->Audit(r);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<int> next(kThreads, 0);
  int64_t rows = 0;
  store::AuditFilter f;
  f.limit = 500;
  for (;;) {
    auto page = tenancy_->ListAudit(op_, f);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& r : (*page)["audit"]) {
      const std::string rid = r["request_id"];
      const int t = rid[4] - '0';
      const int i = std::stoi(rid.substr(6));
      ASSERT_EQ(i, next[t]) << rid;  // each thread's lines in its order, none twice
      ++next[t];
      ++rows;
    }
    if (!(*page)["next_page_token"].is_string()) break;
    f.after_seq = std::stoll((*page)["next_page_token"].get<std::string>());  // the last seq
  }
  EXPECT_EQ(rows, int64_t{kThreads} * per_thread);
}

// A writer that goes away commits what it still holds first (sbxd's shutdown).
TEST_F(TenancyTest, AuditWriterCommitsWhatItHoldsWhenItGoes) {
  {
    AuditWriter writer(*store_);
    for (int i = 0; i < 300; ++i) {
      store::AuditRecord r;
      r.time = "2026-01-01T00:00:00.000Z";
      r.tenant_id = kOperatorTenant;
      r.action = "DELETE /v1/sandboxes/x";
      r.status = 202;
      r.request_id = "req_gone_" + std::to_string(i);
      writer.Add(r);
    }
  }
  store::AuditFilter f;
  f.limit = 1000;
  auto rows = store_->Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(auto got, tx.ListAudit(f));
    EXPECT_EQ(got.size(), 300u);
    return absl::OkStatus();
  });
  EXPECT_TRUE(rows.ok()) << rows;
}

// A store that refuses every transaction (PostgreSQL gone), counting the tries; each try
// takes `delay`, as a connect that times out does.
class RefusingStore : public store::Store {
 public:
  explicit RefusingStore(std::chrono::milliseconds delay = {}) : delay_(delay) {}
  absl::Status Transact(const std::function<absl::Status(store::Tx&)>&) override {
    ++tries;
    std::this_thread::sleep_for(delay_);
    return absl::UnavailableError("store: connect: the server is gone");
  }
  std::atomic<int> tries{0};

 private:
  const std::chrono::milliseconds delay_;
};

// Refused lines are logged as not stored and count as done: Flush returns, and a stopping
// writer does not wait on the refusing store once more per batch.
TEST_F(TenancyTest, AuditWriterWithARefusingStoreNeitherHangsNorRetries) {
  RefusingStore refusing;
  {
    AuditWriter writer(refusing);
    for (int i = 0; i < 600; ++i) {
      store::AuditRecord r;
      r.time = "2026-01-01T00:00:00.000Z";
      r.action = "POST /v1/sandboxes";
      r.request_id = "req_refused_" + std::to_string(i);
      writer.Add(r);
    }
    writer.Flush();  // returns: refused lines count as done (logged "not stored")
    EXPECT_GE(refusing.tries.load(), 3);  // 600 lines: batches of 256 at most
  }

  // Stopping with 2,000 lines queued (8 batches): the batch being tried when the stop comes
  // is the last try; the rest go to the log alone instead of 8 tries of a connect timeout.
  RefusingStore slow(std::chrono::milliseconds(200));
  {
    AuditWriter writer(slow);
    for (int i = 0; i < 2000; ++i) {
      store::AuditRecord r;
      r.action = "POST /v1/sandboxes";
      r.request_id = "req_stopping_" + std::to_string(i);
      writer.Add(r);
    }
  }
  EXPECT_LE(slow.tries.load(), 2);
}

// The real store behind a count of its transactions.
class CountingStore : public store::Store {
 public:
  explicit CountingStore(store::Store& inner) : inner_(inner) {}
  absl::Status Transact(const std::function<absl::Status(store::Tx&)>& fn) override {
    ++transactions;
    return inner_.Transact(fn);
  }
  std::atomic<int> transactions{0};

 private:
  store::Store& inner_;
};

// Lines that arrive one at a time (a client's request loop) share a transaction: the first
// waits for company instead of costing a commit each. A Flush still sees its own lines.
TEST_F(TenancyTest, AuditWriterBatchesLinesThatArriveOneAtATime) {
  CountingStore counting(*store_);
  {
    AuditWriter writer(counting);
    for (int i = 0; i < 20; ++i) {
      store::AuditRecord r;
      r.time = "2026-01-01T00:00:00.000Z";
      r.tenant_id = kOperatorTenant;
      r.action = "POST /v1/sandboxes/x/sessions";
      r.status = 200;
      r.request_id = "req_alone_" + std::to_string(i);
      writer.Add(r);
      // A request loop's pace (an exec takes ~2 ms): the writer is idle again between lines.
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    writer.Flush();
    // About twenty commits without the linger (a commit takes ~0.2 ms here); one or two with
    // it, a few more if this thread stalls.
    EXPECT_LT(counting.transactions.load(), 10);
    store::AuditFilter f;
    f.limit = 100;
    ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(auto got, tx.ListAudit(f));
      EXPECT_EQ(got.size(), 20u);
      return absl::OkStatus();
    }).ok());
    // A Flush right after one line commits it, lingering or not.
    store::AuditRecord last;
    last.time = "2026-01-01T00:00:01.000Z";
    last.tenant_id = kOperatorTenant;
    last.action = "DELETE /v1/sandboxes/x";
    last.status = 202;
    last.request_id = "req_flushed";
    writer.Add(last);
    writer.Flush();
    ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(auto got, tx.ListAudit(f));
      EXPECT_EQ(got.size(), 21u);
      if (got.size() == 21u) {
        EXPECT_EQ(got.back().request_id, "req_flushed");
      }
      return absl::OkStatus();
    }).ok());
  }
}

}  // namespace sbx::service

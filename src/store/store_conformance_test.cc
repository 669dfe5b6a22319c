#include "store/pg_store.h"
#include "store/sqlite_store.h"

#include "common/status_util.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/base64.h"
#include "common/metrics.h"
#include "common/status_util.h"
#include "common/test_util.h"
#include "common/time_util.h"
#include "store/pg_test_util.h"

namespace sbx::store {
namespace {

namespace fs = std::filesystem;

// The conformance tests: every TEST_P runs on SQLite and on PostgreSQL (a database of its own on
// the ctest run's server, pg_test_util.h); TEST_F(SqliteStoreTest, ...) are about SQLite's file.
class StoreTestBase : public ::testing::Test {
 protected:
  virtual std::string Backend() const { return "sqlite"; }

  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "sbx-store-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << ErrnoMessage(errno);
    dir_ = tmpl;
    path_ = (dir_ / "sbx.db").string();
    if (Backend() == "postgresql") {
      pg_ = testing::PgTestDatabase::Create();
      if (pg_ == nullptr) {
        SBX_SKIP_OR_FAIL("no PostgreSQL test server: run through ctest (fixture "
                         "pg_test_server_start) or set SBX_TEST_PG_HOST");
      }
    }
  }
  void TearDown() override {
    store_.reset();
    pg_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A new store on the test's database (a second connection to the same data).
  absl::StatusOr<StorePtr> OpenAnother(metrics::Registry& registry = metrics::Default()) {
    if (pg_ != nullptr) return OpenPgStore(pg_->url(), {}, registry);
    return OpenSqliteStore(path_, registry);
  }

  Store& Open(metrics::Registry& registry = metrics::Default()) {
    auto s = OpenAnother(registry);
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = std::move(s).value();
    return *store_;
  }

  // Runs `sql` on the database behind the store, outside it; "" or the database's message.
  std::string RawExec(const std::string& sql) {
    if (pg_ != nullptr) {
      try {
        pqxx::connection c(pg_->url());
        pqxx::nontransaction(c).exec(sql);
        return "";
      } catch (const std::exception& e) {
        return e.what();
      }
    }
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    std::string out;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
      out = sqlite3_errmsg(db);
    }
    sqlite3_close(db);
    return out;
  }

  // Runs a read-only lookup in its own transaction.
  template <typename F>
  auto Read(F f) -> decltype(f(std::declval<Tx&>())) {
    decltype(f(std::declval<Tx&>())) out = absl::InternalError("not run");
    absl::Status st = store_->Transact([&](Tx& tx) {
      out = f(tx);
      return absl::OkStatus();
    });
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  absl::Status Put(const SandboxRecord& r) {
    return store_->Transact([&](Tx& tx) { return tx.PutSandbox(r); });
  }

  fs::path dir_;
  std::string path_;
  std::unique_ptr<testing::PgTestDatabase> pg_;
  StorePtr store_;
};

class SqliteStoreTest : public StoreTestBase {};

class StoreTest : public StoreTestBase, public ::testing::WithParamInterface<const char*> {
 protected:
  std::string Backend() const override { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return std::string(info.param); });

std::string Ts(int i) { return fmt::format("2026-01-01T00:{:02}:{:02}.000Z", i / 60, i % 60); }

SandboxRecord FullSandbox(const std::string& id) {
  SandboxRecord r;
  r.id = id;
  r.tenant_id = "ten_a";
  r.state = "running";
  r.template_ref = "base:latest";
  r.template_digest = "sha256:abc";
  r.runtime = "ns";
  r.resources = {{"cpu", 2}, {"memory_mb", nullptr}};
  r.effective_resources = {{"cpu", 2}, {"memory_mb", 512}, {"disk", {{"mb", 1024.5}}}};
  r.egress_profile = "lab";
  r.egress = {{"profile", "lab"}, {"narrowed", nullptr}};
  r.port_access = {{"traffic_token", "stt1.x"}, {"public", false}};
  r.env = {{"LANG", "C.UTF-8"}, {"EMPTY", ""}, {"UNI", "h\u00e9llo \u2603"}};
  r.labels = {{"team", "red"}, {"tier", "gold"}};
  r.timeout_s = 3600;
  r.idle_suspend_s = 0;
  r.created_at = Ts(1);
  r.updated_at = Ts(2);
  r.current_operation_id = "op_1";
  r.error = {{"code", "internal"}, {"message", "boom"}};
  r.runtime_state = {{"pid", 1234}, {"cgroup", "/sys/fs/cgroup/sbx/x"}, {"ok", true}};
  return r;
}

SandboxRecord MinimalSandbox(const std::string& id) {
  SandboxRecord r;
  r.id = id;
  r.tenant_id = "ten_a";
  r.state = "creating";
  r.created_at = Ts(1);
  r.updated_at = Ts(1);
  r.resources = nullptr;  // omitted in the request
  return r;
}

OperationRecord MakeOperation(const std::string& id, const std::string& sandbox_id,
                              const std::string& state, int t) {
  OperationRecord r;
  r.id = id;
  r.tenant_id = "ten_a";
  r.kind = "create";
  r.sandbox_id = sandbox_id;
  r.state = state;
  r.created_at = Ts(t);
  r.updated_at = Ts(t);
  return r;
}

SessionRecord MakeSession(const std::string& id, const std::string& sandbox_id, int t) {
  SessionRecord r;
  r.id = id;
  r.tenant_id = "ten_a";
  r.sandbox_id = sandbox_id;
  r.state = "created";
  r.spec = {{"argv", {"sh", "-c", "echo hi"}}, {"tty", false}};
  r.created_at = Ts(t);
  return r;
}

void ExpectSandboxEq(const SandboxRecord& a, const SandboxRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tenant_id, b.tenant_id);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.template_ref, b.template_ref);
  EXPECT_EQ(a.template_digest, b.template_digest);
  EXPECT_EQ(a.runtime, b.runtime);
  EXPECT_EQ(a.resources, b.resources);
  EXPECT_EQ(a.effective_resources, b.effective_resources);
  EXPECT_EQ(a.egress_profile, b.egress_profile);
  EXPECT_EQ(a.egress, b.egress);
  EXPECT_EQ(a.port_access, b.port_access);
  EXPECT_EQ(a.env, b.env);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.timeout_s, b.timeout_s);
  EXPECT_EQ(a.idle_suspend_s, b.idle_suspend_s);
  EXPECT_EQ(a.created_at, b.created_at);
  EXPECT_EQ(a.updated_at, b.updated_at);
  EXPECT_EQ(a.current_operation_id, b.current_operation_id);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.runtime_state, b.runtime_state);
  EXPECT_EQ(a.node, b.node);
}

void ExpectOperationEq(const OperationRecord& a, const OperationRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tenant_id, b.tenant_id);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.sandbox_id, b.sandbox_id);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.result, b.result);
  EXPECT_EQ(a.created_at, b.created_at);
  EXPECT_EQ(a.updated_at, b.updated_at);
  EXPECT_EQ(a.completed_at, b.completed_at);
  EXPECT_EQ(a.initiator, b.initiator);
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(a.progress, b.progress);
}

void ExpectSessionEq(const SessionRecord& a, const SessionRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tenant_id, b.tenant_id);
  EXPECT_EQ(a.sandbox_id, b.sandbox_id);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.spec, b.spec);
  EXPECT_EQ(a.exit_code, b.exit_code);
  EXPECT_EQ(a.signal, b.signal);
  EXPECT_EQ(a.timed_out, b.timed_out);
  EXPECT_EQ(a.oom_killed, b.oom_killed);
  EXPECT_EQ(a.created_at, b.created_at);
  EXPECT_EQ(a.started_at, b.started_at);
  EXPECT_EQ(a.exited_at, b.exited_at);
  EXPECT_EQ(a.error, b.error);
}

void ExpectIdempotencyEq(const IdempotencyRecord& a, const IdempotencyRecord& b) {
  EXPECT_EQ(a.tenant_id, b.tenant_id);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.method, b.method);
  EXPECT_EQ(a.route, b.route);
  EXPECT_EQ(a.body_hash, b.body_hash);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.response_body, b.response_body);
  EXPECT_EQ(a.created_at, b.created_at);
}

// Opens `path` with the raw C API, for inspecting or tampering with the file behind the store.
struct RawDb {
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  }
  ~RawDb() { sqlite3_close(db); }
  std::string QueryText(const char* sql) {
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    std::string out;
    if (sqlite3_step(st) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
    return out;
  }
  void Exec(const char* sql) {
    EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  }
  sqlite3* db = nullptr;
};

TEST_P(StoreTest, SandboxRoundTripsEveryField) {
  Open();
  SandboxRecord full = FullSandbox("sbx_full");
  SandboxRecord minimal = MinimalSandbox("sbx_min");
  ASSERT_TRUE(Put(full).ok());
  ASSERT_TRUE(Put(minimal).ok());

  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_full"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSandboxEq(*got, full);

  got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_min"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSandboxEq(*got, minimal);
  // JSON null and an empty object stay distinct; optionals stay empty.
  EXPECT_TRUE(got->resources.is_null());
  EXPECT_TRUE(got->env.is_object() && got->env.empty());
  EXPECT_TRUE(got->error.is_null());
  EXPECT_TRUE(got->runtime_state.is_null());
  EXPECT_FALSE(got->timeout_s.has_value());
  EXPECT_FALSE(got->current_operation_id.has_value());
}

TEST_P(StoreTest, OperationRoundTripsEveryField) {
  Open();
  ASSERT_TRUE(Put(MinimalSandbox("sbx_1")).ok());
  OperationRecord done = MakeOperation("op_done", "sbx_1", "failed", 3);
  done.kind = "delete";
  done.error = {{"code", "unavailable"}, {"message", "backend gone"}};
  done.result = {{"sandbox", {{"id", "sbx_1"}}}, {"n", {1, 2, 3}}};
  done.completed_at = Ts(9);
  OperationRecord pending = MakeOperation("op_pending", "sbx_1", "pending", 4);
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) {
                    SBX_RETURN_IF_ERROR(tx.PutOperation(done));
                    return tx.PutOperation(pending);
                  })
                  .ok());

  auto got = Read([&](Tx& tx) { return tx.GetOperation("op_done"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectOperationEq(*got, done);
  got = Read([&](Tx& tx) { return tx.GetOperation("op_pending"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectOperationEq(*got, pending);
  EXPECT_TRUE(got->error.is_null());
  EXPECT_TRUE(got->result.is_null());
  EXPECT_FALSE(got->completed_at.has_value());
}

// A template operation has no sandbox (schema 6 dropped the foreign key): it names the template
// it makes and keeps its last progress snapshot.
TEST_P(StoreTest, TemplateOperationWithoutSandboxRoundTrips) {
  Open();
  OperationRecord op = MakeOperation("op_tpl", "", "running", 3);
  op.kind = "template_pull";
  op.target = "py:3.12";
  op.progress = {{"stage", "fetching"}, {"layers_done", 1}, {"layers_total", 2},
                 {"bytes_done", 1024}, {"bytes_total", 4096}};
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(op); }).ok());
  auto got = Read([&](Tx& tx) { return tx.GetOperation("op_tpl"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectOperationEq(*got, op);
  auto unfinished = Read([&](Tx& tx) { return tx.ListUnfinishedOperations(""); });
  ASSERT_TRUE(unfinished.ok()) << unfinished.status();
  ASSERT_EQ(unfinished->size(), 1u);
  EXPECT_EQ((*unfinished)[0].target, "py:3.12");
}

ImageRecord MakeImage(const std::string& digest, const std::string& name, int t) {
  ImageRecord r;
  r.digest = digest;
  r.name = name;
  r.layers = Json::array({{{"diff_id", "sha256:" + std::string(64, 'a')},
                           {"unpacked_bytes", 10}, {"entries", 2}}});
  r.config = {{"env", {"PATH=/usr/bin"}}, {"working_dir", "/app"}, {"user", "app"}};
  r.source = {{"kind", "pull"}, {"image", "127.0.0.1:5000/py:3.12"}};
  r.size = 10;
  r.created_at = Ts(t);
  return r;
}

TEST_P(StoreTest, ImagesAndTagsRoundTripListAndDelete) {
  Open();
  const std::string d1 = "sha256:" + std::string(64, '1'), d2 = "sha256:" + std::string(64, '2');
  ImageRecord a = MakeImage(d1, "py", 2), b = MakeImage(d2, "py", 1);
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) {
                    SBX_RETURN_IF_ERROR(tx.PutImage(a));
                    SBX_RETURN_IF_ERROR(tx.PutImage(b));
                    SBX_RETURN_IF_ERROR(tx.PutTag({"py", "latest", d1, Ts(3)}));
                    return tx.PutTag({"py", "3.12", d2, Ts(3)});
                  })
                  .ok());
  auto got = Read([&](Tx& tx) { return tx.GetImage(d1); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->name, "py");
  EXPECT_EQ(got->layers, a.layers);
  EXPECT_EQ(got->config, a.config);
  EXPECT_EQ(got->source, a.source);
  EXPECT_EQ(got->size, 10);
  auto images = Read([&](Tx& tx) { return tx.ListImages(); });
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ(images->size(), 2u);
  EXPECT_EQ((*images)[0].digest, d2);  // by created_at
  auto tags = Read([&](Tx& tx) { return tx.ListTags(); });
  ASSERT_TRUE(tags.ok()) << tags.status();
  ASSERT_EQ(tags->size(), 2u);
  EXPECT_EQ((*tags)[0].tag, "3.12");  // by name, tag
  // A tag moves by upsert.
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutTag({"py", "latest", d2, Ts(4)}); }).ok());
  auto tag = Read([&](Tx& tx) { return tx.GetTag("py", "latest"); });
  ASSERT_TRUE(tag.ok()) << tag.status();
  EXPECT_EQ(tag->digest, d2);
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetTag("py", "nope"); }).status().code(),
            absl::StatusCode::kNotFound);
  // A tag pointing at no image is refused at commit.
  absl::Status st = store_->Transact([&](Tx& tx) { return tx.PutTag({"x", "y", "sha256:ghost", Ts(5)}); });
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  // Deleting: the tag, then the image; deleting a missing row is not an error.
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) {
                    SBX_RETURN_IF_ERROR(tx.DeleteTag("py", "latest"));
                    SBX_RETURN_IF_ERROR(tx.DeleteTag("py", "latest"));
                    SBX_RETURN_IF_ERROR(tx.DeleteTag("py", "3.12"));
                    return tx.DeleteImage(d2);
                  })
                  .ok());
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetImage(d2); }).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(StoreTest, CountsLiveSandboxesOfADigest) {
  Open();
  const std::string d = "sha256:" + std::string(64, 'd');
  for (const auto& [id, state] : {std::pair{"sbx_1", "running"}, std::pair{"sbx_2", "deleted"},
                                  std::pair{"sbx_3", "paused"}}) {
    SandboxRecord sb = MinimalSandbox(id);
    sb.state = state;
    sb.template_digest = d;
    ASSERT_TRUE(Put(sb).ok());
  }
  SandboxRecord other = MinimalSandbox("sbx_4");
  other.template_digest = "sha256:other";
  ASSERT_TRUE(Put(other).ok());
  auto n = Read([&](Tx& tx) { return tx.CountLiveSandboxesWithDigest(d); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
}

TEST_P(StoreTest, SessionRoundTripsEveryField) {
  Open();
  ASSERT_TRUE(Put(MinimalSandbox("sbx_1")).ok());
  SessionRecord exited = MakeSession("ses_exited", "sbx_1", 5);
  exited.state = "exited";
  exited.spec = {{"argv", {"sleep", "100"}}, {"cwd", "/work"}, {"env", {{"A", "1"}}},
                 {"user", "sandbox"}, {"tty", true}, {"stdin", false}, {"timeout_s", 10}};
  exited.exit_code = -9;
  exited.signal = "SIGKILL";
  exited.timed_out = true;
  exited.oom_killed = true;
  exited.started_at = Ts(6);
  exited.exited_at = Ts(7);
  exited.error = {{"code", "sandbox_failed"}, {"message", "the agent is gone"}};
  SessionRecord fresh = MakeSession("ses_fresh", "sbx_1", 8);
  fresh.spec = nullptr;
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) {
                    SBX_RETURN_IF_ERROR(tx.PutSession(exited));
                    return tx.PutSession(fresh);
                  })
                  .ok());

  auto got = Read([&](Tx& tx) { return tx.GetSession("ses_exited"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSessionEq(*got, exited);
  got = Read([&](Tx& tx) { return tx.GetSession("ses_fresh"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSessionEq(*got, fresh);
  EXPECT_FALSE(got->exit_code.has_value());
  EXPECT_FALSE(got->signal.has_value());
  EXPECT_FALSE(got->started_at.has_value());
  EXPECT_TRUE(got->spec.is_null());
}

TEST_P(StoreTest, UpsertOverwritesEveryField) {
  Open();
  ASSERT_TRUE(Put(FullSandbox("sbx_1")).ok());
  SandboxRecord changed = MinimalSandbox("sbx_1");
  changed.tenant_id = "ten_a";
  changed.state = "deleting";
  changed.labels = {{"new", "label"}};
  changed.updated_at = Ts(50);
  ASSERT_TRUE(Put(changed).ok());

  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSandboxEq(*got, changed);
  auto live = Read([&](Tx& tx) { return tx.ListLiveSandboxes(""); });
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(live->size(), 1u);

  OperationRecord op = MakeOperation("op_1", "sbx_1", "running", 1);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(op); }).ok());
  op.state = "succeeded";
  op.result = {{"ok", true}};
  op.completed_at = Ts(3);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(op); }).ok());
  auto got_op = Read([&](Tx& tx) { return tx.GetOperation("op_1"); });
  ASSERT_TRUE(got_op.ok());
  ExpectOperationEq(*got_op, op);

  SessionRecord ses = MakeSession("ses_1", "sbx_1", 1);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutSession(ses); }).ok());
  ses.state = "exited";
  ses.exit_code = 0;
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutSession(ses); }).ok());
  auto got_ses = Read([&](Tx& tx) { return tx.GetSession("ses_1"); });
  ASSERT_TRUE(got_ses.ok());
  ExpectSessionEq(*got_ses, ses);
}

TEST_P(StoreTest, MissingRowsAreNotFound) {
  Open();
  auto sb = Read([&](Tx& tx) { return tx.GetSandbox("sbx_nope"); });
  EXPECT_EQ(sb.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sb.status().message(), "sandbox sbx_nope not found");
  auto op = Read([&](Tx& tx) { return tx.GetOperation("op_nope"); });
  EXPECT_EQ(op.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(op.status().message(), "operation op_nope not found");
  auto ses = Read([&](Tx& tx) { return tx.GetSession("ses_nope"); });
  EXPECT_EQ(ses.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ses.status().message(), "session ses_nope not found");
  auto idem = Read([&](Tx& tx) { return tx.GetIdempotency("ten_a", "k", "POST", "/v1/x"); });
  ASSERT_TRUE(idem.ok());
  EXPECT_FALSE(idem->has_value());
  auto list = Read([&](Tx& tx) { return tx.ListSessions("sbx_nope"); });
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TEST_P(StoreTest, ErrorFromFnRollsBackAndIsReturned) {
  Open();
  // Fails before writing anything.
  absl::Status st = store_->Transact([](Tx&) { return absl::AbortedError("nope"); });
  EXPECT_EQ(st, absl::AbortedError("nope"));

  // Writes several rows, then fails midway.
  st = store_->Transact([&](Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.PutSandbox(FullSandbox("sbx_1")));
    SBX_RETURN_IF_ERROR(tx.PutOperation(MakeOperation("op_1", "sbx_1", "pending", 1)));
    SBX_RETURN_IF_ERROR(
        tx.PutIdempotency({"ten_a", "k", "POST", "/v1/sandboxes", "h", 201, "{}", Ts(1)}));
    return absl::InvalidArgumentError("validation failed late");
  });
  EXPECT_EQ(st, absl::InvalidArgumentError("validation failed late"));

  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); }).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetOperation("op_1"); }).status().code(),
            absl::StatusCode::kNotFound);
  auto idem =
      Read([&](Tx& tx) { return tx.GetIdempotency("ten_a", "k", "POST", "/v1/sandboxes"); });
  ASSERT_TRUE(idem.ok());
  EXPECT_FALSE(idem->has_value());

  // The connection is not left inside a transaction.
  EXPECT_TRUE(Put(FullSandbox("sbx_2")).ok());
  EXPECT_TRUE(Read([&](Tx& tx) { return tx.GetSandbox("sbx_2"); }).ok());
}

TEST_P(StoreTest, ExceptionFromFnRollsBack) {
  Open();
  EXPECT_THROW((void)store_->Transact([&](Tx& tx) -> absl::Status {
    (void)tx.PutSandbox(FullSandbox("sbx_1"));
    throw std::runtime_error("bug");
  }),
               std::runtime_error);
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); }).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(Put(FullSandbox("sbx_2")).ok());
}

// A transaction's writes are visible to its own later reads, in order, whatever the backend
// does with them before the commit (PostgreSQL sends them with the next read).
TEST_P(StoreTest, WritesAreReadBackInsideTheirTransaction) {
  Open();
  absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
    SandboxRecord a = MinimalSandbox("sbx_1");
    a.timeout_s = 1;
    SBX_RETURN_IF_ERROR(tx.PutSandbox(a));
    a.timeout_s = 2;
    SBX_RETURN_IF_ERROR(tx.PutSandbox(a));
    SBX_ASSIGN_OR_RETURN(SandboxRecord got, tx.GetSandbox("sbx_1"));
    EXPECT_EQ(got.timeout_s, 2);
    a.timeout_s = 3;
    SBX_RETURN_IF_ERROR(tx.PutSandbox(a));  // after the last read: goes with the commit
    SBX_RETURN_IF_ERROR(tx.PutOperation(MakeOperation("op_1", "sbx_1", "running", 1)));
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation("op_1"));
    EXPECT_EQ(op.sandbox_id, "sbx_1");
    return tx.PutSandbox(a);
  });
  ASSERT_TRUE(st.ok()) << st;
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->timeout_s, 3);
  // A transaction that runs no statement is no error and changes nothing.
  EXPECT_TRUE(store_->Transact([](Tx&) { return absl::OkStatus(); }).ok());
}

// A write refused by the database fails its transaction even when nothing reads after it, and
// the error names it; the connection then serves the next transaction cleanly, also when the
// refused write was the first use of its statement on that connection. (SQLite says only
// "commit"; PostgreSQL also names the writes the COMMIT carried.)
TEST_P(StoreTest, RefusedWriteAfterTheLastReadFailsTheCommit) {
  Open();
  for (int round = 0; round < 3; ++round) {
    absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
      SBX_RETURN_IF_ERROR(tx.PutSandbox(MinimalSandbox(fmt::format("sbx_keep{}", round))));
      // A session of no sandbox: the foreign key refuses it at the latest at commit.
      return tx.PutSession(MakeSession(fmt::format("ses_{}", round), "sbx_ghost", 2));
    });
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(absl::AsciiStrToLower(st.message()).find("foreign key"), std::string::npos) << st;
    EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox(fmt::format("sbx_keep{}", round)); })
                  .status()
                  .code(),
              absl::StatusCode::kNotFound);
  }
  // The same, with a read between the write and the commit.
  absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.PutSession(MakeSession("ses_x", "sbx_ghost", 2)));
    (void)tx.GetSandbox("sbx_other");
    return tx.PutSandbox(MinimalSandbox("sbx_after"));
  });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_after"); }).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(Put(MinimalSandbox("sbx_ok")).ok());
  EXPECT_TRUE(Read([&](Tx& tx) { return tx.GetSandbox("sbx_ok"); }).ok());
}

// An exception from fn after the transaction reached the database (a read sent it) still rolls
// it back and leaves no transaction open on the connection the next caller gets.
TEST_P(StoreTest, ExceptionAfterAReadRollsBackAndFreesTheConnection) {
  Open();
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW((void)store_->Transact([&](Tx& tx) -> absl::Status {
      (void)tx.PutSandbox(FullSandbox(fmt::format("sbx_t{}", i)));
      (void)tx.GetSandbox(fmt::format("sbx_t{}", i));
      (void)tx.PutOperation(
          MakeOperation(fmt::format("op_t{}", i), fmt::format("sbx_t{}", i), "running", 1));
      throw std::runtime_error("bug");
    }),
                 std::runtime_error);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox(fmt::format("sbx_t{}", i)); })
                  .status()
                  .code(),
              absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(Put(FullSandbox("sbx_2")).ok());
  EXPECT_TRUE(Read([&](Tx& tx) { return tx.GetSandbox("sbx_2"); }).ok());
}

TEST_P(StoreTest, DanglingReferenceFailsCommitAndRollsBack) {
  Open();
  // Order inside a transaction does not matter (deferred foreign keys)...
  absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.PutSession(MakeSession("ses_1", "sbx_1", 2)));
    return tx.PutSandbox(MinimalSandbox("sbx_1"));
  });
  EXPECT_TRUE(st.ok()) << st;
  // ...but a session pointing at no sandbox is refused at commit, and nothing is kept.
  st = store_->Transact([&](Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.PutSandbox(MinimalSandbox("sbx_2")));
    return tx.PutSession(MakeSession("ses_2", "sbx_ghost", 2));
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  // PostgreSQL's message also names the writes the COMMIT carried ("store: commit (put
  // sandbox, put session): ...").
  EXPECT_TRUE(absl::StartsWith(st.message(), "store: commit")) << st;
  EXPECT_NE(absl::AsciiStrToLower(st.message()).find("foreign key"), std::string::npos) << st;
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_2"); }).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(Put(MinimalSandbox("sbx_3")).ok());
}

TEST_P(StoreTest, NestedTransactIsRefused) {
  Open();
  absl::Status inner;
  absl::Status outer = store_->Transact([&](Tx&) {
    inner = store_->Transact([](Tx&) { return absl::OkStatus(); });
    return absl::OkStatus();
  });
  EXPECT_TRUE(outer.ok());
  EXPECT_EQ(inner.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(StoreTest, InvalidJsonIsRejectedNotThrown) {
  Open();
  SandboxRecord r = MinimalSandbox("sbx_1");
  r.env = {{"BAD", std::string("\xff\xfe")}};  // not UTF-8: json::dump() would throw
  absl::Status st = Put(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); }).status().code(),
            absl::StatusCode::kNotFound);
}

// The store's pooled connections outlive their server sessions: when every session of sbxd's
// database is ended from outside (a PostgreSQL restart, an administrator's
// pg_terminate_backend), the next transactions get new ones instead of failing. On SQLite the
// same steps with nothing ended from outside.
TEST_P(StoreTest, ConnectionsEndedFromOutsideAreReplaced) {
  Open();
  // Four at once, so the pool holds more than one idle connection.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { EXPECT_TRUE(Put(MinimalSandbox(fmt::format("sbx_p{}", t))).ok()); });
  }
  for (auto& t : threads) t.join();
  const bool pg = GetParam() == std::string("postgresql");
  EXPECT_EQ(RawExec(pg ? "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "datname = current_database() AND pid <> pg_backend_pid()"
                       : "SELECT 1"),
            "");
  if (pg) {
    // pg_terminate_backend signals; wait (bounded) until the sessions are gone.
    for (int i = 0; i < 500; ++i) {
      try {
        pqxx::connection c(pg_->url());
        pqxx::result r = pqxx::nontransaction(c).exec(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
            "pid <> pg_backend_pid()");
        if (r[0][0].as<int64_t>() == 0) break;
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (int i = 0; i < 6; ++i) {
    absl::Status st = Put(MinimalSandbox(fmt::format("sbx_after{}", i)));
    EXPECT_TRUE(st.ok()) << i << ": " << st;
    auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_p0"); });
    EXPECT_TRUE(got.ok()) << got.status();
  }
}

// Values travel as quoted literals on PostgreSQL (pg_batch.h): every character that means
// something to SQL, a quote parser or a placeholder comes back as it went, in plain columns,
// JSON columns and keys, and a queued write with one does not disturb the ones around it.
TEST_P(StoreTest, ValuesThatLookLikeSqlRoundTrip) {
  Open();
  const std::vector<std::string> nasty = {
      "x'); DROP TABLE sandboxes; --", "\\", "'", "''", "\\'", "$1", "$$", "$tag$ x $tag$",
      "E'\\x41'", ";\nCOMMIT;\nBEGIN", "\u00e9\u2603 \xf0\x9f\x92\xa9", std::string(70000, '\''),
      "?1", "%s%n", "NULL", "null"};
  absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
    for (size_t i = 0; i < nasty.size(); ++i) {
      SandboxRecord r = MinimalSandbox(fmt::format("sbx_{}", i));
      r.template_ref = nasty[i];
      r.labels = {{"k", nasty[i]}, {nasty[i].substr(0, 100), "v"}};
      r.env = {{"E", nasty[i]}};
      SBX_RETURN_IF_ERROR(tx.PutSandbox(r));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < nasty.size(); ++i) {
    auto got = Read([&](Tx& tx) { return tx.GetSandbox(fmt::format("sbx_{}", i)); });
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->template_ref, nasty[i]) << i;
    EXPECT_EQ(got->labels["k"], nasty[i]) << i;
    EXPECT_EQ(got->env["E"], nasty[i]) << i;
    SandboxFilter f;
    f.tenant_id = got->tenant_id;
    f.label = std::make_pair(std::string("k"), nasty[i]);
    auto page = Read([&](Tx& tx) { return tx.ListSandboxes(f); });
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_EQ(page->items.size(), 1u) << i;
    EXPECT_EQ(page->items[0].id, fmt::format("sbx_{}", i));
  }
}

// Text PostgreSQL cannot hold (bytes that are not UTF-8, a NUL) in a plain column is refused
// with InvalidArgument, whether the write goes alone or with others, never cut short or thrown;
// the connection serves the next transaction. SQLite keeps such bytes as they are.
TEST_P(StoreTest, TextPostgresCannotHoldIsRefusedNotCut) {
  Open();
  for (const std::string& bad : {std::string("a\xff\xfe"), std::string("a\0b", 3)}) {
    SandboxRecord r = MinimalSandbox("sbx_1");
    r.template_ref = bad;
    if (GetParam() == std::string("sqlite")) {
      ASSERT_TRUE(Put(r).ok());
      auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->template_ref, bad);
      continue;
    }
    EXPECT_EQ(Put(r).code(), absl::StatusCode::kInvalidArgument);
    absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
      SBX_RETURN_IF_ERROR(tx.PutSandbox(MinimalSandbox("sbx_2")));
      SBX_RETURN_IF_ERROR(tx.PutSandbox(r));
      return tx.GetSandbox("sbx_2").status();
    });
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_2"); }).status().code(),
              absl::StatusCode::kNotFound);
    st = store_->Read([&](Tx& tx) { return tx.GetSandbox(bad).status(); });
    EXPECT_TRUE(st.code() == absl::StatusCode::kInvalidArgument ||
                st.code() == absl::StatusCode::kNotFound) << st;
  }
  EXPECT_TRUE(Put(MinimalSandbox("sbx_3")).ok());
}

// 30 sandboxes of ten_a, inserted shuffled; pairs share created_at so the id tie-break matters.
class ListSandboxesTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    Open();
    std::vector<SandboxRecord> all;
    for (int i = 0; i < 30; ++i) {
      SandboxRecord r = MinimalSandbox(fmt::format("sbx_{:02}", 29 - i));
      r.created_at = Ts(i / 2);
      r.state = i % 3 == 0 ? "running" : i % 3 == 1 ? "creating" : "deleted";
      r.labels = {{"team", i % 2 == 1 ? "red" : "blue"}, {"idx", std::to_string(i)}};
      all.push_back(r);
    }
    SandboxRecord odd_key = MinimalSandbox("sbx_odd");
    odd_key.created_at = Ts(100);
    odd_key.labels = {{"we\"ird.key[0]", "x"}, {"num", 5}};
    all.push_back(odd_key);
    SandboxRecord other_tenant = MinimalSandbox("sbx_other");
    other_tenant.tenant_id = "ten_b";
    other_tenant.state = "running";
    other_tenant.labels = {{"team", "red"}};
    all.push_back(other_tenant);

    std::mt19937 rng(42);
    std::shuffle(all.begin(), all.end(), rng);
    ASSERT_TRUE(store_
                    ->Transact([&](Tx& tx) -> absl::Status {
                      for (const auto& r : all) SBX_RETURN_IF_ERROR(tx.PutSandbox(r));
                      return absl::OkStatus();
                    })
                    .ok());
    all_ = all;
  }

  // Every row of ten_a matching `keep`, in (created_at, id) order.
  std::vector<std::string> Expected(const std::function<bool(const SandboxRecord&)>& keep) {
    std::vector<SandboxRecord> rows;
    for (const auto& r : all_) {
      if (r.tenant_id == "ten_a" && keep(r)) rows.push_back(r);
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return std::tie(a.created_at, a.id) < std::tie(b.created_at, b.id);
    });
    std::vector<std::string> ids;
    for (const auto& r : rows) ids.push_back(r.id);
    return ids;
  }

  // Follows next_page_token to the end; returns the ids and the number of pages.
  std::pair<std::vector<std::string>, int> ListAll(SandboxFilter f) {
    std::vector<std::string> ids;
    int pages = 0;
    while (true) {
      auto page = Read([&](Tx& tx) { return tx.ListSandboxes(f); });
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      ++pages;
      EXPECT_LE(static_cast<int>(page->items.size()), f.limit);
      for (const auto& r : page->items) ids.push_back(r.id);
      if (!page->next_page_token) break;
      EXPECT_EQ(static_cast<int>(page->items.size()), f.limit);
      f.page_token = *page->next_page_token;
      if (pages > 100) break;
    }
    return {ids, pages};
  }

  std::vector<SandboxRecord> all_;
};

INSTANTIATE_TEST_SUITE_P(Backends, ListSandboxesTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(ListSandboxesTest, PagesByStateWithoutGapsOrDuplicates) {
  SandboxFilter f;
  f.tenant_id = "ten_a";
  f.state = "running";
  f.limit = 4;
  auto [ids, pages] = ListAll(f);
  auto want = Expected([](const SandboxRecord& r) { return r.state == "running"; });
  ASSERT_EQ(want.size(), 10u);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
}

TEST_P(ListSandboxesTest, PagesByLabelExcludingDeleted) {
  SandboxFilter f;
  f.tenant_id = "ten_a";
  f.label = std::make_pair("team", "red");
  f.limit = 4;
  auto [ids, pages] = ListAll(f);
  auto want = Expected([](const SandboxRecord& r) {
    return r.labels.value("team", "") == "red" && r.state != "deleted";
  });
  ASSERT_EQ(want.size(), 10u);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(pages, 3);
}

TEST_P(ListSandboxesTest, LastFullPageHasNoNextToken) {
  SandboxFilter f;
  f.tenant_id = "ten_a";
  f.label = std::make_pair("team", "red");
  f.include_deleted = true;
  f.limit = 5;
  auto [ids, pages] = ListAll(f);
  auto want = Expected([](const SandboxRecord& r) { return r.labels.value("team", "") == "red"; });
  ASSERT_EQ(want.size(), 15u);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(pages, 3);
}

TEST_P(ListSandboxesTest, DefaultFilterAndOddLabelKeys) {
  SandboxFilter f;
  f.tenant_id = "ten_a";
  f.limit = 500;
  auto [ids, pages] = ListAll(f);
  EXPECT_EQ(ids, Expected([](const SandboxRecord& r) { return r.state != "deleted"; }));
  EXPECT_EQ(pages, 1);

  f.label = std::make_pair("we\"ird.key[0]", "x");
  EXPECT_EQ(ListAll(f).first, std::vector<std::string>{"sbx_odd"});
  f.label = std::make_pair("num", "5");  // labels are strings; a number never matches
  EXPECT_TRUE(ListAll(f).first.empty());
  f.label = std::make_pair("team", "green");
  EXPECT_TRUE(ListAll(f).first.empty());

  f = SandboxFilter{};
  f.tenant_id = "ten_nobody";
  auto [none, none_pages] = ListAll(f);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none_pages, 1);
}

TEST_P(ListSandboxesTest, RowsInsertedBeforeTheCursorDoNotShiftPages) {
  SandboxFilter f;
  f.tenant_id = "ten_a";
  f.state = "running";
  f.limit = 4;
  auto first = Read([&](Tx& tx) { return tx.ListSandboxes(f); });
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->next_page_token.has_value());
  SandboxRecord early = MinimalSandbox("sbx_early");
  early.state = "running";
  early.created_at = Ts(0);
  ASSERT_TRUE(Put(early).ok());
  f.page_token = *first->next_page_token;
  auto [rest, pages] = ListAll(f);
  std::vector<std::string> ids;
  for (const auto& r : first->items) ids.push_back(r.id);
  ids.insert(ids.end(), rest.begin(), rest.end());
  EXPECT_EQ(ids, Expected([](const SandboxRecord& r) { return r.state == "running"; }));
}

TEST_P(ListSandboxesTest, InvalidPageTokenIsInvalidArgument) {
  for (const std::string& token :
       {std::string("!!not base64!!"), Base64UrlEncode("not json"), Base64UrlEncode("[1,2]"),
        Base64UrlEncode(R"(["a"])"), Base64UrlEncode(R"({"a":"b"})"), std::string("A"),
        Base64UrlEncode(R"(["a",)" + std::string(3000, '[') + std::string(3000, ']') + "]")}) {
    SandboxFilter f;
    f.tenant_id = "ten_a";
    f.page_token = token;
    auto page = Read([&](Tx& tx) { return tx.ListSandboxes(f); });
    EXPECT_EQ(page.status(), absl::InvalidArgumentError("page_token is invalid")) << token;
  }
}

TEST_P(StoreTest, ListLiveUnfinishedAndSessions) {
  Open();
  SandboxRecord a = MinimalSandbox("sbx_a");
  a.created_at = Ts(2);
  SandboxRecord b = MinimalSandbox("sbx_b");
  b.tenant_id = "ten_b";
  b.state = "running";
  b.created_at = Ts(1);
  SandboxRecord gone = MinimalSandbox("sbx_gone");
  gone.state = "deleted";
  std::vector<OperationRecord> ops_in = {MakeOperation("op_1", "sbx_a", "pending", 3),
                                         MakeOperation("op_2", "sbx_b", "running", 2),
                                         MakeOperation("op_3", "sbx_a", "succeeded", 1),
                                         MakeOperation("op_4", "sbx_gone", "failed", 1)};
  std::vector<SessionRecord> sessions_in = {
      MakeSession("ses_2", "sbx_a", 5), MakeSession("ses_1", "sbx_a", 4),
      MakeSession("ses_0", "sbx_a", 5), MakeSession("ses_b", "sbx_b", 1)};
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    for (const auto& r : {a, b, gone}) SBX_RETURN_IF_ERROR(tx.PutSandbox(r));
                    for (const auto& r : ops_in) SBX_RETURN_IF_ERROR(tx.PutOperation(r));
                    for (const auto& r : sessions_in) SBX_RETURN_IF_ERROR(tx.PutSession(r));
                    return absl::OkStatus();
                  })
                  .ok());

  auto live = Read([&](Tx& tx) { return tx.ListLiveSandboxes(""); });
  ASSERT_TRUE(live.ok());
  ASSERT_EQ(live->size(), 2u);
  EXPECT_EQ((*live)[0].id, "sbx_b");
  EXPECT_EQ((*live)[1].id, "sbx_a");

  auto ops = Read([&](Tx& tx) { return tx.ListUnfinishedOperations(""); });
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0].id, "op_2");
  EXPECT_EQ((*ops)[1].id, "op_1");

  auto sessions = Read([&](Tx& tx) { return tx.ListSessions("sbx_a"); });
  ASSERT_TRUE(sessions.ok());
  ASSERT_EQ(sessions->size(), 3u);
  EXPECT_EQ((*sessions)[0].id, "ses_1");
  EXPECT_EQ((*sessions)[1].id, "ses_0");
  EXPECT_EQ((*sessions)[2].id, "ses_2");
  ExpectSessionEq((*sessions)[0], MakeSession("ses_1", "sbx_a", 4));
}

TEST_P(StoreTest, IdempotencyGetPutPurge) {
  Open();
  IdempotencyRecord old_key{"ten_a", "key-1", "POST", "/v1/sandboxes", "hash1", 201,
                            std::string("{\"id\":\"sbx_1\"}\0tail", 20), Ts(1)};
  IdempotencyRecord other_route = old_key;
  other_route.route = "/v1/sandboxes/{id}/sessions";
  other_route.created_at = Ts(5);
  IdempotencyRecord other_tenant = old_key;
  other_tenant.tenant_id = "ten_b";
  other_tenant.created_at = Ts(9);
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    SBX_RETURN_IF_ERROR(tx.PutIdempotency(old_key));
                    SBX_RETURN_IF_ERROR(tx.PutIdempotency(other_route));
                    return tx.PutIdempotency(other_tenant);
                  })
                  .ok());

  auto got = Read(
      [&](Tx& tx) { return tx.GetIdempotency("ten_a", "key-1", "POST", "/v1/sandboxes"); });
  ASSERT_TRUE(got.ok() && got->has_value());
  ExpectIdempotencyEq(**got, old_key);
  EXPECT_EQ((*got)->response_body.size(), 20u);
  got = Read([&](Tx& tx) { return tx.GetIdempotency("ten_b", "key-1", "POST", "/v1/sandboxes"); });
  ASSERT_TRUE(got.ok() && got->has_value());
  ExpectIdempotencyEq(**got, other_tenant);
  got = Read(
      [&](Tx& tx) { return tx.GetIdempotency("ten_a", "key-1", "DELETE", "/v1/sandboxes"); });
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());

  // Put on the same key overwrites.
  IdempotencyRecord replaced = old_key;
  replaced.status = 409;
  replaced.body_hash = "hash2";
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutIdempotency(replaced); }).ok());
  got = Read([&](Tx& tx) { return tx.GetIdempotency("ten_a", "key-1", "POST", "/v1/sandboxes"); });
  ASSERT_TRUE(got.ok() && got->has_value());
  ExpectIdempotencyEq(**got, replaced);

  auto purged = Read([&](Tx& tx) { return tx.PurgeIdempotency(Ts(5)); });  // strictly before
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 1);
  got = Read([&](Tx& tx) { return tx.GetIdempotency("ten_a", "key-1", "POST", "/v1/sandboxes"); });
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  got = Read([&](Tx& tx) {
    return tx.GetIdempotency("ten_a", "key-1", "POST", "/v1/sandboxes/{id}/sessions");
  });
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->has_value());
  purged = Read([&](Tx& tx) { return tx.PurgeIdempotency(Ts(100)); });
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 2);
  purged = Read([&](Tx& tx) { return tx.PurgeIdempotency(Ts(100)); });
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 0);
}

TEST_F(SqliteStoreTest, ReopenKeepsDataAndSchemaVersion) {
  Open();
  ASSERT_TRUE(Put(FullSandbox("sbx_1")).ok());
  store_.reset();
  {
    RawDb raw(path_);
    EXPECT_EQ(raw.QueryText("PRAGMA user_version"), "10");
    EXPECT_EQ(raw.QueryText("PRAGMA journal_mode"), "wal");
  }
  Open();
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSandboxEq(*got, FullSandbox("sbx_1"));
  store_.reset();
  RawDb raw(path_);
  EXPECT_EQ(raw.QueryText("PRAGMA user_version"), "10");
}

// Undoes migration 7 by hand (sqlite_sequence, which SQLite made for the AUTOINCREMENT, cannot be
// dropped: emptied, it is what a version-6 file that never had one behaves like).
#define SBX_UNDO_SCHEMA_NINE                                                          \
  "DROP INDEX sandboxes_by_node; DROP INDEX operations_unfinished; DROP TABLE nodes; " \
  "ALTER TABLE sandboxes DROP COLUMN node; ALTER TABLE operations DROP COLUMN node; "
constexpr char kUndoSchemaSeven[] =
    SBX_UNDO_SCHEMA_NINE
    "ALTER TABLE tenants DROP COLUMN egress_profiles; "
    "DROP INDEX sandboxes_tenant_usage; DROP TABLE audit_log; DROP TABLE tokens; "
    "DROP TABLE tenants; DELETE FROM sqlite_sequence; PRAGMA user_version = 6;";

// A database written by the first release (schema 1) opens: rows keep their values and the new
// columns read as "not set" (idle_suspend_s null, initiator "api").
TEST_F(SqliteStoreTest, SchemaOneDatabaseIsMigrated) {
  Open();
  SandboxRecord sb = FullSandbox("sbx_1");
  ASSERT_TRUE(Put(sb).ok());
  OperationRecord op = MakeOperation("op_1", "sbx_1", "succeeded", 3);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(op); }).ok());
  store_.reset();
  {
    RawDb raw(path_);  // undo migrations 7, 6, 5, 4, 3 and 2 by hand
    raw.Exec(kUndoSchemaSeven);
    raw.Exec("DROP TABLE template_tags; DROP TABLE images; DROP INDEX sandboxes_by_digest; "
             "ALTER TABLE operations DROP COLUMN progress; "
             "ALTER TABLE operations DROP COLUMN target; "
             "ALTER TABLE sandboxes DROP COLUMN port_access; "
             "ALTER TABLE sandboxes DROP COLUMN egress; ALTER TABLE sessions DROP COLUMN error; "
             "DROP INDEX sandboxes_deleted; ALTER TABLE sandboxes DROP COLUMN idle_suspend_s; "
             "ALTER TABLE operations DROP COLUMN initiator; PRAGMA user_version = 1;");
  }
  Open();
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok()) << got.status();
  sb.idle_suspend_s.reset();
  sb.egress = nullptr;
  sb.port_access = nullptr;
  ExpectSandboxEq(*got, sb);
  auto got_op = Read([&](Tx& tx) { return tx.GetOperation("op_1"); });
  ASSERT_TRUE(got_op.ok()) << got_op.status();
  EXPECT_EQ(got_op->initiator, "api");
}

// Nodes (docs/scale.md): registrations, and what each node may see and change.
TEST_P(StoreTest, NodesRoundTripAndListByName) {
  Open();
  NodeRecord n;
  n.name = "node-b";
  n.url = "http://10.0.0.2:7070";
  n.role = "node";
  n.state = "active";
  n.epoch = 3;
  n.heartbeat_at = Ts(5);
  n.started_at = Ts(1);
  n.capacity = {{"vcpu", 8}, {"runtimes", {"ns"}}};
  n.load = {{"sandboxes", 2}};
  n.labels = {{"zone", "a"}};
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutNode(n); }).ok());
  NodeRecord a = n;
  a.name = "node-a";
  a.reason = "drained by an operator";
  a.state = "draining";
  a.restart_by = Ts(60);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutNode(a); }).ok());
  auto got = Read([&](Tx& tx) { return tx.GetNode("node-b"); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->url, n.url);
  EXPECT_EQ(got->role, "node");
  EXPECT_EQ(got->epoch, 3);
  EXPECT_EQ(got->heartbeat_at, Ts(5));
  EXPECT_EQ(got->capacity, n.capacity);
  EXPECT_EQ(got->load, n.load);
  EXPECT_EQ(got->labels, n.labels);
  EXPECT_EQ(got->reason, "");
  n.epoch = 4;
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutNode(n); }).ok());
  auto all = Read([&](Tx& tx) { return tx.ListNodes(); });
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "node-a");
  EXPECT_EQ((*all)[0].reason, "drained by an operator");
  EXPECT_EQ((*all)[0].restart_by, Ts(60));
  EXPECT_EQ((*all)[1].restart_by, "");
  EXPECT_EQ((*all)[1].epoch, 4);
  auto missing = Read([&](Tx& tx) { return tx.GetNode("node-z"); });
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

TEST_P(StoreTest, EachNodeListsOnlyItsOwnSandboxesAndOperations) {
  Open();
  SandboxRecord a1 = FullSandbox("sbx_a1"), a2 = FullSandbox("sbx_a2"), b1 = FullSandbox("sbx_b1");
  SandboxRecord old = FullSandbox("sbx_old");  // from before schema 9: no node
  a1.node = a2.node = "a";
  b1.node = "b";
  a2.state = "failed";
  for (const auto* r : {&a1, &a2, &b1, &old}) ASSERT_TRUE(Put(*r).ok());
  OperationRecord op_a = MakeOperation("op_a", "sbx_a1", "running", 1);
  OperationRecord op_b = MakeOperation("op_b", "sbx_b1", "pending", 2);
  OperationRecord op_old = MakeOperation("op_old", "sbx_old", "running", 3);
  op_a.node = "a";
  op_b.node = "b";
  ASSERT_TRUE(store_->Transact([&](Tx& tx) -> absl::Status {
    for (const auto* op : {&op_a, &op_b, &op_old}) SBX_RETURN_IF_ERROR(tx.PutOperation(*op));
    return absl::OkStatus();
  }).ok());
  auto live_a = Read([&](Tx& tx) { return tx.ListLiveSandboxes("a"); });
  ASSERT_TRUE(live_a.ok()) << live_a.status();
  ASSERT_EQ(live_a->size(), 2u);
  EXPECT_EQ((*live_a)[0].node, "a");
  auto ops_b = Read([&](Tx& tx) { return tx.ListUnfinishedOperations("b"); });
  ASSERT_TRUE(ops_b.ok());
  ASSERT_EQ(ops_b->size(), 1u);
  EXPECT_EQ((*ops_b)[0].id, "op_b");
  auto held = Read([&](Tx& tx) { return tx.CountHeldSandboxesByNode(); });
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ((*held)["a"], 1);  // the failed one holds nothing
  EXPECT_EQ((*held)["b"], 1);
  EXPECT_EQ((*held)[""], 1);
  // The single-host sbxd takes the rows of no node, and only those.
  auto claimed = Read([&](Tx& tx) { return tx.ClaimUnassigned("a"); });
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ(*claimed, 1);
  live_a = Read([&](Tx& tx) { return tx.ListLiveSandboxes("a"); });
  ASSERT_TRUE(live_a.ok());
  EXPECT_EQ(live_a->size(), 3u);
  auto ops_a = Read([&](Tx& tx) { return tx.ListUnfinishedOperations("a"); });
  ASSERT_TRUE(ops_a.ok());
  EXPECT_EQ(ops_a->size(), 2u);
  auto none_left = Read([&](Tx& tx) { return tx.ListLiveSandboxes(""); });
  ASSERT_TRUE(none_left.ok());
  EXPECT_TRUE(none_left->empty());
}

// Anti-affinity counts one tenant's live sandboxes carrying one label value, per node.
TEST_P(StoreTest, LabelledSandboxesAreCountedPerNodeForOneTenant) {
  Open();
  std::vector<SandboxRecord> rows;
  auto add = [&](const char* id, const char* node, const char* tenant, nlohmann::json labels,
                 const char* state = "running") {
    SandboxRecord r = FullSandbox(id);
    r.node = node;
    r.tenant_id = tenant;
    r.labels = std::move(labels);
    r.state = state;
    rows.push_back(r);
  };
  add("sbx_1", "a", "ten_a", {{"job", "x"}});
  add("sbx_2", "a", "ten_a", {{"job", "x"}, {"team", "red"}});
  add("sbx_3", "b", "ten_a", {{"job", "x"}});
  add("sbx_4", "b", "ten_a", {{"job", "y"}});                 // another value
  add("sbx_5", "c", "ten_b", {{"job", "x"}});                 // another tenant
  add("sbx_6", "c", "ten_a", {{"job", "x"}}, "lost");         // holds nothing
  add("sbx_7", "c", "ten_a", {{"job", "x"}}, "deleted");
  add("sbx_8", "c", "ten_a", {{"jobs", "x"}, {"Job", "x"}});  // other keys
  add("sbx_9", "c", "ten_a", {{"job", "x'); DROP TABLE sandboxes; --"}});
  for (const auto& r : rows) ASSERT_TRUE(Put(r).ok());
  auto n = Read([&](Tx& tx) { return tx.CountLabelledSandboxesByNode("ten_a", "job", "x"); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (std::map<std::string, int64_t>{{"a", 2}, {"b", 1}}));
  n = Read([&](Tx& tx) { return tx.CountLabelledSandboxesByNode("ten_b", "job", "x"); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (std::map<std::string, int64_t>{{"c", 1}}));
  n = Read([&](Tx& tx) {
    return tx.CountLabelledSandboxesByNode("ten_a", "job", "x'); DROP TABLE sandboxes; --");
  });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (std::map<std::string, int64_t>{{"c", 1}}));
  n = Read([&](Tx& tx) { return tx.CountLabelledSandboxesByNode("ten_a", "nope", "x"); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->empty());
}

// A node declared lost may still finish work it had started; the store keeps the verdict.
TEST_P(StoreTest, LostSandboxesStayLostAndFinishedOperationsStayFinished) {
  Open();
  SandboxRecord sb = FullSandbox("sbx_1");
  sb.node = "a";
  sb.state = "lost";
  sb.error = {{"code", "node_lost"}, {"message", "node a was lost"}};
  ASSERT_TRUE(Put(sb).ok());
  SandboxRecord late = sb;
  late.state = "running";
  late.error = nullptr;
  ASSERT_TRUE(Put(late).ok());  // not an error: nothing changes
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state, "lost");
  EXPECT_EQ(got->error.value("code", ""), "node_lost");
  for (const char* next : {"deleting", "deleted"}) {
    SandboxRecord d = sb;
    d.state = next;
    ASSERT_TRUE(Put(d).ok());
    got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->state, next);
  }

  OperationRecord op = MakeOperation("op_1", "sbx_1", "failed", 1);
  op.error = {{"code", "node_lost"}};
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(op); }).ok());
  OperationRecord done = op;
  done.state = "succeeded";
  done.error = nullptr;
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(done); }).ok());
  auto got_op = Read([&](Tx& tx) { return tx.GetOperation("op_1"); });
  ASSERT_TRUE(got_op.ok());
  EXPECT_EQ(got_op->state, "failed");
  EXPECT_EQ(got_op->error.value("code", ""), "node_lost");
  // Unfinished ones change as before.
  OperationRecord running = MakeOperation("op_2", "sbx_1", "running", 2);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(running); }).ok());
  running.state = "succeeded";
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(running); }).ok());
  got_op = Read([&](Tx& tx) { return tx.GetOperation("op_2"); });
  ASSERT_TRUE(got_op.ok());
  EXPECT_EQ(got_op->state, "succeeded");
}

// A database of schema 8 opens: its rows belong to no node until a single-host sbxd claims them.
TEST_F(SqliteStoreTest, SchemaEightDatabaseGainsNodes) {
  Open();
  ASSERT_TRUE(Put(FullSandbox("sbx_1")).ok());
  store_.reset();
  {
    RawDb raw(path_);
    raw.Exec(SBX_UNDO_SCHEMA_NINE "PRAGMA user_version = 8;");
  }
  Open();
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->node, "");
  auto nodes = Read([&](Tx& tx) { return tx.ListNodes(); });
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_TRUE(nodes->empty());
}

// A database of schema 9 opens: its nodes gain an empty restart deadline.
TEST_F(SqliteStoreTest, SchemaNineDatabaseGainsRestartDeadlines) {
  Open();
  NodeRecord n;
  n.name = "node-a";
  n.url = "http://10.0.0.1:7070";
  n.role = "node";
  n.state = "active";
  n.epoch = 1;
  n.heartbeat_at = n.started_at = Ts(1);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutNode(n); }).ok());
  store_.reset();
  {
    RawDb raw(path_);
    raw.Exec("ALTER TABLE nodes DROP COLUMN restart_by; PRAGMA user_version = 9;");
  }
  Open();
  auto got = Read([&](Tx& tx) { return tx.GetNode("node-a"); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->restart_by, "");
  EXPECT_EQ(got->url, n.url);
}

TEST_P(StoreTest, PurgeDeletedSandboxesTakesTheirOperationsAndSessions) {
  Open();
  for (const auto& [id, state, t] : {std::tuple{"sbx_old", "deleted", 5},
                                     std::tuple{"sbx_new", "deleted", 50},
                                     std::tuple{"sbx_live", "running", 1}}) {
    SandboxRecord sb = MinimalSandbox(id);
    sb.state = state;
    sb.updated_at = Ts(t);
    ASSERT_TRUE(Put(sb).ok());
    OperationRecord op = MakeOperation(std::string("op_") + id, id, "succeeded", t);
    op.initiator = "ttl";
    SessionRecord ses = MakeSession(std::string("ses_") + id, id, t);
    ASSERT_TRUE(store_->Transact([&](Tx& tx) -> absl::Status {
      SBX_RETURN_IF_ERROR(tx.PutOperation(op));
      return tx.PutSession(ses);
    }).ok());
  }
  auto purged = Read([&](Tx& tx) { return tx.PurgeDeletedSandboxes(Ts(10)); });
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 1);
  EXPECT_TRUE(absl::IsNotFound(Read([&](Tx& tx) { return tx.GetSandbox("sbx_old"); }).status()));
  EXPECT_TRUE(
      absl::IsNotFound(Read([&](Tx& tx) { return tx.GetOperation("op_sbx_old"); }).status()));
  EXPECT_TRUE(
      absl::IsNotFound(Read([&](Tx& tx) { return tx.GetSession("ses_sbx_old"); }).status()));
  for (const char* id : {"sbx_new", "sbx_live"}) {
    EXPECT_TRUE(Read([&](Tx& tx) { return tx.GetSandbox(id); }).ok()) << id;
    auto op = Read([&](Tx& tx) { return tx.GetOperation(std::string("op_") + id); });
    ASSERT_TRUE(op.ok()) << id;
    EXPECT_EQ(op->initiator, "ttl");
  }
  purged = Read([&](Tx& tx) { return tx.PurgeDeletedSandboxes(Ts(10)); });
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 0);
}

// Template operations have no sandbox: a finished one goes after the same retention, counted
// from its completion; one still running, or finished later, stays.
TEST_P(StoreTest, PurgeTakesFinishedTemplateOperations) {
  Open();
  struct Case {
    const char* id;
    const char* state;
    std::optional<int> completed;
    bool purged;
  };
  const Case cases[] = {{"op_tpl_old", "succeeded", 5, true},
                        {"op_tpl_failed", "failed", 6, true},
                        {"op_tpl_recent", "succeeded", 50, false},
                        {"op_tpl_running", "running", std::nullopt, false}};
  for (const Case& c : cases) {
    OperationRecord op = MakeOperation(c.id, "", c.state, 1);
    op.kind = "template_build";
    op.target = "app:1";
    if (c.completed) op.completed_at = Ts(*c.completed);
    ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutOperation(op); }).ok());
  }
  ASSERT_TRUE(Read([&](Tx& tx) { return tx.PurgeDeletedSandboxes(Ts(10)); }).ok());
  for (const Case& c : cases) {
    auto got = Read([&](Tx& tx) { return tx.GetOperation(c.id); });
    EXPECT_EQ(absl::IsNotFound(got.status()), c.purged) << c.id;
  }
}

TEST_F(SqliteStoreTest, GarbageFileFailsCleanly) {
  std::string garbage(8192, 'x');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>('a' + i % 26);
  {
    std::ofstream out(path_, std::ios::binary);
    out << garbage;
  }
  auto s = OpenSqliteStore(path_);
  ASSERT_FALSE(s.ok());
  std::string msg(s.status().message());
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("file is not a database"), std::string::npos) << msg;
  // The file is left as it was.
  std::ifstream in(path_, std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, garbage);
}

TEST_F(SqliteStoreTest, UnopenablePathNamesThePath) {
  path_ = (dir_ / "no" / "such" / "dir" / "sbx.db").string();
  auto s = OpenSqliteStore(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.status().message()).find(path_), std::string::npos) << s.status();
}

TEST_F(SqliteStoreTest, NewerSchemaVersionIsRefused) {
  Open();
  store_.reset();
  {
    RawDb raw(path_);
    raw.Exec("PRAGMA user_version = 999");
  }
  auto s = OpenSqliteStore(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  std::string msg(s.status().message());
  EXPECT_NE(msg.find("schema version 999 is newer"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  RawDb raw(path_);
  EXPECT_EQ(raw.QueryText("PRAGMA user_version"), "999");
}

// Read-modify-write of timeout_s from several threads: lost updates would show as a short count.
void Increment(Store& store, int times, std::atomic<int>& failures) {
  for (int i = 0; i < times; ++i) {
    absl::Status st = store.Transact([](Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(SandboxRecord r, tx.GetSandbox("sbx_counter"));
      r.timeout_s = r.timeout_s.value_or(0) + 1;
      return tx.PutSandbox(r);
    });
    if (!st.ok()) {
      ADD_FAILURE() << st;
      ++failures;
    }
  }
}

TEST_P(StoreTest, ConcurrentTransactionsAreSerialized) {
  Open();
  SandboxRecord counter = MinimalSandbox("sbx_counter");
  counter.timeout_s = 0;
  ASSERT_TRUE(Put(counter).ok());

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { Increment(*store_, 200, failures); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_counter"); });
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->timeout_s, 800);
}

TEST_P(StoreTest, TwoStoresOnOneDatabaseDoNotLoseUpdates) {
  Open();
  SandboxRecord counter = MinimalSandbox("sbx_counter");
  counter.timeout_s = 0;
  ASSERT_TRUE(Put(counter).ok());
  auto second = OpenAnother();
  ASSERT_TRUE(second.ok()) << second.status();

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    Store& s = t % 2 == 0 ? *store_ : **second;
    threads.emplace_back([&s, &failures] { Increment(s, 100, failures); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto got = Read([&](Tx& tx) { return tx.GetSandbox("sbx_counter"); });
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->timeout_s, 400);
}

TEST_P(StoreTest, CountsLiveSandboxesByStateAcrossTenants) {
  metrics::Registry registry;
  auto opened = OpenAnother(registry);
  ASSERT_TRUE(opened.ok()) << opened.status();
  store_ = std::move(opened).value();

  auto empty = Read([](Tx& tx) { return tx.CountLiveSandboxesByState(); });
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());

  int i = 0;
  for (const char* state : {"running", "running", "failed", "paused", "deleted", "deleted"}) {
    SandboxRecord r = MinimalSandbox(fmt::format("sbx_{}", i));
    r.tenant_id = i % 2 == 0 ? "ten_a" : "ten_b";
    r.state = state;
    r.created_at = Ts(i++);
    ASSERT_TRUE(Put(r).ok());
  }
  auto counts = Read([](Tx& tx) { return tx.CountLiveSandboxesByState(); });
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts,
            (std::map<std::string, int64_t>{{"failed", 1}, {"paused", 1}, {"running", 2}}));

  // Every statement was timed under its method's name, each transaction's BEGIN and COMMIT too.
  const std::string text = registry.Expose();
  for (const char* line :
       {"sbx_store_query_duration_seconds_count{op=\"PutSandbox\"} 6\n",
        "sbx_store_query_duration_seconds_count{op=\"CountLiveSandboxesByState\"} 2\n",
        "sbx_store_query_duration_seconds_count{op=\"Begin\"} 8\n",
        "sbx_store_query_duration_seconds_count{op=\"Commit\"} 8\n",
        "sbx_store_query_duration_seconds_count{op=\"GetSandbox\"} 0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in:\n" << text;
  }
}

// --- Tenancy (issue 18): tenants, tokens, the audit log, usage for quotas. ---

TenantRecord MakeTenant(const std::string& id, int t) {
  TenantRecord r;
  r.id = id;
  r.name = id + "-name";
  r.quotas = {{"max_sandboxes", 10}, {"max_vcpu", 8}, {"max_template_bytes", int64_t{1} << 40}};
  r.rate_limit = {{"requests_per_s", 5.5}, {"burst", 20}};
  r.egress_profiles = Json::array({"dev", "pypi"});
  r.created_at = Ts(t);
  r.updated_at = Ts(t);
  return r;
}

TokenRecord MakeToken(const std::string& id, const std::string& tenant_id, int t) {
  TokenRecord r;
  r.id = id;
  r.tenant_id = tenant_id;
  r.name = id + "-name";
  r.hash = "sha256:" + std::string(64, 'e');
  r.created_at = Ts(t);
  return r;
}

AuditRecord MakeAudit(const std::string& tenant_id, int t, const std::string& action) {
  AuditRecord r;
  r.time = Ts(t);
  r.tenant_id = tenant_id;
  r.token_id = "tok_" + tenant_id;
  r.action = action;
  r.target = "sbx_1";
  r.status = 201;
  r.request_id = fmt::format("req_{}", t);
  return r;
}

void ExpectTenantEq(const TenantRecord& a, const TenantRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.quotas, b.quotas);
  EXPECT_EQ(a.rate_limit, b.rate_limit);
  EXPECT_EQ(a.egress_profiles, b.egress_profiles);
  EXPECT_EQ(a.created_at, b.created_at);
  EXPECT_EQ(a.updated_at, b.updated_at);
}

void ExpectTokenEq(const TokenRecord& a, const TokenRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tenant_id, b.tenant_id);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_EQ(a.scopes, b.scopes);
  EXPECT_EQ(a.expires_at, b.expires_at);
  EXPECT_EQ(a.created_at, b.created_at);
  EXPECT_EQ(a.revoked_at, b.revoked_at);
}

void ExpectAuditEq(const AuditRecord& a, const AuditRecord& b) {
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.time, b.time);
  EXPECT_EQ(a.tenant_id, b.tenant_id);
  EXPECT_EQ(a.token_id, b.token_id);
  EXPECT_EQ(a.action, b.action);
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.request_id, b.request_id);
}

template <typename T>
std::vector<std::string> Ids(const std::vector<T>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) out.push_back(r.id);
  return out;
}

// "default" as migration 7 inserted it: active, no quota, created when the schema was made.
void ExpectDefaultTenant(const TenantRecord& t) {
  EXPECT_EQ(t.id, "default");
  EXPECT_EQ(t.name, "default");
  EXPECT_EQ(t.state, "active");
  EXPECT_EQ(t.quotas, Json::object());
  EXPECT_EQ(t.rate_limit, Json::object());
  EXPECT_TRUE(ParseRfc3339(t.created_at).has_value()) << t.created_at;
  EXPECT_EQ(t.updated_at, t.created_at);
}

TEST_P(StoreTest, DefaultTenantExistsAfterOpen) {
  Open();
  auto def = Read([](Tx& tx) { return tx.GetTenant("default"); });
  ASSERT_TRUE(def.ok()) << def.status();
  ExpectDefaultTenant(*def);
  auto all = Read([](Tx& tx) { return tx.ListTenants(); });
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(Ids(*all), std::vector<std::string>{"default"});
}

TEST_P(StoreTest, TenantsRoundTripUpsertListAndDelete) {
  Open();
  TenantRecord a = MakeTenant("ten_a", 2);
  TenantRecord b = MakeTenant("ten_b", 1);
  b.quotas = nullptr;  // JSON null and an empty object stay distinct
  b.rate_limit = Json::object();
  TenantRecord c = MakeTenant("ten_c", 1);  // same created_at as ten_b: the id breaks the tie
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    for (const auto& t : {a, c, b}) SBX_RETURN_IF_ERROR(tx.PutTenant(t));
                    return absl::OkStatus();
                  })
                  .ok());
  for (const auto& want : {a, b, c}) {
    auto got = Read([&](Tx& tx) { return tx.GetTenant(want.id); });
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectTenantEq(*got, want);
  }
  auto got_b = Read([&](Tx& tx) { return tx.GetTenant("ten_b"); });
  ASSERT_TRUE(got_b.ok());
  EXPECT_TRUE(got_b->quotas.is_null());
  EXPECT_TRUE(got_b->rate_limit.is_object() && got_b->rate_limit.empty());

  auto all = Read([](Tx& tx) { return tx.ListTenants(); });
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> ids = Ids(*all);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "default"), 1);
  ids.erase(std::remove(ids.begin(), ids.end(), "default"), ids.end());  // created "now"
  EXPECT_EQ(ids, (std::vector<std::string>{"ten_b", "ten_c", "ten_a"}));

  // Upsert overwrites every field.
  TenantRecord changed = a;
  changed.name = "renamed";
  changed.state = "deleting";
  changed.quotas = {{"max_sessions_per_sandbox", 3}};
  changed.rate_limit = nullptr;
  changed.updated_at = Ts(9);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutTenant(changed); }).ok());
  auto got = Read([&](Tx& tx) { return tx.GetTenant("ten_a"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectTenantEq(*got, changed);

  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.DeleteTenant("ten_a"); }).ok());
  got = Read([&](Tx& tx) { return tx.GetTenant("ten_a"); });
  EXPECT_EQ(got.status(), absl::NotFoundError("tenant ten_a not found"));
  absl::Status st = store_->Transact([&](Tx& tx) { return tx.DeleteTenant("ten_a"); });
  EXPECT_EQ(st, absl::NotFoundError("tenant ten_a not found"));
  all = Read([](Tx& tx) { return tx.ListTenants(); });
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
}

// One read where PostgreSQL can: every field of both rows, the sandbox's own columns not
// shadowed by the tenant's of the same name (id, state, created_at, ...).
TEST_P(StoreTest, SandboxAndTenantAreReadTogether) {
  Open();
  TenantRecord ten = MakeTenant("ten_a", 3);
  ten.state = "deleting";
  ten.quotas = {{"max_sessions_per_sandbox", 2}};
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutTenant(ten); }).ok());
  SandboxRecord full = FullSandbox("sbx_full");
  full.tenant_id = "ten_a";
  SandboxRecord orphan = MinimalSandbox("sbx_orphan");
  orphan.tenant_id = "ten_without_row";
  ASSERT_TRUE(Put(full).ok());
  ASSERT_TRUE(Put(orphan).ok());

  auto both = Read([&](Tx& tx) { return tx.GetSandboxAndTenant("sbx_full"); });
  ASSERT_TRUE(both.ok()) << both.status();
  ExpectSandboxEq(both->sandbox, full);
  ASSERT_TRUE(both->tenant.has_value());
  ExpectTenantEq(*both->tenant, ten);

  both = Read([&](Tx& tx) { return tx.GetSandboxAndTenant("sbx_orphan"); });
  ASSERT_TRUE(both.ok()) << both.status();
  ExpectSandboxEq(both->sandbox, orphan);
  EXPECT_FALSE(both->tenant.has_value());

  both = Read([&](Tx& tx) { return tx.GetSandboxAndTenant("sbx_nope"); });
  EXPECT_EQ(both.status(), absl::NotFoundError("sandbox sbx_nope not found"));

  // Inside a transaction, what it wrote before is what it reads.
  auto in_tx = absl::StatusOr<SandboxAndTenant>(absl::InternalError("not run"));
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    TenantRecord renamed = ten;
                    renamed.name = "renamed";
                    SBX_RETURN_IF_ERROR(tx.PutTenant(renamed));
                    in_tx = tx.GetSandboxAndTenant("sbx_full");
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(in_tx.ok()) << in_tx.status();
  ASSERT_TRUE(in_tx->tenant.has_value());
  EXPECT_EQ(in_tx->tenant->name, "renamed");
}

// A session ends once: the first end says where it ended from, a second one changes nothing.
TEST_P(StoreTest, EndSessionEndsOnceAndKeepsWhatItMustNotChange) {
  Open();
  ASSERT_TRUE(Put(MinimalSandbox("sbx_1")).ok());
  SessionRecord created = MakeSession("ses_created", "sbx_1", 1);
  SessionRecord running = MakeSession("ses_running", "sbx_1", 2);
  running.state = "running";
  running.started_at = Ts(3);
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    SBX_RETURN_IF_ERROR(tx.PutSession(created));
                    return tx.PutSession(running);
                  })
                  .ok());

  SessionEnd killed;
  killed.signal = "SIGKILL";
  killed.oom_killed = true;
  killed.at = Ts(10);
  // The store's form, a transaction of its own (one statement on PostgreSQL).
  auto was = store_->EndSession("ses_created", killed);
  ASSERT_TRUE(was.ok()) << was.status();
  EXPECT_EQ(*was, "created");
  auto got = Read([&](Tx& tx) { return tx.GetSession("ses_created"); });
  ASSERT_TRUE(got.ok()) << got.status();
  SessionRecord want = created;
  want.state = "exited";
  want.signal = "SIGKILL";
  want.oom_killed = true;
  want.started_at = Ts(10);  // never started: it started when it ended
  want.exited_at = Ts(10);
  ExpectSessionEq(*got, want);
  EXPECT_FALSE(got->exit_code.has_value());

  // Ended already: nothing changes.
  SessionEnd later;
  later.exit_code = 3;
  later.at = Ts(20);
  was = store_->EndSession("ses_created", later);
  ASSERT_TRUE(was.ok()) << was.status();
  EXPECT_EQ(*was, "");
  got = Read([&](Tx& tx) { return tx.GetSession("ses_created"); });
  ASSERT_TRUE(got.ok());
  ExpectSessionEq(*got, want);

  SessionEnd exited;
  exited.exit_code = 0;
  exited.timed_out = true;
  exited.at = Ts(30);
  // Inside a transaction, with what else it does.
  was = Read([&](Tx& tx) { return tx.EndSession("ses_running", exited); });
  ASSERT_TRUE(was.ok()) << was.status();
  EXPECT_EQ(*was, "running");
  got = Read([&](Tx& tx) { return tx.GetSession("ses_running"); });
  ASSERT_TRUE(got.ok());
  want = running;
  want.state = "exited";
  want.exit_code = 0;
  want.timed_out = true;
  want.exited_at = Ts(30);  // started_at stays Ts(3)
  ExpectSessionEq(*got, want);

  was = Read([&](Tx& tx) { return tx.EndSession("ses_nope", exited); });
  EXPECT_EQ(was.status(), absl::NotFoundError("session ses_nope not found"));
  was = store_->EndSession("ses_nope", exited);
  EXPECT_EQ(was.status(), absl::NotFoundError("session ses_nope not found"));

  // Ends racing from several threads: exactly one moves it, the others find it ended.
  SessionRecord raced = MakeSession("ses_raced", "sbx_1", 5);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutSession(raced); }).ok());
  std::atomic<int> moved{0}, found_ended{0}, failed{0};
  std::vector<std::thread> racers;
  for (int i = 0; i < 4; ++i) {
    racers.emplace_back([&, i] {
      SessionEnd e;
      e.exit_code = i;
      e.at = Ts(40 + i);
      auto r = store_->EndSession("ses_raced", e);
      if (!r.ok()) {
        ++failed;
      } else if (*r == "created") {
        ++moved;
      } else if (r->empty()) {
        ++found_ended;
      }
    });
  }
  for (auto& t : racers) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(moved.load(), 1);
  EXPECT_EQ(found_ended.load(), 3);

  // Rolled back with its transaction.
  SessionRecord again = MakeSession("ses_again", "sbx_1", 4);
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutSession(again); }).ok());
  absl::Status st = store_->Transact([&](Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.EndSession("ses_again", exited).status());
    return absl::AbortedError("changed my mind");
  });
  EXPECT_EQ(st, absl::AbortedError("changed my mind"));
  got = Read([&](Tx& tx) { return tx.GetSession("ses_again"); });
  ASSERT_TRUE(got.ok());
  ExpectSessionEq(*got, again);
}

TEST_P(StoreTest, TokensRoundTripListAndRevoke) {
  Open();
  TokenRecord bare = MakeToken("tok_bare", "default", 3);  // no expiry, never revoked, no scope
  TokenRecord full = MakeToken("tok_full", "default", 2);
  full.scopes = {"read", "sandboxes", "admin"};
  full.expires_at = Ts(100);
  full.revoked_at = Ts(50);
  TokenRecord nulls = MakeToken("tok_nulls", "default", 3);  // same created_at as tok_bare
  nulls.scopes = nullptr;
  TokenRecord other = MakeToken("tok_other", "ten_b", 1);
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    SBX_RETURN_IF_ERROR(tx.PutTenant(MakeTenant("ten_b", 1)));
                    for (const auto& t : {nulls, full, other, bare}) {
                      SBX_RETURN_IF_ERROR(tx.PutToken(t));
                    }
                    return absl::OkStatus();
                  })
                  .ok());
  for (const auto& want : {bare, full, nulls, other}) {
    auto got = Read([&](Tx& tx) { return tx.GetToken(want.id); });
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectTokenEq(*got, want);
  }
  auto got = Read([&](Tx& tx) { return tx.GetToken("tok_bare"); });
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->expires_at.has_value());
  EXPECT_FALSE(got->revoked_at.has_value());
  EXPECT_TRUE(got->scopes.is_array() && got->scopes.empty());
  got = Read([&](Tx& tx) { return tx.GetToken("tok_nulls"); });
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->scopes.is_null());

  auto list = Read([](Tx& tx) { return tx.ListTokens("default"); });
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(Ids(*list), (std::vector<std::string>{"tok_full", "tok_bare", "tok_nulls"}));
  list = Read([](Tx& tx) { return tx.ListTokens("ten_nobody"); });
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());

  // Revoking is an upsert with revoked_at set; un-setting a field clears it.
  bare.revoked_at = Ts(60);
  full.expires_at.reset();
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    SBX_RETURN_IF_ERROR(tx.PutToken(bare));
                    return tx.PutToken(full);
                  })
                  .ok());
  for (const auto& want : {bare, full}) {
    got = Read([&](Tx& tx) { return tx.GetToken(want.id); });
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectTokenEq(*got, want);
  }
  EXPECT_EQ(Read([](Tx& tx) { return tx.GetToken("tok_nope"); }).status(),
            absl::NotFoundError("token tok_nope not found"));

  // A token of no tenant is refused at commit, and nothing is kept.
  absl::Status st = store_->Transact(
      [&](Tx& tx) { return tx.PutToken(MakeToken("tok_orphan", "ten_ghost", 1)); });
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::IsNotFound(Read([](Tx& tx) { return tx.GetToken("tok_orphan"); }).status()));
}

TEST_P(StoreTest, DeleteTenantTakesItsTokens) {
  Open();
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    SBX_RETURN_IF_ERROR(tx.PutTenant(MakeTenant("ten_a", 1)));
                    SBX_RETURN_IF_ERROR(tx.PutTenant(MakeTenant("ten_b", 1)));
                    SBX_RETURN_IF_ERROR(tx.PutToken(MakeToken("tok_a1", "ten_a", 1)));
                    SBX_RETURN_IF_ERROR(tx.PutToken(MakeToken("tok_a2", "ten_a", 2)));
                    return tx.PutToken(MakeToken("tok_b1", "ten_b", 1));
                  })
                  .ok());
  absl::Status st = store_->Transact([](Tx& tx) { return tx.DeleteTenant("ten_a"); });
  ASSERT_TRUE(st.ok()) << st;
  for (const char* id : {"tok_a1", "tok_a2"}) {
    EXPECT_TRUE(absl::IsNotFound(Read([&](Tx& tx) { return tx.GetToken(id); }).status())) << id;
  }
  auto list = Read([](Tx& tx) { return tx.ListTokens("ten_a"); });
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  EXPECT_TRUE(Read([](Tx& tx) { return tx.GetToken("tok_b1"); }).ok());
  EXPECT_TRUE(Read([](Tx& tx) { return tx.GetTenant("ten_b"); }).ok());
  // A missing tenant is NotFound and the transaction keeps nothing it did before.
  st = store_->Transact([](Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.PutToken(MakeToken("tok_b2", "ten_b", 3)));
    return tx.DeleteTenant("ten_a");
  });
  EXPECT_EQ(st, absl::NotFoundError("tenant ten_a not found"));
  EXPECT_TRUE(absl::IsNotFound(Read([](Tx& tx) { return tx.GetToken("tok_b2"); }).status()));
}

TEST_P(StoreTest, AuditAppendsAndListsBySeq) {
  Open();
  std::vector<AuditRecord> in = {MakeAudit("ten_a", 1, "POST /v1/sandboxes"),
                                 MakeAudit("ten_b", 2, "DELETE /v1/sandboxes/{id}"),
                                 MakeAudit("ten_a", 3, "GET /v1/audit"),
                                 MakeAudit("ten_a", 4, "POST /v1/tenants")};
  in[1].status = 404;
  in[1].code = "not_found";
  in[1].target = "";
  in[2].token_id = "bootstrap";
  in[3].token_id = "";  // unauthenticated
  in[3].seq = 99;       // ignored: the store assigns seqs
  std::vector<int64_t> seqs;
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    for (const auto& r : in) {
                      SBX_ASSIGN_OR_RETURN(int64_t seq, tx.AppendAudit(r));
                      seqs.push_back(seq);
                    }
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 2, 3, 4}));
  for (size_t i = 0; i < in.size(); ++i) in[i].seq = seqs[i];

  auto list = [&](AuditFilter f) {
    auto rows = Read([&](Tx& tx) { return tx.ListAudit(f); });
    EXPECT_TRUE(rows.ok()) << rows.status();
    std::vector<int64_t> out;
    if (rows.ok()) {
      for (const auto& r : *rows) out.push_back(r.seq);
    }
    return out;
  };
  auto all = Read([](Tx& tx) { return tx.ListAudit(AuditFilter{}); });
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  for (size_t i = 0; i < in.size(); ++i) ExpectAuditEq((*all)[i], in[i]);

  AuditFilter f;
  f.tenant_id = "ten_a";
  EXPECT_EQ(list(f), (std::vector<int64_t>{1, 3, 4}));
  f.tenant_id = "ten_nobody";
  EXPECT_TRUE(list(f).empty());
  f = AuditFilter{};
  f.since = Ts(2);  // inclusive
  EXPECT_EQ(list(f), (std::vector<int64_t>{2, 3, 4}));
  f.tenant_id = "ten_a";
  EXPECT_EQ(list(f), (std::vector<int64_t>{3, 4}));
  f.after_seq = 3;
  EXPECT_EQ(list(f), (std::vector<int64_t>{4}));
  f = AuditFilter{};
  f.after_seq = 1;
  f.limit = 2;
  EXPECT_EQ(list(f), (std::vector<int64_t>{2, 3}));
  f.after_seq = 4;
  EXPECT_TRUE(list(f).empty());
  f = AuditFilter{};
  f.limit = 0;  // clamped to 1
  EXPECT_EQ(list(f), (std::vector<int64_t>{1}));
  f.limit = -5;
  EXPECT_EQ(list(f), (std::vector<int64_t>{1}));
  f.since = "2999-01-01T00:00:00.000Z";
  f.limit = 100;
  EXPECT_TRUE(list(f).empty());
}

TEST_P(StoreTest, AuditPagesAtMostAThousandAndNeverReusesASeq) {
  Open();
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    for (int i = 0; i < 1001; ++i) {
                      SBX_RETURN_IF_ERROR(tx.AppendAudit(MakeAudit("ten_a", i % 3600, "GET /x"))
                                              .status());
                    }
                    return absl::OkStatus();
                  })
                  .ok());
  AuditFilter f;
  f.limit = 5000;
  auto rows = Read([&](Tx& tx) { return tx.ListAudit(f); });
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1000u);
  EXPECT_EQ(rows->back().seq, 1000);
  f.after_seq = rows->back().seq;
  rows = Read([&](Tx& tx) { return tx.ListAudit(f); });
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ(rows->front().seq, 1001);

  // Lines are never updated. Even a line removed by hand (a future retention purge) does not
  // give its seq to the next one, so a client paging with after_seq skips nothing.
  store_.reset();
  EXPECT_NE(RawExec("UPDATE audit_log SET status = 500 WHERE seq = 1").find("append-only"),
            std::string::npos);
  EXPECT_EQ(RawExec("DELETE FROM audit_log WHERE seq > 999"), "");
  Open();
  auto seq = Read([](Tx& tx) { return tx.AppendAudit(MakeAudit("ten_a", 1, "GET /y")); });
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(*seq, 1002);
  rows = Read([](Tx& tx) { return tx.ListAudit(AuditFilter{.after_seq = 998}); });
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].seq, 999);
  EXPECT_EQ((*rows)[0].status, 201);
  EXPECT_EQ((*rows)[1].seq, 1002);
}

TEST_P(StoreTest, AddAuditAppendsInOrderWithAppendAudit) {
  Open();
  auto first = Read([](Tx& tx) { return tx.AppendAudit(MakeAudit("ten_a", 1, "GET /1")); });
  ASSERT_TRUE(first.ok()) << first.status();
  for (const char* action : {"POST /2", "POST /3"}) {
    absl::Status st = store_->Transact([&](Tx& tx) { return tx.AddAudit(MakeAudit("ten_a", 2, action)); });
    ASSERT_TRUE(st.ok()) << st;
  }
  auto last = Read([](Tx& tx) { return tx.AppendAudit(MakeAudit("ten_b", 3, "GET /4")); });
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, *first + 3);
  auto rows = Read([](Tx& tx) { return tx.ListAudit(AuditFilter{}); });
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 4u);
  const char* actions[] = {"GET /1", "POST /2", "POST /3", "GET /4"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*rows)[i].action, actions[i]);
    EXPECT_EQ((*rows)[i].seq, *first + static_cast<int64_t>(i));
  }
}

// Store::Read: what is committed, one statement at a time; never a write on PostgreSQL, where
// it runs outside a transaction.
TEST_P(StoreTest, ReadSeesWhatIsCommitted) {
  Open();
  ASSERT_TRUE(Put(FullSandbox("sbx_1")).ok());
  SandboxRecord got;
  absl::Status st = store_->Read([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(got, tx.GetSandbox("sbx_1"));
    return absl::OkStatus();
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(got.id, "sbx_1");
  st = store_->Read([&](Tx& tx) { return tx.GetSandbox("sbx_none").status(); });
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  // A failed statement inside a Read leaves the connection usable.
  for (int i = 0; i < 4; ++i) {
    st = store_->Read([&](Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(auto page, tx.ListSandboxes({.tenant_id = "ten_a", .page_token = "junk"}));
      return absl::OkStatus();
    });
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Read([&](Tx& tx) { return tx.GetSandbox("sbx_1"); }).ok());
  }
  if (GetParam() == std::string("postgresql")) {
    st = store_->Read([&](Tx& tx) { return tx.PutSandbox(MinimalSandbox("sbx_2")); });
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_EQ(Read([&](Tx& tx) { return tx.GetSandbox("sbx_2"); }).status().code(),
              absl::StatusCode::kNotFound);
  }
}

SandboxRecord UsageSandbox(const std::string& id, const std::string& tenant, const char* state,
                           Json effective) {
  SandboxRecord r = MinimalSandbox(id);
  r.tenant_id = tenant;
  r.state = state;
  r.effective_resources = std::move(effective);
  return r;
}

Json Res(int64_t vcpu, int64_t memory_mib, int64_t disk_mib) {
  return {{"vcpu", vcpu}, {"memory_mib", memory_mib}, {"disk_mib", disk_mib}, {"pids", 1000}};
}

TEST_P(StoreTest, TenantUsageCountsWhatEachStateHolds) {
  Open();
  const std::vector<SandboxRecord> sandboxes = {
      UsageSandbox("sbx_creating", "ten_a", "creating", Res(1, 256, 1024)),
      UsageSandbox("sbx_running", "ten_a", "running", Res(2, 512, 2048)),
      UsageSandbox("sbx_paused", "ten_a", "paused", Res(1, 128, 512)),
      UsageSandbox("sbx_suspended", "ten_a", "suspended", Res(4, 4096, 8192)),  // disk only
      UsageSandbox("sbx_deleting", "ten_a", "deleting", Res(1, 64, 100)),
      UsageSandbox("sbx_deleted", "ten_a", "deleted", Res(8, 8192, 80000)),   // nothing
      UsageSandbox("sbx_failed", "ten_a", "failed", Res(16, 16384, 160000)),  // nothing
      UsageSandbox("sbx_null", "ten_a", "running", nullptr),                  // counts, holds 0
      UsageSandbox("sbx_partial", "ten_a", "running", {{"vcpu", 3}}),         // missing keys: 0
      UsageSandbox("sbx_other", "ten_b", "running", Res(100, 100000, 1000000)),
  };
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    for (const auto& r : sandboxes) SBX_RETURN_IF_ERROR(tx.PutSandbox(r));
                    return absl::OkStatus();
                  })
                  .ok());
  auto usage = Read([](Tx& tx) { return tx.GetTenantUsage("ten_a"); });
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->sandboxes, 7);
  EXPECT_EQ(usage->vcpu, 1 + 2 + 1 + 1 + 3);
  EXPECT_EQ(usage->memory_mib, 256 + 512 + 128 + 64);
  EXPECT_EQ(usage->disk_mib, 1024 + 2048 + 512 + 8192 + 100);

  usage = Read([](Tx& tx) { return tx.GetTenantUsage("ten_b"); });
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->sandboxes, 1);
  EXPECT_EQ(usage->vcpu, 100);
  EXPECT_EQ(usage->memory_mib, 100000);
  EXPECT_EQ(usage->disk_mib, 1000000);

  usage = Read([](Tx& tx) { return tx.GetTenantUsage("ten_nobody"); });
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->sandboxes, 0);
  EXPECT_EQ(usage->vcpu, 0);
  EXPECT_EQ(usage->memory_mib, 0);
  EXPECT_EQ(usage->disk_mib, 0);

  // A state change moves the sums: resuming gives back vcpu and memory, failing frees it all.
  SandboxRecord resumed = sandboxes[3];
  resumed.state = "running";
  SandboxRecord failed = sandboxes[1];
  failed.state = "failed";
  ASSERT_TRUE(Put(resumed).ok());
  ASSERT_TRUE(Put(failed).ok());
  usage = Read([](Tx& tx) { return tx.GetTenantUsage("ten_a"); });
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->sandboxes, 6);
  EXPECT_EQ(usage->vcpu, 1 + 1 + 4 + 1 + 3);
  EXPECT_EQ(usage->memory_mib, 256 + 128 + 4096 + 64);
  EXPECT_EQ(usage->disk_mib, 1024 + 512 + 8192 + 100);
}

TEST_P(StoreTest, CountsLiveSessionsOfOneSandbox) {
  Open();
  ASSERT_TRUE(Put(MinimalSandbox("sbx_1")).ok());
  ASSERT_TRUE(Put(MinimalSandbox("sbx_2")).ok());
  ASSERT_TRUE(store_
                  ->Transact([&](Tx& tx) -> absl::Status {
                    int i = 0;
                    for (const char* state : {"created", "running", "exited", "exited"}) {
                      SessionRecord s = MakeSession(fmt::format("ses_{}", i), "sbx_1", i);
                      s.state = state;
                      ++i;
                      SBX_RETURN_IF_ERROR(tx.PutSession(s));
                    }
                    SessionRecord other = MakeSession("ses_other", "sbx_2", 1);
                    other.state = "running";
                    return tx.PutSession(other);
                  })
                  .ok());
  auto n = Read([](Tx& tx) { return tx.CountLiveSessions("sbx_1"); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  n = Read([](Tx& tx) { return tx.CountLiveSessions("sbx_2"); });
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
  n = Read([](Tx& tx) { return tx.CountLiveSessions("sbx_nope"); });
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
}

// A version-7 database opens at version 8: its tenants may use every egress profile (null), and a
// list written afterwards reads back.
TEST_F(SqliteStoreTest, SchemaSevenDatabaseGainsEgressProfilesPerTenant) {
  Open();
  TenantRecord t = MakeTenant("ten_a", 1);
  t.egress_profiles = nullptr;
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutTenant(t); }).ok());
  store_.reset();
  {
    RawDb raw(path_);
    raw.Exec(SBX_UNDO_SCHEMA_NINE "ALTER TABLE tenants DROP COLUMN egress_profiles; PRAGMA user_version = 7;");
  }
  Open();
  auto got = Read([&](Tx& tx) { return tx.GetTenant("ten_a"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectTenantEq(*got, t);
  EXPECT_TRUE(got->egress_profiles.is_null());
  t.egress_profiles = Json::array({"dev"});
  ASSERT_TRUE(store_->Transact([&](Tx& tx) { return tx.PutTenant(t); }).ok());
  got = Read([&](Tx& tx) { return tx.GetTenant("ten_a"); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->egress_profiles, Json::array({"dev"}));
  store_.reset();
  RawDb raw(path_);
  EXPECT_EQ(raw.QueryText("PRAGMA user_version"), "10");
}

// A version-6 database (before tenancy) opens at version 8: its rows are untouched, it gains the
// "default" tenant its sandboxes belong to, and the new index covers the rows it already had.
TEST_F(SqliteStoreTest, SchemaSixDatabaseGainsTenancy) {
  Open();
  SandboxRecord sb = FullSandbox("sbx_1");
  sb.tenant_id = "default";
  sb.effective_resources = Res(2, 512, 1024);
  ASSERT_TRUE(Put(sb).ok());
  store_.reset();
  {
    RawDb raw(path_);
    raw.Exec(kUndoSchemaSeven);
    EXPECT_EQ(raw.QueryText("SELECT COUNT(*) FROM sqlite_master WHERE name = 'tenants'"), "0");
  }
  Open();
  store_.reset();
  {
    RawDb raw(path_);
    EXPECT_EQ(raw.QueryText("PRAGMA user_version"), "10");
    EXPECT_EQ(raw.QueryText("SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_master"
                            " WHERE name IN ('tenants', 'tokens', 'audit_log', 'tokens_by_tenant',"
                            " 'audit_by_tenant', 'audit_by_time', 'sandboxes_tenant_usage')"
                            " ORDER BY name)"),
              "audit_by_tenant,audit_by_time,audit_log,sandboxes_tenant_usage,tenants,tokens,"
              "tokens_by_tenant");
    // The usage query's condition lets SQLite use the partial index.
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(raw.db,
                                 "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM sandboxes"
                                 " WHERE tenant_id = ?1 AND state NOT IN ('deleted', 'failed')",
                                 -1, &st, nullptr),
              SQLITE_OK);
    std::string plan;
    while (sqlite3_step(st) == SQLITE_ROW) {
      plan += reinterpret_cast<const char*>(sqlite3_column_text(st, 3));
    }
    sqlite3_finalize(st);
    EXPECT_NE(plan.find("sandboxes_tenant_usage"), std::string::npos) << plan;
  }
  Open();
  auto got = Read([](Tx& tx) { return tx.GetSandbox("sbx_1"); });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSandboxEq(*got, sb);
  auto def = Read([](Tx& tx) { return tx.GetTenant("default"); });
  ASSERT_TRUE(def.ok()) << def.status();
  ExpectDefaultTenant(*def);
  auto usage = Read([](Tx& tx) { return tx.GetTenantUsage("default"); });
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->sandboxes, 1);
  EXPECT_EQ(usage->vcpu, 2);
  EXPECT_EQ(usage->memory_mib, 512);
  EXPECT_EQ(usage->disk_mib, 1024);
  auto seq = Read([](Tx& tx) { return tx.AppendAudit(MakeAudit("default", 1, "GET /v1/x")); });
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(*seq, 1);
}

}  // namespace
}  // namespace sbx::store

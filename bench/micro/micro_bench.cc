// sbx-micro-bench: Google Benchmark micro-benchmarks of sbxd's hot paths, run against the real
// code (protocol codec, request parser, views, SSE encoder, SqliteStore), never copies of it.
//
// CI (short mode, JSON report), one line:
//   build/bin/sbx-micro-bench --benchmark_min_time=0.01
//       --benchmark_out=micro.json --benchmark_out_format=json
// (Debian 12 ships Google Benchmark 1.7: --benchmark_min_time takes plain seconds, no "s".)
#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "api/attach_events.h"
#include "api/requests.h"
#include "common/base64.h"
#include "common/digest.h"
#include "common/ids.h"
#include "common/metrics.h"
#include "common/time_util.h"
#include "protocol/protocol.h"
#include "service/service_metrics.h"
#include "service/views.h"
#include "store/sqlite_store.h"

namespace {

namespace fs = std::filesystem;
using sbx::protocol::FrameType;

std::string Payload(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + (i >> 7));
  return s;
}

// ---- protocol frames ---------------------------------------------------------------------

void BM_OutputFrameEncode(benchmark::State& state) {
  sbx::protocol::OutputEvent ev;
  ev.event_id = 12345;
  ev.offset = 1 << 30;
  ev.data = Payload(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    std::string frame =
        sbx::protocol::EncodeFrame(FrameType::kOutput, sbx::protocol::EncodeOutput(ev));
    benchmark::DoNotOptimize(frame.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_OutputFrameEncode)->Arg(4 << 10)->Arg(64 << 10);

// What sbxd does per frame on an attach stream: feed the socket bytes, take the frame out, and
// decode the output payload.
void BM_OutputFrameDecode(benchmark::State& state) {
  sbx::protocol::OutputEvent ev;
  ev.event_id = 12345;
  ev.data = Payload(static_cast<size_t>(state.range(0)));
  const std::string wire =
      sbx::protocol::EncodeFrame(FrameType::kOutput, sbx::protocol::EncodeOutput(ev));
  sbx::protocol::FrameDecoder decoder;
  for (auto _ : state) {
    decoder.Feed(wire);
    auto frame = decoder.Next();
    if (!frame.ok() || !*frame) {
      state.SkipWithError("frame did not decode");
      break;
    }
    auto out = sbx::protocol::DecodeOutput((*frame)->payload);
    if (!out.ok()) {
      state.SkipWithError("output payload did not decode");
      break;
    }
    benchmark::DoNotOptimize(out->data.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_OutputFrameDecode)->Arg(4 << 10)->Arg(64 << 10);

// ---- JSON: request parsing and views -----------------------------------------------------

void BM_ParseCreateSandbox(benchmark::State& state) {
  const std::string body = R"({"template":"base:latest",
    "resources":{"vcpu":2,"memory_mib":1024,"disk_mib":4096},
    "egress_profile":"none",
    "env":{"PATH":"/usr/local/bin:/usr/bin:/bin","LANG":"C.UTF-8","TASK_ID":"t-000123"},
    "labels":{"team":"agents","run":"r-42","owner":"ci"},
    "runtime":"ns"})";
  const sbx::api::ResourceLimits limits;
  for (auto _ : state) {
    auto r = sbx::api::ParseCreateSandbox(body, limits);
    if (!r.ok()) {
      state.SkipWithError("create-sandbox body was rejected");
      break;
    }
    benchmark::DoNotOptimize(r->vcpu);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_ParseCreateSandbox);

sbx::store::SandboxRecord SampleSandbox() {
  sbx::store::SandboxRecord r;
  r.id = sbx::NewId("sbx");
  r.tenant_id = "default";
  r.state = "running";
  r.template_ref = "base:latest";
  r.template_digest = "sha256:" + sbx::Sha256Hex("base");
  r.runtime = "ns";
  r.resources = {{"vcpu", 2}, {"memory_mib", 1024}, {"disk_mib", nullptr}};
  r.effective_resources = {{"vcpu", 2}, {"memory_mib", 1024}, {"disk_mib", 1024}, {"pids", 512}};
  r.egress_profile = "none";
  r.env = {{"LANG", "C.UTF-8"}, {"TASK_ID", "t-000123"}};
  r.labels = {{"team", "agents"}, {"run", "r-42"}};
  r.created_at = sbx::NowRfc3339();
  r.updated_at = r.created_at;
  r.current_operation_id = sbx::NewId("op");
  return r;
}

void BM_DumpSandboxView(benchmark::State& state) {
  const sbx::store::SandboxRecord r = SampleSandbox();
  size_t bytes = 0;
  for (auto _ : state) {
    std::string s = sbx::service::SandboxView(r).dump();
    bytes += s.size();
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_DumpSandboxView);

// ---- SSE output event --------------------------------------------------------------------

void BM_SseStdoutEvent(benchmark::State& state) {
  const std::string data = Payload(static_cast<size_t>(state.range(0)));
  uint64_t id = 1;
  for (auto _ : state) {
    std::string ev = sbx::api::SseOutputEvent(id++, sbx::protocol::Stream::kStdout, 1 << 30, data);
    benchmark::DoNotOptimize(ev.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_SseStdoutEvent)->Arg(64 << 10);

void BM_Base64Encode(benchmark::State& state) {
  const std::string data = Payload(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    std::string s = sbx::Base64Encode(data);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Base64Encode)->Arg(64 << 10);

void BM_Base64Decode(benchmark::State& state) {
  const std::string b64 = sbx::Base64Encode(Payload(static_cast<size_t>(state.range(0))));
  std::string out;
  for (auto _ : state) {
    if (!sbx::Base64DecodeTo(b64, out)) {
      state.SkipWithError("decode failed");
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Base64Decode)->Arg(64 << 10);

// ---- SqliteStore writes ------------------------------------------------------------------

// A store in a fresh temp directory, removed again with everything in it.
class TempStore {
 public:
  static std::unique_ptr<TempStore> Open(benchmark::State& state) {
    std::string tmpl = (fs::temp_directory_path() / "sbx-micro-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      state.SkipWithError("mkdtemp failed");
      return nullptr;
    }
    auto t = std::unique_ptr<TempStore>(new TempStore(tmpl));
    auto s = sbx::store::OpenSqliteStore((t->dir_ / "sbx.db").string());
    if (!s.ok()) {
      state.SkipWithError(std::string(s.status().message()).c_str());
      return nullptr;
    }
    t->store_ = std::move(s).value();
    return t;
  }
  ~TempStore() {
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  sbx::store::Store& store() { return *store_; }

 private:
  explicit TempStore(fs::path dir) : dir_(std::move(dir)) {}
  fs::path dir_;
  sbx::store::StorePtr store_;
};

sbx::store::OperationRecord OperationFor(const sbx::store::SandboxRecord& sb) {
  sbx::store::OperationRecord op;
  op.id = *sb.current_operation_id;
  op.tenant_id = sb.tenant_id;
  op.kind = "create";
  op.sandbox_id = sb.id;
  op.state = "pending";
  op.created_at = sb.created_at;
  op.updated_at = sb.created_at;
  return op;
}

// The create path's transaction: sandbox row and its create operation together.
void BM_StoreCreateSandboxWithOperation(benchmark::State& state) {
  auto t = TempStore::Open(state);
  if (!t) return;
  for (auto _ : state) {
    sbx::store::SandboxRecord sb = SampleSandbox();
    sbx::store::OperationRecord op = OperationFor(sb);
    absl::Status st = t->store().Transact([&](sbx::store::Tx& tx) -> absl::Status {
      if (auto s = tx.PutSandbox(sb); !s.ok()) return s;
      return tx.PutOperation(op);
    });
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
  }
}
BENCHMARK(BM_StoreCreateSandboxWithOperation);

// A lifecycle step: read the sandbox, change its state, write it back.
void BM_StoreStateUpdate(benchmark::State& state) {
  auto t = TempStore::Open(state);
  if (!t) return;
  const sbx::store::SandboxRecord sb = SampleSandbox();
  absl::Status st = t->store().Transact([&](sbx::store::Tx& tx) { return tx.PutSandbox(sb); });
  if (!st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  bool running = true;
  for (auto _ : state) {
    running = !running;
    st = t->store().Transact([&](sbx::store::Tx& tx) -> absl::Status {
      auto cur = tx.GetSandbox(sb.id);
      if (!cur.ok()) return cur.status();
      cur->state = running ? "running" : "deleting";
      cur->updated_at = sbx::NowRfc3339();
      return tx.PutSandbox(*cur);
    });
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
  }
}
BENCHMARK(BM_StoreStateUpdate);

void BM_StoreIdempotencyInsert(benchmark::State& state) {
  auto t = TempStore::Open(state);
  if (!t) return;
  const std::string response =
      nlohmann::json{{"sandbox", sbx::service::SandboxView(SampleSandbox())}}.dump();
  for (auto _ : state) {
    sbx::store::IdempotencyRecord rec;
    rec.tenant_id = "default";
    rec.key = sbx::NewId("idem");
    rec.method = "POST";
    rec.route = "/v1/sandboxes";
    rec.body_hash = sbx::Sha256Hex(rec.key);
    rec.status = 202;
    rec.response_body = response;
    rec.created_at = sbx::NowRfc3339();
    absl::Status st = t->store().Transact([&](sbx::store::Tx& tx) { return tx.PutIdempotency(rec); });
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
  }
}
BENCHMARK(BM_StoreIdempotencyInsert);

// A command's session: stored running, then ended, in one transaction per iteration. Arg 0
// ends it as SQLite does (the state, then an UPDATE of the exit's columns); arg 1 as the
// base class's default does (the whole row read, its spec decoded, written back): the
// difference is what the override saves per exit.
void BM_StoreSessionEnd(benchmark::State& state) {
  auto t = TempStore::Open(state);
  if (!t) return;
  const sbx::store::SandboxRecord sb = SampleSandbox();
  absl::Status st = t->store().Transact([&](sbx::store::Tx& tx) { return tx.PutSandbox(sb); });
  if (!st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  const bool whole_row = state.range(0) == 1;
  sbx::store::SessionRecord s;
  s.tenant_id = sb.tenant_id;
  s.sandbox_id = sb.id;
  s.state = "running";
  s.spec = nlohmann::json{{"argv", {"python3", "-c", "print(1)"}},
                          {"cwd", "/root"},
                          {"env", {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"LANG", "C.UTF-8"}}},
                          {"user", "root"},
                          {"tty", false},
                          {"stdin", false},
                          {"timeout_s", 60}};
  s.created_at = sbx::NowRfc3339();
  s.started_at = s.created_at;
  sbx::store::SessionEnd end;
  end.exit_code = 0;
  end.at = s.created_at;
  for (auto _ : state) {
    s.id = sbx::NewId("ses");
    st = t->store().Transact([&](sbx::store::Tx& tx) -> absl::Status {
      if (absl::Status p = tx.PutSession(s); !p.ok()) return p;
      auto was = whole_row ? tx.Tx::EndSession(s.id, end) : tx.EndSession(s.id, end);
      return was.status();
    });
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
  }
}
BENCHMARK(BM_StoreSessionEnd)->ArgName("whole_row")->Arg(0)->Arg(1);

// ---- ids and digests ---------------------------------------------------------------------

// Every request draws a request id and digests its token; a command or a create draws more ids
// and digests its canonical body. Beside each, the OpenSSL call it replaced (`_openssl`): the
// implicit fetch by name in SHA256(), and RAND_bytes. Two threads show the shared locks.
const std::string kDigestInput(200, 'x');  // about a create's canonical body

void BM_Sha256Hex(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sbx::Sha256Hex(kDigestInput));
}
BENCHMARK(BM_Sha256Hex)->Threads(1)->Threads(2);

void BM_Sha256Hex_openssl(benchmark::State& state) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  for (auto _ : state) {
    SHA256(reinterpret_cast<const unsigned char*>(kDigestInput.data()), kDigestInput.size(), md);
    benchmark::DoNotOptimize(md);
  }
}
BENCHMARK(BM_Sha256Hex_openssl)->Threads(1)->Threads(2);

void BM_NewId(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sbx::NewId("ses"));
}
BENCHMARK(BM_NewId)->Threads(1)->Threads(2);

void BM_NewId_openssl(benchmark::State& state) {
  unsigned char raw[20];
  for (auto _ : state) {
    if (RAND_bytes(raw, sizeof(raw)) != 1) state.SkipWithError("RAND_bytes failed");
    benchmark::DoNotOptimize(raw);
  }
}
BENCHMARK(BM_NewId_openssl)->Threads(1)->Threads(2);

// ---- metrics -----------------------------------------------------------------------------

// What the attach loop pays per batch and the store per statement: a child looked up once,
// then relaxed atomics. Two threads on one child show the cost of a shared cache line.
sbx::metrics::Registry& BenchRegistry() {
  static auto* registry = new sbx::metrics::Registry;
  return *registry;
}

void BM_MetricsCounterInc(benchmark::State& state) {
  static sbx::metrics::Counter& c =
      BenchRegistry().AddCounter("bench_bytes_total", "b", {"stream"}).WithLabels({"stdout"});
  for (auto _ : state) c.Inc(4096);
}
BENCHMARK(BM_MetricsCounterInc)->Threads(1)->Threads(2);

void BM_MetricsHistogramObserve(benchmark::State& state) {
  // The create-to-running buckets (24), the largest sbxd uses.
  static sbx::metrics::Histogram& h =
      BenchRegistry()
          .AddHistogram("bench_seconds", "b", {},
                        {0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075,
                         0.01,   0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                         0.075,  0.1,   0.25,   0.5,  1,     2.5,  5,    10})
          .WithLabels();
  double v = 0.0001;
  for (auto _ : state) {
    h.Observe(v);
    v = v < 20 ? v * 1.37 : 0.0001;
  }
}
BENCHMARK(BM_MetricsHistogramObserve)->Threads(1)->Threads(2);

// One scrape of what sbxd registers (service, store and process metrics; no callbacks that
// need a live service).
void BM_MetricsScrape(benchmark::State& state) {
  sbx::metrics::Registry registry;
  sbx::service::ServiceMetrics service(registry, {"ns"}, "ns");
  auto process = sbx::metrics::RegisterProcessMetrics(registry);
  auto& store = registry.AddHistogram("sbx_store_query_duration_seconds", "s", {"op"},
                                      {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                       0.01, 0.025, 0.05, 0.1, 0.25, 1, 5});
  for (int i = 0; i < 17; ++i) store.WithLabels({"Op" + std::to_string(i)}).Observe(0.0002);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = registry.Expose();
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_MetricsScrape);

}  // namespace

BENCHMARK_MAIN();

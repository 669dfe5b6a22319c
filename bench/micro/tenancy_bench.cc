// Micro-benchmarks of what every management API request will pay for issue 18 (tenancy):
// checking its token (ParseToken + TokenMatches; the store lookup between them is not
// included) and taking from its rate-limit bucket. The target is <= 20 us p50 for the check.
//
// Part of sbx-micro-bench, and built alone as sbx-tenancy-bench, which links only
// sbx_tenancy and sbx_common and so builds in seconds:
//   build/bin/sbx-tenancy-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <chrono>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "service/mgmt_token.h"
#include "service/rate_limit.h"

namespace {

using sbx::service::MintToken;
using sbx::service::ParseToken;
using sbx::service::RateLimiter;
using sbx::service::TokenMatches;

void BM_TokenCheck(benchmark::State& state) {
  const sbx::service::MintedToken m = MintToken();
  for (auto _ : state) {
    auto parsed = ParseToken(m.token);
    if (!parsed.ok() || !TokenMatches(parsed->token, m.hash)) {
      state.SkipWithError("a minted token did not check");
      break;
    }
    benchmark::DoNotOptimize(parsed->id.data());
  }
}
BENCHMARK(BM_TokenCheck);

// A well-formed token whose secret is wrong: must cost the same as a match (nothing to learn
// from the time), which the two numbers side by side show.
void BM_TokenCheckMismatch(benchmark::State& state) {
  const sbx::service::MintedToken m = MintToken();
  const std::string other_hash = MintToken().hash;
  for (auto _ : state) {
    auto parsed = ParseToken(m.token);
    if (!parsed.ok() || TokenMatches(parsed->token, other_hash)) {
      state.SkipWithError("a wrong token matched");
      break;
    }
    benchmark::DoNotOptimize(parsed->id.data());
  }
}
BENCHMARK(BM_TokenCheckMismatch);

// One hot key, reading the clock as the API will; a rate high enough never to deny, so every
// iteration takes the same path. Threads(2) shows the mutex contended on this 2-vCPU machine.
void BM_RateLimiterTake(benchmark::State& state) {
  static RateLimiter* limiter = nullptr;
  if (state.thread_index() == 0) limiter = new RateLimiter();
  const std::string key = "tok_abcdefghijklmnopqrst";
  for (auto _ : state) {
    auto d = limiter->Take(key, 1e12, 1000, std::chrono::steady_clock::now());
    benchmark::DoNotOptimize(d.remaining);
  }
  if (state.thread_index() == 0) {
    delete limiter;
    limiter = nullptr;
  }
}
BENCHMARK(BM_RateLimiterTake)->Threads(1)->Threads(2);

// The limiter at its default bound of 100,000 keys, cycling through 150,000: every Take is of a
// key evicted since its turn before, so it misses, evicts and allocates under the lock (the
// bound's worst case).
void BM_RateLimiterTakeManyKeys(benchmark::State& state) {
  RateLimiter limiter;
  std::vector<std::string> keys;
  for (int i = 0; i < 150000; ++i) keys.push_back("tok_" + std::to_string(1000000000 + i));
  size_t i = 0;
  for (auto _ : state) {
    auto d = limiter.Take(keys[i], 10, 100, std::chrono::steady_clock::now());
    benchmark::DoNotOptimize(d.remaining);
    if (++i == keys.size()) i = 0;
  }
  state.counters["keys"] = static_cast<double>(limiter.size());
}
BENCHMARK(BM_RateLimiterTakeManyKeys);

}  // namespace

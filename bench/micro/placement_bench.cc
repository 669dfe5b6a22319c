// Micro-benchmark of placement (service/placement.h, the scale-out issue): one Place over 100
// and 1000 simulated nodes, as an api replica runs it on every create. The target is <= 1 ms
// p50 with 100 nodes.
//
// Part of sbx-micro-bench, and built alone as sbx-placement-bench (links sbx_service only):
//   build/bin/sbx-placement-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "service/placement.h"

namespace {

using sbx::service::PlacementNode;
using sbx::service::PlacementRequest;

// Random but fixed (seed 42): most nodes active with room, some draining, lost, stale or full;
// a few templates spread over them, some with warm members.
std::vector<PlacementNode> SimulatedNodes(int count) {
  std::mt19937_64 rng(42);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const std::vector<std::string> templates = {"python:3.12", "node:20",   "go:1.22",
                                              "ruby:3.3",    "rust:1.79", "sha256:0f3a9c"};
  std::vector<PlacementNode> nodes;
  nodes.reserve(count);
  for (int i = 0; i < count; ++i) {
    PlacementNode n;
    n.name = "node-" + std::to_string(i);
    const int64_t roll = pick(0, 99);
    n.state = roll < 5 ? "draining" : roll < 8 ? "lost" : "active";
    n.fresh = pick(0, 99) >= 3;
    n.capacity.vcpu = pick(0, 3) == 0 ? 0 : pick(8, 128);
    n.capacity.memory_mib = pick(16, 512) * 1024;
    n.capacity.disk_mib = pick(100, 2000) * 1024;
    n.capacity.max_sandboxes = pick(0, 4) == 0 ? 0 : pick(10, 200);
    n.capacity.runtimes = pick(0, 2) == 0 ? std::vector<std::string>{"ns", "microvm"}
                                          : std::vector<std::string>{"ns"};
    n.capacity.templates = {"base"};
    for (const std::string& t : templates) {
      if (pick(0, 2) == 0) n.capacity.templates.push_back(t);
      if (pick(0, 5) == 0) n.capacity.warm[t] = pick(0, 4);
    }
    const int64_t sandboxes = n.capacity.max_sandboxes > 0 ? pick(0, n.capacity.max_sandboxes)
                                                           : pick(0, 100);
    n.load.sandboxes = sandboxes;
    n.load.vcpu = n.capacity.vcpu > 0 ? pick(0, n.capacity.vcpu) : sandboxes;
    n.load.memory_mib = pick(0, n.capacity.memory_mib);
    n.load.disk_mib = pick(0, n.capacity.disk_mib);
    n.same_group = pick(0, 3);
    nodes.push_back(std::move(n));
  }
  return nodes;
}

PlacementRequest Request(bool anti_affinity) {
  PlacementRequest r;
  r.runtime = "ns";
  r.template_ref = "python:3.12";
  r.vcpu = 2;
  r.memory_mib = 2048;
  r.disk_mib = 4096;
  r.anti_affinity = anti_affinity;
  return r;
}

void BM_Place(benchmark::State& state) {
  const std::vector<PlacementNode> nodes = SimulatedNodes(static_cast<int>(state.range(0)));
  const PlacementRequest req = Request(state.range(1) != 0);
  for (auto _ : state) {
    auto d = sbx::service::Place(nodes, req);
    if (!d.ok()) {
      state.SkipWithError("no node could take the sandbox");
      break;
    }
    benchmark::DoNotOptimize(d->node.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));  // nodes considered per second
}
BENCHMARK(BM_Place)
    ->ArgNames({"nodes", "anti_affinity"})
    ->Args({100, 0})
    ->Args({100, 1})
    ->Args({1000, 0})
    ->Args({1000, 1});

// Nothing fits (every node filtered): the error path, which formats the per-reason counts.
void BM_PlaceNoCapacity(benchmark::State& state) {
  const std::vector<PlacementNode> nodes = SimulatedNodes(static_cast<int>(state.range(0)));
  PlacementRequest req = Request(false);
  req.memory_mib = int64_t{1} << 40;  // more than any simulated node offers
  for (auto _ : state) {
    auto d = sbx::service::Place(nodes, req);
    benchmark::DoNotOptimize(d.status().message().data());
  }
}
BENCHMARK(BM_PlaceNoCapacity)->ArgName("nodes")->Arg(100)->Arg(1000);

}  // namespace

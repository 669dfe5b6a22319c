#include "service/admission.h"

#include <atomic>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx::service {
namespace {

AdmissionSettings Settings(int64_t cpu_pct, int64_t mem_pct, int64_t disk_pct, int64_t rmem,
                           int64_t rdisk) {
  AdmissionSettings s;
  s.cpu_overcommit_percent = cpu_pct;
  s.memory_overcommit_percent = mem_pct;
  s.disk_overcommit_percent = disk_pct;
  s.reserve_memory_mib = rmem;
  s.reserve_disk_mib = rdisk;
  return s;
}

TEST(AdmissionArithmetic, CapacityIsHostTimesRatioMinusReserve) {
  const HostCapacity host{2, 24000, 60000};
  EXPECT_EQ(CapacityOf(host, Settings(1600, 100, 100, 1024, 2048)), (Demand{32, 22976, 57952}));
  EXPECT_EQ(CapacityOf(host, Settings(100, 150, 250, 0, 0)), (Demand{2, 36000, 150000}));
  // The ratio applies to the host, the reserve after it.
  EXPECT_EQ(CapacityOf(host, Settings(50, 50, 50, 1000, 1000)), (Demand{1, 11000, 29000}));
  // A reserve larger than the host leaves nothing, never a negative capacity.
  EXPECT_EQ(CapacityOf(host, Settings(100, 100, 100, 30000, 70000)), (Demand{2, 0, 0}));
}

TEST(AdmissionArithmetic, TheFindingsRequestCanNeverFitOnA24GiBTwoCoreHost) {
  const HostCapacity host{2, 24 * 1024, 66 * 1024};
  const AdmissionSettings s;  // the defaults
  absl::Status st = CheckFits(Demand{64, 65536, 1048576}, Demand{}, CapacityOf(host, s), host, s,
                              "the sandbox");
  EXPECT_EQ(ApiErrorCode(st), "exceeds_capacity") << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  // Every resource that cannot fit is named; details carry the first, memory.
  for (const char* r : {"memory:", "vcpu:", "disk:"}) {
    EXPECT_NE(std::string(st.message()).find(r), std::string::npos) << st;
  }
  EXPECT_EQ(ApiErrorDetail(st, "resource"), "memory");
  EXPECT_EQ(ApiErrorField(st), "resources.memory_mib");
  EXPECT_EQ(ApiErrorDetail(st, "requested"), "65536");
  EXPECT_EQ(ApiErrorDetail(st, "capacity"), fmt::format("{}", 24 * 1024 - 1024));
}

TEST(AdmissionArithmetic, BusyIs503ButNeverFitsWins) {
  const HostCapacity host{4, 4096, 100000};
  const AdmissionSettings s = Settings(100, 100, 100, 1024, 0);
  const Demand cap = CapacityOf(host, s);  // 4 vcpu, 3072 MiB
  EXPECT_TRUE(CheckFits(Demand{1, 1024, 100}, Demand{2, 2048, 0}, cap, host, s, "x").ok());
  absl::Status busy = CheckFits(Demand{1, 1025, 100}, Demand{2, 2048, 0}, cap, host, s, "x");
  EXPECT_EQ(ApiErrorCode(busy), "insufficient_capacity") << busy;
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ApiErrorDetail(busy, "resource"), "memory");
  EXPECT_EQ(ApiErrorDetail(busy, "available"), "1024");
  EXPECT_NE(std::string(busy.message()).find("1024 MiB of 3072 MiB are free"), std::string::npos)
      << busy;
  // vcpu busy, memory never: the 422 is the answer (a retry cannot help).
  absl::Status never = CheckFits(Demand{3, 4000, 1}, Demand{2, 0, 0}, cap, host, s, "x");
  EXPECT_EQ(ApiErrorCode(never), "exceeds_capacity") << never;
  EXPECT_EQ(ApiErrorDetail(never, "resource"), "memory");
  // Only vcpu busy: named as vcpu.
  absl::Status cpu = CheckFits(Demand{3, 1, 1}, Demand{2, 0, 0}, cap, host, s, "x");
  EXPECT_EQ(ApiErrorDetail(cpu, "resource"), "vcpu") << cpu;
  EXPECT_EQ(ApiErrorField(cpu), "resources.vcpu");
  // Exactly full is allowed.
  EXPECT_TRUE(CheckFits(Demand{2, 1024, 0}, Demand{2, 2048, 0}, cap, host, s, "x").ok());
}

TEST(AdmissionLedger, HoldsReleasesAndGivesBack) {
  Admission a(Settings(100, 100, 100, 0, 0),
              [] { return absl::StatusOr<HostCapacity>(HostCapacity{4, 2048, 4096}); });
  EXPECT_TRUE(a.Admit("a", Demand{1, 1024, 1024}, "x").ok());
  EXPECT_TRUE(a.Admit("b", Demand{1, 1024, 1024}, "x").ok());
  absl::Status full = a.Admit("c", Demand{1, 1, 1}, "x");
  EXPECT_EQ(ApiErrorCode(full), "insufficient_capacity") << full;
  EXPECT_FALSE(a.Holds("c"));
  EXPECT_TRUE(a.Release("a"));
  EXPECT_FALSE(a.Release("a"));
  EXPECT_TRUE(a.Admit("c", Demand{1, 1024, 1}, "x").ok());
  // Re-admitting a held id replaces its demand instead of counting it twice.
  EXPECT_TRUE(a.Admit("c", Demand{1, 1024, 1}, "x").ok());
  Admission::Snapshot snap = a.Read();
  EXPECT_TRUE(snap.probed);
  EXPECT_EQ(snap.reserved, (Demand{2, 2048, 1025}));
  EXPECT_EQ(snap.capacity, (Demand{4, 2048, 4096}));
  EXPECT_EQ(snap.holders, 2);
}

TEST(AdmissionLedger, DisabledOrWithoutProbeAdmitsEverythingButStillCounts) {
  AdmissionSettings off = Settings(100, 100, 100, 0, 0);
  off.enabled = false;
  int probes = 0;
  Admission a(off, [&] {
    ++probes;
    return absl::StatusOr<HostCapacity>(HostCapacity{1, 1, 1});
  });
  EXPECT_TRUE(a.Admit("big", Demand{64, 65536, 1 << 20}, "x").ok());
  EXPECT_EQ(probes, 0);
  EXPECT_EQ(a.Read().reserved.memory_mib, 65536);
  // Turned on by a reload: the next one is checked against what is held.
  a.SetSettings(Settings(100, 100, 100, 0, 0));
  EXPECT_FALSE(a.Admit("small", Demand{1, 1, 1}, "x").ok());

  Admission none(Settings(100, 100, 100, 0, 0), nullptr);
  EXPECT_TRUE(none.Admit("big", Demand{64, 65536, 1 << 20}, "x").ok());
}

TEST(AdmissionLedger, MaxSandboxesCountsEvenWhenDisabled) {
  AdmissionSettings s = Settings(100, 100, 100, 0, 0);
  s.enabled = false;
  s.max_sandboxes = 2;
  Admission a(s, nullptr);
  EXPECT_TRUE(a.Admit("a", Demand{1, 1, 1}, "x").ok());
  EXPECT_TRUE(a.Admit("b", Demand{1, 1, 1}, "x").ok());
  absl::Status st = a.Admit("c", Demand{1, 1, 1}, "the sandbox");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(ApiErrorCode(st), "insufficient_capacity");
  EXPECT_EQ(ApiErrorDetail(st, "resource"), "sandboxes");
  EXPECT_EQ(ApiErrorDetail(st, "capacity"), "2");
  EXPECT_NE(std::string(st.message()).find("admission.max_sandboxes"), std::string::npos) << st;
  EXPECT_FALSE(a.Holds("c"));
  // One already held is replaced, not counted twice.
  EXPECT_TRUE(a.Admit("b", Demand{2, 2, 2}, "x").ok());
  // A delete makes room; 0 is no cap.
  a.Release("a");
  EXPECT_TRUE(a.Admit("c", Demand{1, 1, 1}, "x").ok());
  s.max_sandboxes = 0;
  a.SetSettings(s);
  EXPECT_TRUE(a.Admit("d", Demand{1, 1, 1}, "x").ok());
  // Start-up adoption holds whatever the store says, over the cap.
  s.max_sandboxes = 1;
  a.SetSettings(s);
  a.Hold("e", Demand{1, 1, 1});
  EXPECT_EQ(a.Read().holders, 4);
}

TEST(AdmissionLedger, AProbeFailureRefusesWith503) {
  Admission a(AdmissionSettings{}, [] {
    return absl::StatusOr<HostCapacity>(absl::InternalError("statvfs(/x): boom"));
  });
  absl::Status st = a.Admit("a", Demand{1, 1, 1}, "x");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(std::string(st.message()).find("boom"), std::string::npos);
  EXPECT_FALSE(a.Holds("a"));
}

TEST(AdmissionLedger, ConcurrentAdmitsNeverOvershoot) {
  // Room for exactly 10 of 40 concurrent requests.
  Admission a(Settings(100, 100, 100, 0, 0),
              [] { return absl::StatusOr<HostCapacity>(HostCapacity{1000, 10 * 256, 1 << 20}); });
  std::atomic<int> admitted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 40; ++t) {
    threads.emplace_back([&, t] {
      absl::Status st = a.Admit(fmt::format("sbx_{}", t), Demand{1, 256, 1}, "x");
      (st.ok() ? admitted : refused).fetch_add(1);
      if (!st.ok()) {
        EXPECT_EQ(ApiErrorCode(st), "insufficient_capacity") << st;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(admitted.load(), 10);
  EXPECT_EQ(refused.load(), 30);
  EXPECT_EQ(a.Read().reserved.memory_mib, 10 * 256);
}

}  // namespace
}  // namespace sbx::service

// The parsers the scenarios depend on: stdout event scanning and /proc formats.
#include <gtest/gtest.h>

#include "load/api.h"
#include "load/sysinfo.h"

namespace sbx::load {
namespace {

TEST(ScanChunkEventTest, ReadsBothFieldsInEitherOrder) {
  auto a = ScanChunkEvent(R"({"data_b64":"aGkK","offset":0})");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->data_b64, "aGkK");
  EXPECT_EQ(a->offset, 0u);
  auto b = ScanChunkEvent(R"({"offset": 1073741824, "data_b64": "AAAA"})");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->data_b64, "AAAA");
  EXPECT_EQ(b->offset, 1073741824u);
}

TEST(ScanChunkEventTest, RejectsOtherShapes) {
  EXPECT_FALSE(ScanChunkEvent(R"({"data_b64":"aGkK"})").has_value());
  EXPECT_FALSE(ScanChunkEvent(R"({"offset":3})").has_value());
  EXPECT_FALSE(ScanChunkEvent(R"({"data_b64":null,"offset":3})").has_value());
  EXPECT_FALSE(ScanChunkEvent(R"({"data_b64":"aGkK","offset":-1})").has_value());
  EXPECT_FALSE(ScanChunkEvent(R"({"data_b64":"aGkK)").has_value());
}

TEST(ProcParsersTest, KbFields) {
  const char* meminfo = "MemTotal:        4000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
  EXPECT_EQ(*ParseKbField(meminfo, "MemAvailable"), 2048u * 1024);
  EXPECT_EQ(*ParseKbField(meminfo, "MemFree"), 100u * 1024);
  EXPECT_FALSE(ParseKbField(meminfo, "Mem").ok());  // a prefix is not the field
  EXPECT_FALSE(ParseKbField("VmPeak: 1 kB\n", "VmRSS").ok());
}

TEST(ProcParsersTest, MemoryCgroupLinePrefersV1Memory) {
  const char* hybrid =
      "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n";
  auto l = ParseMemoryCgroupLine(hybrid);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->path, "/process_api/abc");
  EXPECT_FALSE(l->v2);
  auto v2 = ParseMemoryCgroupLine("0::/system.slice/sbxd.service\n");
  ASSERT_TRUE(v2.ok());
  EXPECT_TRUE(v2->v2);
  EXPECT_EQ(v2->path, "/system.slice/sbxd.service");
  EXPECT_FALSE(ParseMemoryCgroupLine("").ok());
}

TEST(ProcParsersTest, FindsTheV1MemoryMount) {
  const char* mountinfo =
      "30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n"
      "33 30 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n"
      "35 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "40 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  CgroupMount m = FindV1MemoryMount(mountinfo);
  EXPECT_EQ(m.mount_point, "/sys/fs/cgroup/memory");
  EXPECT_EQ(m.root, "/");
  EXPECT_TRUE(FindV1MemoryMount("40 30 0:36 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
                  .mount_point.empty());
}

TEST(PerfStatTest, ReadsTaskClockAndSyscalls) {
  // What `perf stat -x, -o FILE` writes (perf 6.1).
  const char* out =
      "# started on Wed Dec  2 10:05:10 2026\n\n"
      "79.22,msec,task-clock,79224135,100.00,0.024,CPUs utilized\n"
      "4288,,raw_syscalls:sys_enter,79224135,100.00,54.125,K/sec\n";
  auto c = ParsePerfStatCsv(out);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->task_clock_ms, 79.22);
  EXPECT_EQ(c->syscalls, 4288u);
}

TEST(PerfStatTest, RefusesCountersThatDidNotRun) {
  EXPECT_FALSE(ParsePerfStatCsv("<not counted>,msec,task-clock,0,0.00,,\n"
                                "12,,raw_syscalls:sys_enter,1,100.00,,\n")
                   .ok());
  EXPECT_FALSE(ParsePerfStatCsv("<not supported>,,raw_syscalls:sys_enter,0,0.00,,\n"
                                "1.0,msec,task-clock,1,100.00,,\n")
                   .ok());
  EXPECT_FALSE(ParsePerfStatCsv("1.0,msec,task-clock,1,100.00,,\n").ok());  // no syscalls line
  EXPECT_FALSE(ParsePerfStatCsv("1.0,usec,task-clock,1,100.00,,\n"
                                "2,,raw_syscalls:sys_enter,1,100.00,,\n")
                   .ok());  // a unit we do not know
}

TEST(ProcParsersTest, BusyTicksOfProcStat) {
  // user nice system idle iowait irq softirq steal guest guest_nice: idle and iowait are out.
  const char* stat =
      "cpu  100 2 30 5000 70 4 5 6 0 0\n"
      "cpu0 50 1 15 2500 35 2 2 3 0 0\n"
      "intr 12345\n";
  auto v = ParseProcStatBusyTicks(stat);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 100u + 2 + 30 + 4 + 5 + 6);
  EXPECT_FALSE(ParseProcStatBusyTicks("cpu0 1 2 3 4 5 6 7 8\n").ok());
  EXPECT_FALSE(ParseProcStatBusyTicks("cpu  1 2 3\n").ok());
}

}  // namespace
}  // namespace sbx::load

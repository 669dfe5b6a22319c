#include "service/placement.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/status_util.h"

namespace sbx::service {
namespace {

// An active, fresh node with room for everything and the ns runtime.
PlacementNode Node(std::string name) {
  PlacementNode n;
  n.name = std::move(name);
  n.state = "active";
  n.capacity.vcpu = 16;
  n.capacity.memory_mib = 32768;
  n.capacity.disk_mib = 100000;
  n.capacity.max_sandboxes = 10;
  n.capacity.runtimes = {"ns"};
  return n;
}

PlacementRequest Req(std::string tmpl = "base") {
  PlacementRequest r;
  r.runtime = "ns";
  r.template_ref = std::move(tmpl);
  r.vcpu = 1;
  r.memory_mib = 512;
  r.disk_mib = 1024;
  return r;
}

std::string Chosen(const std::vector<PlacementNode>& nodes, const PlacementRequest& req) {
  auto d = Place(nodes, req);
  if (!d.ok()) return "error: " + std::string(d.status().message());
  return d->node;
}

TEST(PlacementTest, OneNodeTakesIt) {
  auto d = Place({Node("a")}, Req());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->node, "a");
  EXPECT_FALSE(d->why.empty());
  EXPECT_EQ(d->why.find('\n'), std::string::npos);
}

TEST(PlacementTest, ZeroNodes) {
  auto d = Place({}, Req());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ApiErrorCode(d.status()), "no_capacity");
  EXPECT_NE(d.status().message().find("no node is registered"), std::string::npos)
      << d.status().message();
}

TEST(PlacementTest, LostAndStaleAndDrainingAreFiltered) {
  PlacementNode lost = Node("a-lost");
  lost.state = "lost";
  PlacementNode stale = Node("b-stale");
  stale.fresh = false;
  PlacementNode draining = Node("c-draining");
  draining.state = "draining";
  PlacementNode ok = Node("z-ok");
  ok.load.sandboxes = 9;  // the fullest, but the only one that may take it
  EXPECT_EQ(Chosen({lost, stale, draining, ok}, Req()), "z-ok");
  EXPECT_FALSE(Place({lost, stale, draining}, Req()).ok());
}

TEST(PlacementTest, RuntimeFilter) {
  PlacementNode ns = Node("a");
  PlacementNode vm = Node("b");
  vm.capacity.runtimes = {"ns", "microvm"};
  PlacementRequest r = Req();
  r.runtime = "microvm";
  EXPECT_EQ(Chosen({ns, vm}, r), "b");
  EXPECT_FALSE(Place({ns}, r).ok());
  // No runtime asked for: any node.
  r.runtime = "";
  EXPECT_EQ(Chosen({ns}, r), "a");
}

TEST(PlacementTest, SandboxLimitFilter) {
  PlacementNode full = Node("a");
  full.load.sandboxes = 10;
  PlacementNode room = Node("b");
  room.load.sandboxes = 9;
  EXPECT_EQ(Chosen({full, room}, Req()), "b");
  EXPECT_FALSE(Place({full}, Req()).ok());
}

TEST(PlacementTest, ResourceFiltersAreLoadPlusRequestWithinCapacity) {
  PlacementNode n = Node("a");
  PlacementRequest r = Req();
  n.load.vcpu = 15;  // 15 + 1 == 16 fits exactly
  EXPECT_EQ(Chosen({n}, r), "a");
  n.load.vcpu = 16;
  EXPECT_FALSE(Place({n}, r).ok());

  n = Node("a");
  n.load.memory_mib = 32768 - 511;
  EXPECT_FALSE(Place({n}, r).ok());
  n.load.memory_mib = 32768 - 512;
  EXPECT_TRUE(Place({n}, r).ok());

  n = Node("a");
  n.load.disk_mib = 100000 - 1023;
  EXPECT_FALSE(Place({n}, r).ok());
  n.load.disk_mib = 100000 - 1024;
  EXPECT_TRUE(Place({n}, r).ok());
}

TEST(PlacementTest, ZeroCapacityIsNoLimit) {
  PlacementNode n = Node("a");
  n.capacity.vcpu = 0;
  n.capacity.memory_mib = 0;
  n.capacity.disk_mib = 0;
  n.capacity.max_sandboxes = 0;
  n.load = {1000000, 1000000, 1000000, 1000000};
  PlacementRequest r = Req();
  r.vcpu = 64;
  r.memory_mib = 1 << 20;
  r.disk_mib = 1 << 20;
  auto d = Place({n}, r);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->node, "a");
  // An unlimited node is emptier than any limited one.
  PlacementNode limited = Node("0-limited");
  EXPECT_EQ(Chosen({limited, n}, Req()), "a");
}

TEST(PlacementTest, NoCapacityMessageCountsEachNodeOnceUnderItsFirstFailure) {
  PlacementNode lost = Node("lost");
  lost.state = "lost";
  lost.capacity.runtimes = {};  // fails later filters too: counted as lost only
  PlacementNode stale = Node("stale");
  stale.fresh = false;
  stale.state = "draining";
  PlacementNode draining = Node("draining");
  draining.state = "draining";
  PlacementNode noruntime1 = Node("nort1");
  noruntime1.capacity.runtimes = {"ns"};
  PlacementNode noruntime2 = Node("nort2");
  noruntime2.capacity.runtimes = {};
  noruntime2.load.sandboxes = 10;  // also full: counted as without runtime
  PlacementNode full = Node("full");
  full.capacity.runtimes = {"microvm"};
  full.load.sandboxes = 10;
  PlacementNode cpu = Node("cpu");
  cpu.capacity.runtimes = {"microvm"};
  cpu.load.vcpu = 16;
  cpu.load.memory_mib = 32768;  // also out of memory: counted as without vCPUs
  PlacementNode mem = Node("mem");
  mem.capacity.runtimes = {"microvm"};
  mem.load.memory_mib = 32768;
  PlacementNode disk = Node("disk");
  disk.capacity.runtimes = {"microvm"};
  disk.load.disk_mib = 100000;
  PlacementRequest r = Req();
  r.runtime = "microvm";
  auto d = Place({lost, stale, draining, noruntime1, noruntime2, full, cpu, mem, disk}, r);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ApiErrorCode(d.status()), "no_capacity");
  EXPECT_EQ(std::string(d.status().message()),
            "no node can take this sandbox: 9 nodes registered; 2 lost or not heartbeating, "
            "1 draining, 2 without runtime microvm, 1 at their sandbox limit, 1 without the vCPUs, "
            "1 without the memory, 1 without the disk")
      << d.status().message();
}

TEST(PlacementTest, NoCapacityMessageExampleOfTheIssue) {
  PlacementNode lost = Node("a");
  lost.fresh = false;
  PlacementNode draining = Node("b");
  draining.state = "draining";
  PlacementNode ns = Node("c");
  PlacementRequest r = Req();
  r.runtime = "microvm";
  auto d = Place({lost, draining, ns}, r);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(std::string(d.status().message()),
            "no node can take this sandbox: 3 nodes registered; 1 lost or not heartbeating, "
            "1 draining, 1 without runtime microvm");
  d = Place({draining}, r);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(std::string(d.status().message()), "no node can take this sandbox: 1 node registered; 1 draining");
}

TEST(PlacementTest, AntiAffinityComesFirst) {
  PlacementNode crowded = Node("a");
  crowded.same_group = 2;
  crowded.capacity.warm = {{"python:3.12", 3}};
  crowded.capacity.templates = {"python:3.12"};
  PlacementNode spread = Node("b");
  spread.same_group = 1;
  spread.load.sandboxes = 8;
  PlacementNode busier = Node("c");
  busier.same_group = 1;
  busier.load.sandboxes = 9;
  PlacementRequest r = Req("python:3.12");
  r.anti_affinity = true;
  auto d = Place({crowded, spread, busier}, r);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->node, "b");
  EXPECT_NE(d->why.find("1 of its group"), std::string::npos) << d->why;
  // Without anti-affinity the group count does not matter: the warm node wins.
  r.anti_affinity = false;
  EXPECT_EQ(Chosen({crowded, spread, busier}, r), "a");
}

TEST(PlacementTest, WarmPoolBeatsCachedTemplateAndFreeRoom) {
  PlacementNode warm = Node("b-warm");
  warm.capacity.warm = {{"python:3.12", 1}};
  warm.load.sandboxes = 9;
  PlacementNode cached = Node("a-cached");
  cached.capacity.templates = {"python:3.12"};
  auto d = Place({cached, warm}, Req("python:3.12"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->node, "b-warm");
  EXPECT_NE(d->why.find("warm pool hit"), std::string::npos) << d->why;
  // A warm entry at zero is no hit; nor is a warm member of another template.
  warm.capacity.warm = {{"python:3.12", 0}, {"node:20", 4}};
  EXPECT_EQ(Chosen({cached, warm}, Req("python:3.12")), "a-cached");
}

TEST(PlacementTest, CachedTemplateBeatsFreeRoom) {
  PlacementNode cached = Node("b-cached");
  cached.capacity.templates = {"base", "python:3.12", "sha256:abc"};
  cached.load.sandboxes = 9;
  PlacementNode empty = Node("a-empty");
  auto d = Place({empty, cached}, Req("python:3.12"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->node, "b-cached");
  EXPECT_NE(d->why.find("template cached"), std::string::npos) << d->why;
  // A pinned digest is held when its digest is; a bare digest as well.
  EXPECT_EQ(Chosen({empty, cached}, Req("python@sha256:abc")), "b-cached");
  EXPECT_EQ(Chosen({empty, cached}, Req("sha256:abc")), "b-cached");
  EXPECT_EQ(Chosen({empty, cached}, Req("python@sha256:def")), "a-empty");
}

TEST(PlacementTest, BaseIsHeldEverywhere) {
  PlacementNode a = Node("a");
  a.load.sandboxes = 5;
  PlacementNode b = Node("b");
  b.capacity.templates = {"base"};
  b.load.sandboxes = 6;
  // Both hold base (a without saying so): the emptier one wins.
  EXPECT_EQ(Chosen({a, b}, Req("base")), "a");
}

TEST(PlacementTest, LeastFullByTheFullestDimension) {
  PlacementNode a = Node("a");
  a.load.sandboxes = 1;
  a.load.vcpu = 12;  // (12+1)/16: 81% by vCPU
  PlacementNode b = Node("b");
  b.load.sandboxes = 5;  // (5+1)/10: 60% by count
  PlacementNode c = Node("c");
  c.load.memory_mib = 24576;  // (24576+512)/32768: 77% by memory
  EXPECT_EQ(Chosen({a, b, c}, Req()), "b");
  c.load.memory_mib = 0;
  c.load.disk_mib = 90000;  // (90000+1024)/100000: 91% by disk
  b.load.sandboxes = 8;     // 90%
  EXPECT_EQ(Chosen({a, b, c}, Req()), "a");
}

TEST(PlacementTest, FreeRoomIsRelativeToCapacity) {
  PlacementNode big = Node("b-big");
  big.capacity.max_sandboxes = 100;
  big.load.sandboxes = 20;  // 21%
  PlacementNode small = Node("a-small");
  small.capacity.max_sandboxes = 4;
  small.load.sandboxes = 0;  // 25%
  EXPECT_EQ(Chosen({small, big}, Req()), "b-big");
}

TEST(PlacementTest, UnlimitedNodesAreSpreadByTheirSandboxCount) {
  // No limit anywhere: every fill is 0, and a burst must not all go to the first name.
  std::vector<PlacementNode> nodes = {Node("a"), Node("b"), Node("c")};
  for (PlacementNode& n : nodes) {
    n.capacity.vcpu = n.capacity.memory_mib = n.capacity.disk_mib = 0;
    n.capacity.max_sandboxes = 0;
  }
  nodes[0].load.sandboxes = 2;
  nodes[1].load.sandboxes = 1;
  nodes[2].load.sandboxes = 1;
  EXPECT_EQ(Chosen(nodes, Req()), "b");
  nodes[1].load.sandboxes = 2;
  EXPECT_EQ(Chosen(nodes, Req()), "c");
  // Fill still comes first where there is one.
  nodes[2].load.sandboxes = 9;
  nodes[2].capacity.max_sandboxes = 10;
  EXPECT_EQ(Chosen(nodes, Req()), "a");
}

TEST(PlacementTest, TiesAreBrokenByNameWhateverTheOrder) {
  std::vector<PlacementNode> nodes = {Node("c"), Node("a"), Node("b")};
  EXPECT_EQ(Chosen(nodes, Req()), "a");
  std::vector<PlacementNode> reversed(nodes.rbegin(), nodes.rend());
  EXPECT_EQ(Chosen(reversed, Req()), "a");
  // A tie on every preference with anti-affinity, warm and cached as well.
  for (PlacementNode& n : nodes) {
    n.same_group = 1;
    n.capacity.warm = {{"python:3.12", 2}};
    n.capacity.templates = {"python:3.12"};
  }
  PlacementRequest r = Req("python:3.12");
  r.anti_affinity = true;
  EXPECT_EQ(Chosen(nodes, r), "a");
}

TEST(PlacementTest, WhyNamesTheLoad) {
  PlacementNode n = Node("a");
  n.load.sandboxes = 3;
  n.capacity.templates = {"python:3.12"};
  n.capacity.warm = {{"python:3.12", 1}};
  auto d = Place({n}, Req("python:3.12"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->why, "warm pool hit, template cached, 3/10 sandboxes, 40% full");
  n.capacity.max_sandboxes = 0;
  n.capacity.vcpu = n.capacity.memory_mib = n.capacity.disk_mib = 0;
  d = Place({n}, Req("node:20"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->why, "template not cached, 3 sandboxes, 0% full");
}

TEST(PlacementJsonTest, RoundTrip) {
  NodeCapacity c;
  c.vcpu = 8;
  c.memory_mib = 16384;
  c.disk_mib = 50000;
  c.max_sandboxes = 40;
  c.runtimes = {"ns", "microvm"};
  c.templates = {"base", "python:3.12", "sha256:0123"};
  c.warm = {{"base", 2}, {"python:3.12", 0}};
  c.default_vcpu = 1;
  c.default_memory_mib = 512;
  c.default_disk_mib = 1024;
  const nlohmann::json j = CapacityToJson(c);
  for (const char* k : {"vcpu", "memory_mib", "disk_mib", "max_sandboxes", "runtimes", "templates",
                        "warm", "default_vcpu", "default_memory_mib", "default_disk_mib"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  // Through text, as the store keeps it.
  auto back = CapacityFromJson(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->vcpu, 8);
  EXPECT_EQ(back->memory_mib, 16384);
  EXPECT_EQ(back->disk_mib, 50000);
  EXPECT_EQ(back->max_sandboxes, 40);
  EXPECT_EQ(back->runtimes, c.runtimes);
  EXPECT_EQ(back->templates, c.templates);
  EXPECT_EQ(back->warm, c.warm);
  EXPECT_EQ(back->default_vcpu, 1);
  EXPECT_EQ(back->default_memory_mib, 512);
  EXPECT_EQ(back->default_disk_mib, 1024);
}

TEST(PlacementTest, ASizeNotAskedForIsTheNodesDefault) {
  // 1 GiB free on a, 3 GiB on b; a's sandboxes are 2 GiB by default, b's 512 MiB.
  PlacementNode a = Node("a"), b = Node("b");
  a.capacity.memory_mib = b.capacity.memory_mib = 4096;
  a.load.memory_mib = 3072;
  b.load.memory_mib = 1024;
  a.capacity.default_memory_mib = 2048;
  b.capacity.default_memory_mib = 512;
  PlacementRequest unsized = Req();
  unsized.memory_mib = 0;  // the create named no memory
  auto d = Place({a}, unsized);
  ASSERT_FALSE(d.ok());  // the default does not fit
  EXPECT_NE(std::string(d.status().message()).find("without the memory"), std::string::npos)
      << d.status();
  PlacementRequest small = Req();
  small.memory_mib = 256;
  EXPECT_EQ(Chosen({a}, small), "a");
  EXPECT_EQ(Chosen({a, b}, unsized), "b");
  EXPECT_EQ(WantOn(a.capacity, unsized).memory_mib, 2048);
  EXPECT_EQ(WantOn(a.capacity, small).memory_mib, 256);
}

TEST(PlacementJsonTest, MissingKeysAreDefaults) {
  for (const nlohmann::json& j : {nlohmann::json(), nlohmann::json::object(),
                                  nlohmann::json{{"vcpu", nullptr}, {"warm", nullptr}}}) {
    auto c = CapacityFromJson(j);
    ASSERT_TRUE(c.ok()) << j.dump() << ": " << c.status();
    EXPECT_EQ(c->vcpu, 0);
    EXPECT_EQ(c->max_sandboxes, 0);
    EXPECT_TRUE(c->runtimes.empty());
    EXPECT_TRUE(c->templates.empty());
    EXPECT_TRUE(c->warm.empty());
  }
  auto c = CapacityFromJson(nlohmann::json{{"vcpu", 4}, {"runtimes", {"ns"}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vcpu, 4);
  EXPECT_EQ(c->memory_mib, 0);
  EXPECT_EQ(c->runtimes, std::vector<std::string>{"ns"});
}

TEST(PlacementJsonTest, WrongTypesAreRefused) {
  const std::vector<nlohmann::json> bad = {
      nlohmann::json::array(),
      nlohmann::json("text"),
      nlohmann::json(5),
      nlohmann::json{{"vcpu", "4"}},
      nlohmann::json{{"vcpu", 1.5}},
      nlohmann::json{{"memory_mib", true}},
      nlohmann::json{{"disk_mib", nlohmann::json::array()}},
      nlohmann::json{{"max_sandboxes", nlohmann::json::object()}},
      nlohmann::json{{"max_sandboxes", uint64_t{1} << 63}},
      nlohmann::json{{"runtimes", "ns"}},
      nlohmann::json{{"runtimes", {"ns", 1}}},
      nlohmann::json{{"templates", nlohmann::json::object()}},
      nlohmann::json{{"templates", {nullptr}}},
      nlohmann::json{{"warm", {1, 2}}},
      nlohmann::json{{"warm", {{"base", "2"}}}},
      nlohmann::json{{"warm", {{"base", 2.5}}}},
  };
  for (const nlohmann::json& j : bad) {
    absl::StatusOr<NodeCapacity> c = absl::InternalError("not run");
    EXPECT_NO_THROW(c = CapacityFromJson(j)) << j.dump();
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << j.dump();
  }
}

}  // namespace
}  // namespace sbx::service

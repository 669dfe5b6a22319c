#include "service/cluster.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "common/status_util.h"
#include "common/time_util.h"
#include "store/sqlite_store.h"

namespace sbx::service {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::system_clock;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-cluster-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto s = store::OpenSqliteStore((dir_ / "sbx.db").string(), registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<NodeMembership> Member(const std::string& name, int64_t sandboxes = 0) {
    NodeMembership::Options o;
    o.name = name;
    o.url = "http://127.0.0.1:1/" + name;
    o.role = "node";
    o.report = [sandboxes] {
      NodeReport r;
      r.capacity.runtimes = {"ns"};
      r.capacity.max_sandboxes = 10;
      r.load.sandboxes = sandboxes;
      return r;
    };
    o.on_fenced = [this] { ++fenced_; };
    return std::make_unique<NodeMembership>(*store_, std::move(o));
  }

  void Put(const std::string& id, const std::string& node, const std::string& state) {
    store::SandboxRecord sb;
    sb.id = id;
    sb.tenant_id = "default";
    sb.state = state;
    sb.template_ref = "base";
    sb.template_digest = "sha256:x";
    sb.runtime = "ns";
    sb.egress_profile = "none";
    sb.created_at = sb.updated_at = NowRfc3339();
    sb.node = node;
    ASSERT_TRUE(store_->Transact([&](store::Tx& tx) { return tx.PutSandbox(sb); }).ok());
  }

  // Moves `node`'s last heartbeat `age` into the past.
  void Age(const std::string& node, milliseconds age) {
    ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(store::NodeRecord n, tx.GetNode(node));
      n.heartbeat_at = FormatRfc3339(system_clock::now() - age);
      return tx.PutNode(n);
    }).ok());
  }

  template <typename T, typename F>
  T Read(F f) {
    T out{};
    EXPECT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(out, f(tx));
      return absl::OkStatus();
    }).ok());
    return out;
  }

  fs::path dir_;
  metrics::Registry registry_;
  store::StorePtr store_;
  int fenced_ = 0;
};

TEST_F(ClusterTest, RegisteringTakesTheNextEpochAndHeartbeatsKeepIt) {
  auto a = Member("node-a");
  ASSERT_TRUE(a->Register().ok());
  EXPECT_EQ(a->epoch(), 1);
  auto beat = a->Heartbeat();
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(*beat);
  auto again = Member("node-a");  // the same node restarted
  ASSERT_TRUE(again->Register().ok());
  EXPECT_EQ(again->epoch(), 2);
  // The old process's lease is gone: its next heartbeat finds out and registers anew.
  beat = a->Heartbeat();
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(*beat);
  EXPECT_EQ(fenced_, 1);
  EXPECT_EQ(a->epoch(), 3);
}

TEST_F(ClusterTest, ASilentNodeIsDeclaredLostWithItsSandboxesOperationsAndSessions) {
  auto a = Member("node-a"), b = Member("node-b");
  ASSERT_TRUE(a->Register().ok());
  ASSERT_TRUE(b->Register().ok());
  Put("sbx_a1", "node-a", "running");
  Put("sbx_a2", "node-a", "failed");
  Put("sbx_b1", "node-b", "running");
  store::OperationRecord op;
  op.id = "op_1";
  op.tenant_id = "default";
  op.kind = "pause";
  op.sandbox_id = "sbx_a1";
  op.state = "running";
  op.created_at = op.updated_at = NowRfc3339();
  op.node = "node-a";
  store::SessionRecord ses;
  ses.id = "ses_1";
  ses.tenant_id = "default";
  ses.sandbox_id = "sbx_a1";
  ses.state = "running";
  ses.created_at = NowRfc3339();
  ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    return tx.PutSession(ses);
  }).ok());

  Cluster cluster(*store_, Cluster::Options{milliseconds(1000)});
  auto none = cluster.DeclareSilentNodesLost();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  Age("node-a", milliseconds(5000));
  auto lost = cluster.DeclareSilentNodesLost();
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(*lost, std::vector<std::string>{"node-a"});

  auto a1 = Read<store::SandboxRecord>([](store::Tx& tx) { return tx.GetSandbox("sbx_a1"); });
  EXPECT_EQ(a1.state, "lost");
  EXPECT_EQ(a1.error.value("code", ""), "node_lost");
  EXPECT_FALSE(a1.current_operation_id.has_value());
  EXPECT_EQ(Read<store::SandboxRecord>([](store::Tx& tx) { return tx.GetSandbox("sbx_a2"); }).state,
            "failed");
  EXPECT_EQ(Read<store::SandboxRecord>([](store::Tx& tx) { return tx.GetSandbox("sbx_b1"); }).state,
            "running");
  auto got_op = Read<store::OperationRecord>([](store::Tx& tx) { return tx.GetOperation("op_1"); });
  EXPECT_EQ(got_op.state, "failed");
  EXPECT_EQ(got_op.error.value("code", ""), "node_lost");
  auto got_ses = Read<store::SessionRecord>([](store::Tx& tx) { return tx.GetSession("ses_1"); });
  EXPECT_EQ(got_ses.state, "exited");
  EXPECT_EQ(got_ses.error.value("code", ""), "node_lost");

  auto nodes = cluster.ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].record.state, "lost");
  EXPECT_EQ((*nodes)[0].record.epoch, 2);
  EXPECT_FALSE((*nodes)[0].fresh);
  EXPECT_EQ((*nodes)[1].sandboxes, 1);
  // Nothing is placed there, and requests about its sandboxes go to a live node instead.
  auto placed = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->node, "node-b");
  auto owner = cluster.NodeOfSandbox("sbx_a1");
  ASSERT_TRUE(owner.ok());
  EXPECT_FALSE(owner->has_value());
  owner = cluster.NodeOfSandbox("sbx_b1");
  ASSERT_TRUE(owner.ok());
  ASSERT_TRUE(owner->has_value());
  EXPECT_EQ((**owner).node, "node-b");

  // The node comes back: its heartbeat finds the lease gone; it registers again, active.
  auto beat = a->Heartbeat();
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(*beat);
  EXPECT_EQ(fenced_, 1);
  nodes = cluster.ListNodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_EQ((*nodes)[0].record.state, "active");
  EXPECT_EQ((*nodes)[0].record.epoch, 3);
  // What it lost stays lost.
  EXPECT_EQ(Read<store::SandboxRecord>([](store::Tx& tx) { return tx.GetSandbox("sbx_a1"); }).state,
            "lost");
}

TEST_F(ClusterTest, ANodeStoppedForARestartKeepsItsSandboxesUntilItsDeadline) {
  auto a = Member("node-a"), b = Member("node-b", 5);
  ASSERT_TRUE(a->Register().ok());
  ASSERT_TRUE(b->Register().ok());
  Put("sbx_a1", "node-a", "running");
  // The stop on purpose: node-a's row carries its deadline; it then goes silent.
  NodeMembership::Options o;
  o.name = "node-a";
  o.url = "http://127.0.0.1:1/node-a";
  o.role = "node";
  o.restart_grace = milliseconds(60000);
  NodeMembership leaving(*store_, o);
  ASSERT_TRUE(leaving.Register().ok());
  ASSERT_TRUE(leaving.Leave().ok());
  auto row = Read<store::NodeRecord>([](store::Tx& tx) { return tx.GetNode("node-a"); });
  ASSERT_FALSE(row.restart_by.empty());
  Age("node-a", milliseconds(5000));

  Cluster cluster(*store_, Cluster::Options{milliseconds(1000)});
  auto none = cluster.DeclareSilentNodesLost();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());  // silent, but within its restart deadline
  EXPECT_EQ(Read<store::SandboxRecord>([](store::Tx& tx) { return tx.GetSandbox("sbx_a1"); }).state,
            "running");
  // Nothing new goes there (node-b is fuller, yet takes it), nor any request about no sandbox;
  // its own sandboxes' requests still go to it.
  auto placed = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->node, "node-b");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cluster.AnyNode()->node, "node-b");
  auto owner = cluster.NodeOfSandbox("sbx_a1");
  ASSERT_TRUE(owner.ok() && owner->has_value());
  EXPECT_EQ((*owner)->node, "node-a");

  // Back: the deadline is cleared, and placement may choose it again.
  ASSERT_TRUE(Member("node-a")->Register().ok());
  row = Read<store::NodeRecord>([](store::Tx& tx) { return tx.GetNode("node-a"); });
  EXPECT_TRUE(row.restart_by.empty());
  cluster.Invalidate();
  placed = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->node, "node-a");

  // Not back by its deadline: lost, saying so.
  ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(store::NodeRecord n, tx.GetNode("node-a"));
    n.restart_by = FormatRfc3339(system_clock::now() - milliseconds(1));
    n.heartbeat_at = FormatRfc3339(system_clock::now() - milliseconds(5000));
    return tx.PutNode(n);
  }).ok());
  auto lost = cluster.DeclareSilentNodesLost();
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(*lost, std::vector<std::string>{"node-a"});
  row = Read<store::NodeRecord>([](store::Tx& tx) { return tx.GetNode("node-a"); });
  EXPECT_NE(row.reason.find("not back by"), std::string::npos) << row.reason;

  // No grace configured: Leave writes nothing.
  auto c = Member("node-c");
  ASSERT_TRUE(c->Register().ok());
  ASSERT_TRUE(c->Leave().ok());
  EXPECT_TRUE(Read<store::NodeRecord>([](store::Tx& tx) { return tx.GetNode("node-c"); })
                  .restart_by.empty());
}

TEST_F(ClusterTest, DrainingStopsPlacementAndOutlivesARestart) {
  auto a = Member("node-a"), b = Member("node-b", 5);
  ASSERT_TRUE(a->Register().ok());
  ASSERT_TRUE(b->Register().ok());
  Cluster cluster(*store_, Cluster::Options{milliseconds(30000)});
  auto placed = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->node, "node-a");  // the emptier one
  auto drained = cluster.SetDraining("node-a", true);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->state, "draining");
  placed = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->node, "node-b");
  ASSERT_TRUE(Member("node-a")->Register().ok());  // restarted while draining
  auto nodes = cluster.ListNodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_EQ((*nodes)[0].record.state, "draining");
  ASSERT_TRUE(cluster.SetDraining("node-b", true).ok());
  auto none = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(ApiErrorCode(none.status()), "no_capacity");
  EXPECT_NE(std::string(none.status().message()).find("2 draining"), std::string::npos)
      << none.status();
  ASSERT_TRUE(cluster.SetDraining("node-a", false).ok());
  EXPECT_TRUE(cluster.Place(PlacementRequest{"ns", "base"}).ok());
  EXPECT_TRUE(absl::IsNotFound(cluster.SetDraining("node-z", true).status()));
}

TEST_F(ClusterTest, AntiAffinityCountsTheTenantsGroupInTheStore) {
  auto a = Member("node-a"), b = Member("node-b", 3);
  ASSERT_TRUE(a->Register().ok());
  ASSERT_TRUE(b->Register().ok());
  Cluster cluster(*store_, Cluster::Options{milliseconds(30000)});
  // node-a is the emptier, but holds one of the group already.
  auto put_labelled = [&](const char* id, const char* node, const char* tenant) {
    Put(id, node, "running");
    ASSERT_TRUE(store_->Transact([&](store::Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(id));
      sb.tenant_id = tenant;
      sb.labels = {{"job", "j1"}};
      return tx.PutSandbox(sb);
    }).ok());
  };
  put_labelled("sbx_1", "node-a", "default");
  PlacementRequest r{"ns", "base"};
  r.anti_affinity = true;
  r.tenant = "default";
  r.group_key = "job";
  r.group_value = "j1";
  auto placed = cluster.Place(r);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->node, "node-b");
  // Another tenant's group of the same name is not this one.
  r.tenant = "ten_other";
  placed = cluster.Place(r);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->node, "node-a");
  // A tie in the group falls back to fill.
  put_labelled("sbx_2", "node-b", "default");
  r.tenant = "default";
  placed = cluster.Place(r);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->node, "node-a");
}

TEST_F(ClusterTest, ChurnThroughOneReplicaIsNotRefusedOnItsOwnEstimates) {
  // Room for 4 sandboxes of the default size; create+delete cycles, many more than 4 within
  // the cached view's lifetime: the replica's running estimate must never refuse on its own.
  NodeMembership::Options o;
  o.name = "node-a";
  o.url = "http://127.0.0.1:1/a";
  o.role = "node";
  o.report = [] {
    NodeReport r;
    r.capacity.runtimes = {"ns"};
    r.capacity.vcpu = 4;
    r.capacity.default_vcpu = 1;
    return r;
  };
  NodeMembership a(*store_, std::move(o));
  ASSERT_TRUE(a.Register().ok());
  Cluster cluster(*store_, Cluster::Options{milliseconds(30000)});
  for (int i = 0; i < 20; ++i) {
    auto placed = cluster.Place(PlacementRequest{"ns", "base"});
    ASSERT_TRUE(placed.ok()) << i << ": " << placed.status();
  }
  // A real lack of room is still refused (4 held in the store, the report says 4 of 4).
  for (int i = 0; i < 4; ++i) Put("sbx_" + std::to_string(i), "node-a", "running");
  auto none = cluster.Place(PlacementRequest{"ns", "base"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(ApiErrorCode(none.status()), "no_capacity") << none.status();
}

TEST_F(ClusterTest, AnyNodeSkipsSilentNodesAndThoseAlreadyTried) {
  auto a = Member("node-a"), b = Member("node-b");
  ASSERT_TRUE(a->Register().ok());
  ASSERT_TRUE(b->Register().ok());
  Age("node-b", milliseconds(60000));
  Cluster cluster(*store_, Cluster::Options{milliseconds(1000)});
  for (int i = 0; i < 4; ++i) {
    auto any = cluster.AnyNode();
    ASSERT_TRUE(any.ok());
    EXPECT_EQ(any->node, "node-a");
  }
  auto none = cluster.AnyNode({"node-a"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sbx::service

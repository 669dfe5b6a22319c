#include "service/idempotency.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "common/status_util.h"
#include "store/sqlite_store.h"

namespace sbx::service {
namespace {

namespace fs = std::filesystem;
constexpr auto kAbandoned = std::chrono::seconds(600);

class IdempotencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-idempotency-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto s = store::OpenSqliteStore((dir_ / "sbx.db").string(), registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static IdempotencyKey Key(std::string hash) {
    return IdempotencyKey{"default", "k1", "PUT", "/v1/sandboxes/sbx_x/files", std::move(hash)};
  }
  ClaimResult Claim(const IdempotencyKey& k) {
    auto r = ClaimIdempotent(*store_, k, kAbandoned);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ClaimResult{};
  }

  fs::path dir_;
  metrics::Registry registry_;
  store::StorePtr store_;
};

// A streamed upload claims its key before its body is read: duplicates, streamed or not,
// wait for it rather than being told the key was reused.
TEST_F(IdempotencyTest, AStreamedClaimHasNoHashYetAndDuplicatesWait) {
  EXPECT_TRUE(std::holds_alternative<Claimed>(Claim(Key(""))));
  EXPECT_TRUE(std::holds_alternative<InProgress>(Claim(Key(""))));
  EXPECT_TRUE(std::holds_alternative<InProgress>(Claim(Key("abc"))));
}

// Once the first recorded its answer with the hash of the body it read, a streamed duplicate
// gets that hash to compare its own with; a buffered one is compared by the claim.
TEST_F(IdempotencyTest, TheFinishedAnswerCarriesTheFirstHash) {
  ASSERT_TRUE(std::holds_alternative<Claimed>(Claim(Key(""))));
  ASSERT_TRUE(FinishIdempotent(*store_, Key("abc"), 200, R"({"entry":{}})").ok());

  ClaimResult streamed = Claim(Key(""));
  ASSERT_TRUE(std::holds_alternative<Replay>(streamed));
  EXPECT_EQ(std::get<Replay>(streamed).status, 200);
  EXPECT_EQ(std::get<Replay>(streamed).body, R"({"entry":{}})");
  EXPECT_EQ(std::get<Replay>(streamed).body_hash, "abc");

  EXPECT_TRUE(std::holds_alternative<Replay>(Claim(Key("abc"))));
  auto other = ClaimIdempotent(*store_, Key("def"), kAbandoned);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(ApiErrorCode(other.status()), "idempotency_key_reused");
}

// An answer without a hash (the handler answered before reading the body to its end) is not
// kept: the key is free for a retry, which runs again.
TEST_F(IdempotencyTest, AnAnswerWithoutAHashGivesTheKeyBack) {
  ASSERT_TRUE(std::holds_alternative<Claimed>(Claim(Key(""))));
  ASSERT_TRUE(FinishIdempotent(*store_, Key(""), 404, R"({"error":{}})").ok());
  EXPECT_TRUE(std::holds_alternative<Claimed>(Claim(Key(""))));
  ASSERT_TRUE(FinishIdempotent(*store_, Key("abc"), 503, R"({"error":{}})").ok());
  EXPECT_TRUE(std::holds_alternative<Claimed>(Claim(Key("def"))));
}

}  // namespace
}  // namespace sbx::service

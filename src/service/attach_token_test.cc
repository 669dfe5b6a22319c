#include "service/attach_token.h"

#include <sys/stat.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/digest.h"
#include "common/files.h"

namespace sbx::service {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using Clock = AttachTokens::Clock;

const Clock::time_point kT0{seconds(1'700'000'000)};

std::string Message(const absl::StatusOr<AttachTokens::Claims>& r) {
  return std::string(r.status().message());
}

// A token as sbxd minted them before the key ring: "sat1.<claims>.<sig>", no kid.
std::string LegacyToken(const std::string& key, const std::string& sid, int64_t exp_unix) {
  nlohmann::json claims = {{"sid", sid}, {"ten", "default"}, {"exp", exp_unix}};
  std::string body = "sat1." + Base64UrlEncode(claims.dump());
  return body + "." + Base64UrlEncode(HmacSha256(key, body));
}

int64_t Unix(Clock::time_point t) {
  return std::chrono::duration_cast<seconds>(t.time_since_epoch()).count();
}

TEST(AttachTokens, RoundTripAndScope) {
  AttachTokens tokens("key", seconds(60));
  auto now = Clock::now();
  auto minted = tokens.MintAt("ses_a", "default", now);
  EXPECT_EQ(minted.token.rfind("sat2." + AttachTokens::KeyId("key") + ".", 0), 0u)
      << minted.token;
  EXPECT_TRUE(LooksLikeAttachToken(minted.token));
  auto claims = tokens.VerifyAt(minted.token, now);
  ASSERT_TRUE(claims.ok()) << claims.status();
  EXPECT_EQ(claims->session_id, "ses_a");
  EXPECT_EQ(claims->tenant_id, "default");
}

TEST(AttachTokens, KeyIdIsEightHexDigitsOfTheKeysSha256) {
  std::string id = AttachTokens::KeyId("key");
  EXPECT_EQ(id, Sha256Hex("key").substr(0, 8));
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(AttachTokens, LooksLikeAttachToken) {
  EXPECT_TRUE(LooksLikeAttachToken("sat1.x.y"));
  EXPECT_TRUE(LooksLikeAttachToken("sat2.k.x.y"));
  EXPECT_FALSE(LooksLikeAttachToken("sat3.k.x.y"));
  EXPECT_FALSE(LooksLikeAttachToken("sat"));
  EXPECT_FALSE(LooksLikeAttachToken(""));
  EXPECT_FALSE(LooksLikeAttachToken("sbt_0123456789"));
}

TEST(AttachTokens, RejectsExpiredForgedAndMalformed) {
  AttachTokens tokens("key", seconds(60));
  auto now = Clock::now();
  auto minted = tokens.MintAt("ses_a", "default", now);
  EXPECT_EQ(Message(tokens.VerifyAt(minted.token, now + seconds(61))), "attach token is expired");
  AttachTokens other("other-key", seconds(60));
  EXPECT_EQ(Message(other.VerifyAt(minted.token, now)), "attach token is invalid");
  for (const char* bad : {"", "sat1.", "sat1..", "garbage", "sat1.e30.AAAA", "sat2.", "sat2..",
                          "sat2.abcd", "sat2.abcd.AAAA", "sat2.abcd.e30.AAAA", "sat3.a.b.c"}) {
    auto r = tokens.VerifyAt(bad, now);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(AttachTokens, TamperedKidClaimsOrSignatureAreInvalid) {
  AttachTokens tokens("key", seconds(60));
  const auto minted = tokens.MintAt("ses_a", "default", kT0);
  const std::string& t = minted.token;
  const size_t kid_at = 5, claims_at = t.find('.', kid_at) + 1, sig_at = t.rfind('.') + 1;
  auto flip = [&](size_t i) {
    std::string out = t;
    out[i] = out[i] == 'A' ? 'B' : (out[i] == '0' ? '1' : (std::isdigit(out[i]) ? '0' : 'A'));
    return out;
  };
  for (size_t i : {kid_at, claims_at - 2, claims_at, claims_at + 5, sig_at - 2, sig_at,
                   t.size() - 2}) {
    std::string tampered = flip(i);
    ASSERT_NE(tampered, t);
    auto r = tokens.VerifyAt(tampered, kT0);
    EXPECT_EQ(Message(r), "attach token is invalid") << i << ": " << tampered;
  }
  // A kid of a key the ring never had, and a token signed with it.
  const std::string unknown = "sat2.00000000" + t.substr(claims_at - 1);
  EXPECT_EQ(Message(tokens.VerifyAt(unknown, kT0)), "attach token is invalid");
  AttachTokens stranger("stranger", seconds(60));
  EXPECT_EQ(Message(tokens.VerifyAt(stranger.MintAt("ses_a", "default", kT0).token, kT0)),
            "attach token is invalid");
  // The legacy format with a v2 body: the signature covers the prefix.
  EXPECT_EQ(Message(tokens.VerifyAt("sat1." + t.substr(5), kT0)), "attach token is invalid");
}

TEST(AttachTokens, OversizedTokenIsMalformed) {
  AttachTokens tokens("key", seconds(60));
  auto minted = tokens.MintAt(std::string(800, 's'), "default", kT0);
  ASSERT_GT(minted.token.size(), 1024u);
  EXPECT_EQ(Message(tokens.VerifyAt(minted.token, kT0)), "attach token is malformed");
  EXPECT_EQ(Message(tokens.VerifyAt("sat2." + std::string(1100, 'a'), kT0)),
            "attach token is malformed");
}

TEST(AttachTokens, LegacyTokenVerifiesWhileItsKeyIsInTheRing) {
  AttachTokens tokens("legacy-key", seconds(60));
  const std::string legacy = LegacyToken("legacy-key", "ses_old", Unix(kT0) + 3600);
  auto claims = tokens.VerifyAt(legacy, kT0);
  ASSERT_TRUE(claims.ok()) << claims.status();
  EXPECT_EQ(claims->session_id, "ses_old");
  EXPECT_EQ(Message(tokens.VerifyAt(LegacyToken("other", "ses_old", Unix(kT0) + 60), kT0)),
            "attach token is invalid");
  EXPECT_EQ(Message(tokens.VerifyAt(LegacyToken("legacy-key", "ses_old", Unix(kT0)), kT0)),
            "attach token is expired");

  // Once rotated out, it verifies until the legacy key retires (one TTL later).
  auto rotated = tokens.Rotate(kT0);
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  EXPECT_TRUE(tokens.VerifyAt(legacy, kT0 + seconds(59)).ok());
  EXPECT_EQ(Message(tokens.VerifyAt(legacy, kT0 + seconds(60))), "attach token is invalid");
}

TEST(AttachTokens, RotateSignsWithTheNewKeyAndRetiresTheOldOneAfterOneTtl) {
  AttachTokens tokens(std::vector<AttachTokens::Key>{AttachTokens::MakeKey("first-key", kT0)}, "",
                      seconds(3600));
  const auto long_lived = tokens.MintAt("ses_long", "default", kT0);  // expires at +3600
  tokens.SetTtl(seconds(60));
  const auto old_token = tokens.MintAt("ses_old", "default", kT0);  // expires at +60
  const std::string old_id = AttachTokens::KeyId("first-key");

  auto rotated = tokens.Rotate(kT0 + seconds(10));
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  ASSERT_EQ(rotated->keys.size(), 2u);
  EXPECT_EQ(rotated->keys[0].id, old_id);
  ASSERT_TRUE(rotated->keys[0].retire_at.has_value());
  EXPECT_EQ(*rotated->keys[0].retire_at, "2023-11-14T22:14:30.000Z");  // kT0 + 10 + 60
  EXPECT_EQ(rotated->keys[1].retire_at, std::nullopt);
  EXPECT_NE(rotated->signing_key_id, old_id);
  EXPECT_EQ(rotated->keys[1].id, rotated->signing_key_id);
  EXPECT_EQ(tokens.Keys().ToJson(), rotated->ToJson());
  EXPECT_TRUE(rotated->ToJson()["keys"][1]["retire_at"].is_null());

  const auto new_token = tokens.MintAt("ses_new", "default", kT0 + seconds(10));
  EXPECT_EQ(new_token.token.rfind("sat2." + rotated->signing_key_id + ".", 0), 0u);
  EXPECT_TRUE(tokens.VerifyAt(old_token.token, kT0 + seconds(30)).ok());
  EXPECT_TRUE(tokens.VerifyAt(long_lived.token, kT0 + seconds(69)).ok());
  // Minted under a longer TTL than the one at rotation: cut off when its key retires.
  EXPECT_EQ(Message(tokens.VerifyAt(long_lived.token, kT0 + seconds(70))),
            "attach token is invalid");
  EXPECT_EQ(Message(tokens.VerifyAt(old_token.token, kT0 + seconds(60))),
            "attach token is expired");
  EXPECT_TRUE(tokens.VerifyAt(new_token.token, kT0 + seconds(69)).ok());

  // The next rotation drops the retired key and retires the one that signed until then.
  auto again = tokens.Rotate(kT0 + seconds(70));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->keys.size(), 2u);
  EXPECT_EQ(again->keys[0].id, rotated->signing_key_id);
  EXPECT_EQ(*again->keys[0].retire_at, "2023-11-14T22:15:30.000Z");  // kT0 + 70 + 60
  EXPECT_TRUE(tokens.VerifyAt(new_token.token, kT0 + seconds(69)).ok());
}

TEST(AttachTokens, RotateRefusesAFullRingAndChangesNothing) {
  AttachTokens tokens("key", seconds(60));
  for (size_t i = 1; i < AttachTokens::kMaxKeys; ++i) {
    ASSERT_TRUE(tokens.Rotate(kT0 + seconds(i)).ok()) << i;
  }
  const auto before = tokens.Keys();
  ASSERT_EQ(before.keys.size(), AttachTokens::kMaxKeys);
  auto full = tokens.Rotate(kT0 + seconds(20));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tokens.Keys().ToJson(), before.ToJson());
  // Once the oldest has retired there is room again.
  auto later = tokens.Rotate(kT0 + seconds(61));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->keys.size(), AttachTokens::kMaxKeys);
}

TEST(AttachTokens, VerifyAndMintRunWhileRotating) {
  AttachTokens tokens("key", seconds(600));
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto m = tokens.MintAt("ses_a", "default", kT0);
        if (!tokens.VerifyAt(m.token, kT0).ok()) failures.fetch_add(1);
      }
    });
  }
  // Every rotation at kT0 retires the previous key at kT0 + 600: all stay live until full.
  for (size_t i = 1; i < AttachTokens::kMaxKeys; ++i) {
    ASSERT_TRUE(tokens.Rotate(kT0).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

class AttachKeyRingFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "attach_keys_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ring_path_ = (dir_ / AttachTokens::kRingFile).string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Write(const fs::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  static void ExpectSameKeys(const std::vector<AttachTokens::Key>& a,
                             const std::vector<AttachTokens::Key>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].id, b[i].id) << i;
      EXPECT_EQ(a[i].secret, b[i].secret) << i;
      EXPECT_EQ(a[i].created_at, b[i].created_at) << i;
      EXPECT_EQ(a[i].retire_at, b[i].retire_at) << i;
    }
  }

  fs::path dir_;
  std::string ring_path_;
};

TEST_F(AttachKeyRingFile, CreatedOnceThenLoadedRotatedAndReloaded) {
  auto ring = AttachTokens::LoadOrCreateRing(dir_.string(), kT0 + std::chrono::milliseconds(250));
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_EQ(ring->size(), 1u);
  EXPECT_EQ((*ring)[0].created_at, kT0);
  EXPECT_GE((*ring)[0].secret.size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat(ring_path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_FALSE(fs::exists(ring_path_ + ".tmp"));

  auto again = AttachTokens::LoadOrCreateRing(dir_.string(), kT0 + seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameKeys(*ring, *again);

  // Rotate persists; a restart (a new AttachTokens over the reloaded ring) keeps every key.
  AttachTokens tokens(*ring, ring_path_, seconds(60));
  const auto before = tokens.MintAt("ses_a", "default", kT0);
  auto rotated = tokens.Rotate(kT0 + seconds(1));
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  const auto after = tokens.MintAt("ses_b", "default", kT0 + seconds(1));
  auto reloaded = AttachTokens::LoadRing(ring_path_);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  ASSERT_EQ(reloaded->size(), 2u);
  AttachTokens restarted(*reloaded, ring_path_, seconds(60));
  EXPECT_EQ(restarted.Keys().ToJson(), tokens.Keys().ToJson());
  EXPECT_TRUE(restarted.VerifyAt(before.token, kT0 + seconds(2)).ok());
  EXPECT_TRUE(restarted.VerifyAt(after.token, kT0 + seconds(2)).ok());
  EXPECT_EQ(restarted.MintAt("ses_c", "default", kT0).token.substr(0, 14),
            after.token.substr(0, 14));
  ::stat(ring_path_.c_str(), &st);
  EXPECT_EQ(st.st_mode & 0777, 0600);

  auto text = ReadFileToString(ring_path_);
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  ASSERT_EQ(j["keys"].size(), 2u);
  EXPECT_EQ(j["keys"][0]["id"], (*ring)[0].id);
  EXPECT_EQ(j["keys"][0]["retire_at"], "2023-11-14T22:14:21.000Z");
  EXPECT_TRUE(j["keys"][1]["retire_at"].is_null());
  EXPECT_EQ(Base64Decode(j["keys"][1]["key_b64"].get<std::string>()), (*reloaded)[1].secret);
}

TEST_F(AttachKeyRingFile, TheLegacyKeyBecomesTheFirstMember) {
  Write(dir_ / AttachTokens::kLegacyKeyFile, "legacy-secret-0123456789abcdef\n");
  auto ring = AttachTokens::LoadOrCreateRing(dir_.string(), kT0);
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_EQ(ring->size(), 1u);
  EXPECT_EQ((*ring)[0].secret, "legacy-secret-0123456789abcdef");
  AttachTokens tokens(*ring, ring_path_, seconds(60));
  const std::string legacy =
      LegacyToken("legacy-secret-0123456789abcdef", "ses_old", Unix(kT0) + 30);
  EXPECT_TRUE(tokens.VerifyAt(legacy, kT0).ok());
  // The legacy file is no longer read once the ring exists.
  Write(dir_ / AttachTokens::kLegacyKeyFile, "another-secret-0123456789abcdef\n");
  auto again = AttachTokens::LoadOrCreateRing(dir_.string(), kT0);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameKeys(*ring, *again);
}

TEST_F(AttachKeyRingFile, ACorruptRingIsAnErrorNamingTheFileAndIsLeftAlone) {
  auto good = AttachTokens::LoadOrCreateRing(dir_.string(), kT0);
  ASSERT_TRUE(good.ok()) << good.status();
  const std::string secret_b64 = Base64Encode((*good)[0].secret);
  const std::string id = (*good)[0].id;
  const std::string key = R"("key_b64":")" + secret_b64 + R"(","created_at":"2023-11-14T22:13:20.000Z")";
  for (const std::string& bad : {
           std::string("{not json"),
           std::string(""),
           std::string(R"({"keys":[]})"),
           std::string(R"([])"),
           R"({"keys":[{"id":"0000000a",)" + key + R"(,"retire_at":null}]})",
           R"({"keys":[{"id":")" + id + R"(","key_b64":"!!","created_at":"2023-11-14T22:13:20.000Z","retire_at":null}]})",
           R"({"keys":[{"id":")" + id + R"(","key_b64":"c2hvcnQ=","created_at":"2023-11-14T22:13:20.000Z","retire_at":null}]})",
           R"({"keys":[{"id":")" + id + R"(",)" + key + R"(,"retire_at":"2023-11-14T22:13:20.000Z"}]})",
           R"({"keys":[{"id":")" + id + R"(",)" + key + R"(,"retire_at":null},{"id":")" + id + R"(",)" + key + R"(,"retire_at":null}]})",
           R"({"keys":[{"id":")" + id + R"(","key_b64":")" + secret_b64 + R"(","created_at":"yesterday","retire_at":null}]})",
       }) {
    Write(ring_path_, bad);
    auto ring = AttachTokens::LoadOrCreateRing(dir_.string(), kT0);
    ASSERT_FALSE(ring.ok()) << bad;
    EXPECT_NE(ring.status().message().find(ring_path_), std::string::npos) << ring.status();
    EXPECT_EQ(ReadFileToString(ring_path_).value_or("?"), bad);
  }
  // The valid one, for contrast.
  Write(ring_path_, R"({"keys":[{"id":")" + id + R"(",)" + key + R"(,"retire_at":null}]})");
  auto ring = AttachTokens::LoadOrCreateRing(dir_.string(), kT0);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ((*ring)[0].secret, (*good)[0].secret);
}

TEST_F(AttachKeyRingFile, AnUnreadableRingIsAnErrorNamingTheFile) {
  fs::create_directory(ring_path_);  // unreadable as a file, even for root
  auto ring = AttachTokens::LoadOrCreateRing(dir_.string(), kT0);
  ASSERT_FALSE(ring.ok());
  EXPECT_NE(ring.status().message().find(ring_path_), std::string::npos) << ring.status();
}

TEST_F(AttachKeyRingFile, ARotationThatCannotBeWrittenChangesNothing) {
  const std::string missing = (dir_ / "gone" / AttachTokens::kRingFile).string();
  AttachTokens tokens(std::vector<AttachTokens::Key>{AttachTokens::MakeKey("key", kT0)}, missing,
                      seconds(60));
  const auto before = tokens.Keys();
  auto rotated = tokens.Rotate(kT0 + seconds(1));
  ASSERT_FALSE(rotated.ok());
  EXPECT_NE(rotated.status().message().find(missing + ".tmp"), std::string::npos)
      << rotated.status();
  EXPECT_EQ(tokens.Keys().ToJson(), before.ToJson());
  EXPECT_EQ(tokens.MintAt("ses_a", "default", kT0).token.rfind("sat2." + before.signing_key_id, 0),
            0u);
}

}  // namespace
}  // namespace sbx::service

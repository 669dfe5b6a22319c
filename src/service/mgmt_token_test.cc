#include "service/mgmt_token.h"

#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/digest.h"
#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::service {
namespace {

// The regex the header gives secret scanners.
const std::regex kScannerRegex("sbxm1_[a-z2-7]{20}_[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]");

void ExpectMalformed(std::string_view token, const std::string& what) {
  auto r = ParseToken(token);
  ASSERT_FALSE(r.ok()) << what;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << what;
  EXPECT_EQ(ApiErrorCode(r.status()), "unauthenticated") << what;
  const std::string message(r.status().message());
  // Nothing of the input comes back: no piece of the id or of the secret.
  if (token.size() >= 26) {
    EXPECT_EQ(message.find(std::string(token.substr(6, 20))), std::string::npos) << what;
  }
  if (token.size() >= 43) {
    EXPECT_EQ(message.find(std::string(token.substr(27, 16))), std::string::npos) << what;
  }
}

TEST(MgmtToken, MintParseMatchRoundTrip) {
  std::set<std::string> seen;
  std::set<char> last_chars;
  // Many, so that every possible last character of the secret and '_'/'-' inside it occur.
  for (int i = 0; i < 2000; ++i) {
    MintedToken m = MintToken();
    ASSERT_TRUE(IsValidId(m.id, "tok")) << m.id;
    ASSERT_EQ(m.token.size(), kMgmtTokenBytes);
    ASSERT_EQ(m.token.rfind("sbxm1_", 0), 0u);
    ASSERT_EQ(m.hash, "sha256:" + Sha256Hex(m.token));
    ASSERT_TRUE(std::regex_match(m.token, kScannerRegex)) << m.token;
    auto p = ParseToken(m.token);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->id, m.id);
    EXPECT_EQ(p->token, m.token);
    EXPECT_TRUE(TokenMatches(p->token, m.hash));
    seen.insert(m.token);
    last_chars.insert(m.token.back());
  }
  EXPECT_EQ(seen.size(), 2000u);
  // Every value of the secret's last 4 bits was accepted.
  EXPECT_EQ(last_chars.size(), 16u);
}

TEST(MgmtToken, HashMismatch) {
  MintedToken a = MintToken();
  MintedToken b = MintToken();
  EXPECT_FALSE(TokenMatches(a.token, b.hash));
  EXPECT_FALSE(TokenMatches(a.token, ""));
  EXPECT_FALSE(TokenMatches(a.token, a.hash.substr(0, a.hash.size() - 1)));
  EXPECT_FALSE(TokenMatches(a.token, Sha256Hex(a.token)));  // no "sha256:" prefix
  std::string upper = a.hash;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_FALSE(TokenMatches(a.token, upper));
  // One character of the secret changed, still well-formed.
  std::string other = a.token;
  other[40] = other[40] == 'a' ? 'b' : 'a';
  ASSERT_TRUE(ParseToken(other).ok());
  EXPECT_FALSE(TokenMatches(other, a.hash));
}

TEST(MgmtToken, RejectsEveryMalformedShape) {
  // Fixed rather than minted: a minted secret may start with '_', and then some of the shapes
  // below would be well-formed.
  const std::string id = "abcdefghijklmnopqr27";
  const std::string secret = "AZaz09-_AZaz09-_AZaz09-_AZaz09-_AZaz09-_AZQ";
  ASSERT_EQ(secret.size(), 43u);
  const std::string good = "sbxm1_" + id + "_" + secret;
  ASSERT_TRUE(ParseToken(good).ok());

  ExpectMalformed("", "empty");
  ExpectMalformed("sbxm1_", "prefix only");
  ExpectMalformed("sbxm1", "short prefix");
  ExpectMalformed("sbxm2_" + id + "_" + secret, "wrong version");
  ExpectMalformed("SBXM1_" + id + "_" + secret, "uppercase prefix");
  ExpectMalformed("sbx_" + id + "_" + secret, "wrong prefix");
  ExpectMalformed("tok_" + id + "_" + secret, "token id instead of prefix");
  ExpectMalformed(" sbxm1_" + id + "_" + secret, "leading space");
  ExpectMalformed("sbxm1_" + id + "_" + secret + " ", "trailing space");
  ExpectMalformed("sbxm1_" + id + "_" + secret + "\n", "trailing newline");
  ExpectMalformed("Bearer sbxm1_" + id + "_" + secret, "scheme left in");

  // The id: length and alphabet (base32 is a-z and 2-7).
  ExpectMalformed("sbxm1_" + id.substr(1) + "_" + secret, "id of 19");
  ExpectMalformed("sbxm1_" + id + "a_" + secret.substr(1), "id of 21, same total length");
  ExpectMalformed("sbxm1_" + id + "a_" + secret, "id of 21");
  for (char bad : {'A', 'Z', '0', '1', '8', '9', '-', '_', '.', '\xff'}) {
    std::string t = good;
    t[6 + 7] = bad;
    ExpectMalformed(t, std::string("id with ") + bad);
  }

  // The secret: length, alphabet and its last character (4 zero bits for 32 bytes).
  ExpectMalformed("sbxm1_" + id + "_" + secret.substr(1), "secret of 42");
  ExpectMalformed("sbxm1_" + id + "_" + secret + "A", "secret of 44");
  ExpectMalformed("sbxm1_" + id + "_", "no secret");
  ExpectMalformed("sbxm1_" + id, "no separator or secret");
  for (char bad : {'+', '/', '=', '.', ' ', '~', '\x80'}) {
    std::string t = good;
    t[30] = bad;
    ExpectMalformed(t, std::string("secret with ") + bad);
  }
  for (char last : {'B', 'R', 'h', 'x', '_', '-', '9', '1', 'D', 'l'}) {
    std::string t = good;
    t.back() = last;
    ExpectMalformed(t, std::string("non-canonical last character ") + last);
  }
  ExpectMalformed("sbxm1_" + id + "_" + secret.substr(0, 41) + "==", "padded secret");

  // Extra and missing underscores ('_' inside the secret is legal: see the round trip).
  ExpectMalformed("sbxm1__" + id + "_" + secret, "underscore before the id");
  ExpectMalformed("sbxm1_" + id + "__" + secret, "double separator");
  ExpectMalformed("sbxm1_" + id + "-" + secret, "dash as separator");
  ExpectMalformed("sbxm1_" + id + secret + "A", "no separator, same length");
  ExpectMalformed("sbxm1_" + id.substr(0, 10) + "_" + id.substr(10) + "_" + secret,
                  "underscore inside the id");
  ExpectMalformed("sbxm1_" + id + "_" + secret + "_", "trailing underscore");

  // NUL bytes anywhere.
  for (size_t at : {size_t{0}, size_t{5}, size_t{10}, size_t{26}, size_t{50}, good.size() - 1}) {
    std::string t = good;
    t[at] = '\0';
    ExpectMalformed(t, "NUL at " + std::to_string(at));
  }
  ExpectMalformed(good + std::string(1, '\0'), "NUL appended");
  ExpectMalformed(std::string(70, '\0'), "all NUL");

  // Oversized: refused before anything is read past the bound.
  ExpectMalformed(std::string(10 * 1024, 'a'), "10 KiB");
  ExpectMalformed(good + std::string(10 * 1024, 'A'), "10 KiB after a good token");
  ExpectMalformed(std::string(kMgmtTokenMaxBytes + 1, 'a'), "one past the bound");
  auto r = ParseToken(good + std::string(10 * 1024, 'A'));
  EXPECT_NE(std::string(r.status().message()).find("too long"), std::string::npos);
}

TEST(MgmtToken, ParsedIdIsAValidTokenId) {
  // Any well-formed token, not only minted ones, yields an id the store can take.
  const std::string t = "sbxm1_abcdefghijklmnopqrst_" + std::string(42, '_') + "w";
  auto p = ParseToken(t);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->id, "tok_abcdefghijklmnopqrst");
  EXPECT_TRUE(IsValidId(p->id, "tok"));
}

TEST(Scopes, NamesAndBits) {
  EXPECT_EQ(ScopeName(Scope::kRead), "read");
  EXPECT_EQ(ScopeName(Scope::kSandboxes), "sandboxes");
  EXPECT_EQ(ScopeName(Scope::kSessions), "sessions");
  EXPECT_EQ(ScopeName(Scope::kFiles), "files");
  EXPECT_EQ(ScopeName(Scope::kTemplates), "templates");
  EXPECT_EQ(ScopeName(Scope::kAdmin), "admin");
  EXPECT_EQ(ScopeName(static_cast<Scope>(1u << 20)), "");
  // Stored values: a change here breaks every token in every store.
  EXPECT_EQ(ScopeBit(Scope::kRead), 1u);
  EXPECT_EQ(ScopeBit(Scope::kAdmin), 32u);
  EXPECT_EQ(kAllScopes, 63u);
}

TEST(Scopes, ParseAndFormat) {
  auto s = ParseScopes({"sessions", "read", "read"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, ScopeBit(Scope::kRead) | ScopeBit(Scope::kSessions));
  EXPECT_EQ(ScopeNames(*s), (std::vector<std::string>{"read", "sessions"}));

  auto all = ParseScopes({"admin", "templates", "files", "sessions", "sandboxes", "read"});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, kAllScopes);
  EXPECT_EQ(ScopeNames(kAllScopes),
            (std::vector<std::string>{"read", "sandboxes", "sessions", "files", "templates",
                                      "admin"}));
  EXPECT_EQ(ScopeNames(0), std::vector<std::string>{});
  EXPECT_EQ(ScopeNames(ScopeBit(Scope::kAdmin) | (1u << 31)),
            std::vector<std::string>{"admin"});
  // Formatting then parsing gives the value back, for every combination.
  for (Scopes v = 1; v <= kAllScopes; ++v) {
    auto back = ParseScopes(ScopeNames(v));
    ASSERT_TRUE(back.ok()) << v;
    EXPECT_EQ(*back, v);
  }
}

TEST(Scopes, ParseErrors) {
  auto empty = ParseScopes({});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApiErrorCode(empty.status()), "invalid_argument");
  EXPECT_EQ(ApiErrorField(empty.status()), "scopes");

  for (const char* bad : {"sandbox", "READ", "", " read", "read ", "admin,read", "*"}) {
    auto r = ParseScopes({"read", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(ApiErrorCode(r.status()), "invalid_argument") << bad;
    EXPECT_EQ(ApiErrorField(r.status()), "scopes") << bad;
    const std::string m(r.status().message());
    EXPECT_NE(m.find(std::string("\"") + bad + "\""), std::string::npos) << m;
    EXPECT_NE(m.find("read, sandboxes, sessions, files, templates, admin"), std::string::npos)
        << m;
  }
  // A hostile name is cut and made printable before it is quoted.
  auto r = ParseScopes({std::string(10000, 'x') + "\n\x1b[31m"});
  ASSERT_FALSE(r.ok());
  const std::string m(r.status().message());
  EXPECT_LT(m.size(), 300u);
  EXPECT_EQ(m.find('\n'), std::string::npos);
  EXPECT_EQ(m.find('\x1b'), std::string::npos);
  auto ctl = ParseScopes({std::string("re\0ad", 5)});
  ASSERT_FALSE(ctl.ok());
  EXPECT_NE(std::string(ctl.status().message()).find("\"re?ad\""), std::string::npos);
}

TEST(Scopes, AdminImpliesEveryScope) {
  const Scope all[] = {Scope::kRead, Scope::kSandboxes, Scope::kSessions,
                       Scope::kFiles, Scope::kTemplates, Scope::kAdmin};
  for (Scope need : all) {
    EXPECT_TRUE(HasScope(ScopeBit(Scope::kAdmin), need)) << ScopeName(need);
    EXPECT_TRUE(HasScope(ScopeBit(need), need)) << ScopeName(need);
    EXPECT_FALSE(HasScope(0, need)) << ScopeName(need);
    // No other scope implies anything: read is not implied by sandboxes, nor admin by all
    // the others together.
    for (Scope other : all) {
      if (other == need || other == Scope::kAdmin) continue;
      EXPECT_FALSE(HasScope(ScopeBit(other), need))
          << ScopeName(other) << " -> " << ScopeName(need);
    }
  }
  EXPECT_FALSE(HasScope(kAllScopes & ~ScopeBit(Scope::kAdmin), Scope::kAdmin));
}

}  // namespace
}  // namespace sbx::service

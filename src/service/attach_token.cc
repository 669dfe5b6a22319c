#include "service/attach_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/digest.h"
#include "common/files.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "common/unique_fd.h"

namespace sbx::service {
namespace {
constexpr std::string_view kPrefixV1 = "sat1.";  // no kid: tokens minted before the ring
constexpr std::string_view kPrefixV2 = "sat2.";
constexpr size_t kMaxTokenBytes = 1024;
// What a key must at least be: sbxd makes 32 random bytes (43 base64url characters).
constexpr size_t kMinSecretBytes = 16;

using Clock = AttachTokens::Clock;

absl::Status Bad(const char* why) {
  return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                  std::string("attach token is ") + why);
}

// Key times are whole seconds, as token expiries are, so a ring reads back from its file (which
// keeps milliseconds) exactly as it was written.
Clock::time_point ToSeconds(Clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t);
}

bool Usable(const AttachTokens::Key& k, Clock::time_point now) {
  return !k.retire_at || now < *k.retire_at;
}

AttachKeysView ViewOf(const std::vector<AttachTokens::Key>& ring) {
  AttachKeysView v;
  v.signing_key_id = ring.back().id;
  for (const auto& k : ring) {
    v.keys.push_back({k.id, FormatRfc3339(k.created_at),
                      k.retire_at ? std::optional<std::string>(FormatRfc3339(*k.retire_at))
                                  : std::nullopt});
  }
  return v;
}

absl::Status BadRing(const std::string& path, std::string_view why) {
  return absl::FailedPreconditionError(fmt::format(
      "attach keys: {} is not a valid key ring: {} (restore it from a backup; removing it "
      "invalidates the attach tokens its keys signed)",
      path, why));
}

std::optional<Clock::time_point> ParseTime(const nlohmann::json& j) {
  if (!j.is_string()) return std::nullopt;
  return ParseRfc3339(j.get<std::string>());
}

absl::StatusOr<std::vector<AttachTokens::Key>> ParseRing(const std::string& path,
                                                         const std::string& text) {
  auto parsed = ParseUntrustedJson(text);
  if (!parsed.ok()) return BadRing(path, "not valid JSON");
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("keys") || !j["keys"].is_array() || j["keys"].empty()) {
    return BadRing(path, "no \"keys\" array with at least one key");
  }
  const nlohmann::json& keys = j["keys"];
  std::vector<AttachTokens::Key> ring;
  std::set<std::string> ids;
  for (size_t i = 0; i < keys.size(); ++i) {
    const nlohmann::json& k = keys[i];
    auto why = [&](std::string_view what) {
      return BadRing(path, fmt::format("keys[{}]: {}", i, what));
    };
    if (!k.is_object()) return why("not an object");
    if (!k.contains("id") || !k["id"].is_string()) return why("no \"id\" string");
    if (!k.contains("key_b64") || !k["key_b64"].is_string()) return why("no \"key_b64\" string");
    auto secret = Base64Decode(k["key_b64"].get<std::string>());
    if (!secret || secret->size() < kMinSecretBytes) {
      return why(fmt::format("\"key_b64\" is not base64 of at least {} bytes", kMinSecretBytes));
    }
    std::string id = k["id"].get<std::string>();
    if (id != AttachTokens::KeyId(*secret)) return why("\"id\" is not the id of its key");
    if (!ids.insert(id).second) return why(fmt::format("id {} appears twice", id));
    auto created = k.contains("created_at") ? ParseTime(k["created_at"]) : std::nullopt;
    if (!created) return why("\"created_at\" is not an RFC 3339 time");
    std::optional<Clock::time_point> retire;
    if (k.contains("retire_at") && !k["retire_at"].is_null()) {
      retire = ParseTime(k["retire_at"]);
      if (!retire) return why("\"retire_at\" is neither null nor an RFC 3339 time");
    }
    // Rotate retires every key but the newest, which signs: anything else is not its work.
    bool last = i + 1 == keys.size();
    if (last && retire) return why("the newest key signs and cannot have a \"retire_at\"");
    if (!last && !retire) return why("only the newest key may have no \"retire_at\"");
    ring.push_back({std::move(id), std::move(*secret), *created, retire});
  }
  return ring;
}

// Only for legacy tokens, which do not name their key: tried against every live key.
const AttachTokens::Key* FindLegacySigner(const std::vector<AttachTokens::Key>& ring,
                                          std::string_view body, std::string_view sig,
                                          Clock::time_point now) {
  const AttachTokens::Key* found = nullptr;
  for (const auto& k : ring) {
    if (Usable(k, now) && ConstantTimeEquals(sig, HmacSha256(k.secret, body))) found = &k;
  }
  return found;
}
}  // namespace

bool LooksLikeAttachToken(std::string_view token) {
  return token.substr(0, kPrefixV2.size()) == kPrefixV2 ||
         token.substr(0, kPrefixV1.size()) == kPrefixV1;
}

nlohmann::json AttachKeysView::ToJson() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& k : keys) {
    list.push_back({{"id", k.id},
                    {"created_at", k.created_at},
                    {"retire_at", k.retire_at ? nlohmann::json(*k.retire_at) : nullptr}});
  }
  return {{"signing_key_id", signing_key_id}, {"keys", std::move(list)}};
}

std::string AttachTokens::KeyId(std::string_view secret) { return Sha256Hex(secret).substr(0, 8); }

AttachTokens::Key AttachTokens::MakeKey(std::string secret, Clock::time_point created_at) {
  std::string id = KeyId(secret);
  return {std::move(id), std::move(secret), ToSeconds(created_at), std::nullopt};
}

absl::StatusOr<std::vector<AttachTokens::Key>> AttachTokens::LoadRing(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        fmt::format("attach keys: {}", std::string(text.status().message())));
  }
  return ParseRing(path, *text);
}

absl::Status AttachTokens::SaveRing(const std::string& path, const std::vector<Key>& keys) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& k : keys) {
    list.push_back({{"id", k.id},
                    {"key_b64", Base64Encode(k.secret)},
                    {"created_at", FormatRfc3339(k.created_at)},
                    {"retire_at", k.retire_at ? nlohmann::json(FormatRfc3339(*k.retire_at))
                                              : nlohmann::json(nullptr)}});
  }
  const std::string data = nlohmann::json{{"keys", std::move(list)}}.dump(2) + "\n";
  const std::string tmp = path + ".tmp";
  // A leftover from a write that died keeps its own mode under O_TRUNC: start afresh.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, fmt::format("attach keys: unlink({})", tmp));
  }
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return ErrnoStatus(errno, fmt::format("attach keys: open({})", tmp));
  auto fail = [&](const char* call) {
    absl::Status s = ErrnoStatus(errno, fmt::format("attach keys: {}({})", call, tmp));
    ::unlink(tmp.c_str());
    return s;
  };
  for (size_t off = 0; off < data.size();) {
    ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write");
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync");
  if (fd.Close() != 0) return fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  // The rename itself survives a crash only once the directory is on disk too. Failing here
  // leaves the new ring in the file, not yet durable: the caller reports the error and keeps
  // its ring, which is no worse than a crash just after the rename.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd || ::fsync(dfd.get()) != 0) {
    return ErrnoStatus(errno, fmt::format("attach keys: fsync({})", dir));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<AttachTokens::Key>> AttachTokens::LoadOrCreateRing(
    const std::string& state_dir, Clock::time_point now) {
  const std::string path = (std::filesystem::path(state_dir) / kRingFile).string();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return LoadRing(path);
  if (errno != ENOENT) return ErrnoStatus(errno, fmt::format("attach keys: stat({})", path));
  // First start with a ring: the single key sbxd used before, if any, becomes its first member.
  const std::string legacy = (std::filesystem::path(state_dir) / kLegacyKeyFile).string();
  std::string secret;
  if (::stat(legacy.c_str(), &st) == 0) {
    auto text = ReadFileToString(legacy);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          fmt::format("attach keys: {}", std::string(text.status().message())));
    }
    secret = std::move(*text);
    while (!secret.empty() &&
           (secret.back() == '\n' || secret.back() == '\r' || secret.back() == ' ')) {
      secret.pop_back();
    }
  } else if (errno != ENOENT) {
    return ErrnoStatus(errno, fmt::format("attach keys: stat({})", legacy));
  }
  if (secret.empty()) secret = NewSecret(32);
  std::vector<Key> ring{MakeKey(std::move(secret), now)};
  SBX_RETURN_IF_ERROR(SaveRing(path, ring));
  return ring;
}

AttachTokens::AttachTokens(std::string key, std::chrono::seconds ttl)
    : AttachTokens(std::vector<Key>{MakeKey(std::move(key), Clock::now())}, "", ttl) {}

AttachTokens::AttachTokens(std::vector<Key> keys, std::string file, std::chrono::seconds ttl)
    : file_(std::move(file)), ttl_s_(ttl.count()) {
  // Only a test's ServiceOptions come without keys (sbxd loads its ring or does not start).
  if (keys.empty()) keys.push_back(MakeKey(NewSecret(32), Clock::now()));
  ring_ = std::make_shared<const Ring>(std::move(keys));
}

void AttachTokens::SetTtl(std::chrono::seconds ttl) {
  ttl_s_.store(ttl.count(), std::memory_order_relaxed);
}

std::chrono::seconds AttachTokens::ttl() const {
  return std::chrono::seconds(ttl_s_.load(std::memory_order_relaxed));
}

std::shared_ptr<const AttachTokens::Ring> AttachTokens::Snapshot() const {
  std::lock_guard lock(mu_);
  return ring_;
}

AttachTokens::Minted AttachTokens::Mint(const std::string& session_id,
                                        const std::string& tenant_id) const {
  return MintAt(session_id, tenant_id, Clock::now());
}

AttachTokens::Minted AttachTokens::MintAt(const std::string& session_id,
                                          const std::string& tenant_id,
                                          Clock::time_point now) const {
  const auto ring = Snapshot();
  const Key& signer = ring->back();
  auto exp = now + ttl();
  int64_t exp_unix =
      std::chrono::duration_cast<std::chrono::seconds>(exp.time_since_epoch()).count();
  nlohmann::json claims = {{"sid", session_id}, {"ten", tenant_id}, {"exp", exp_unix}};
  std::string body =
      fmt::format("{}{}.{}", kPrefixV2, signer.id, Base64UrlEncode(claims.dump()));
  std::string token = body + "." + Base64UrlEncode(HmacSha256(signer.secret, body));
  return {token, FormatRfc3339(Clock::time_point(std::chrono::seconds(exp_unix)))};
}

absl::StatusOr<AttachTokens::Claims> AttachTokens::Verify(const std::string& token) const {
  return VerifyAt(token, Clock::now());
}

absl::StatusOr<AttachTokens::Claims> AttachTokens::VerifyAt(const std::string& token,
                                                            Clock::time_point now) const {
  if (token.size() > kMaxTokenBytes) return Bad("malformed");
  const std::string_view t(token);
  const bool v2 = t.substr(0, kPrefixV2.size()) == kPrefixV2;
  if (!v2 && t.substr(0, kPrefixV1.size()) != kPrefixV1) return Bad("malformed");
  // v2: "sat2." kid "." claims "." sig; v1: "sat1." claims "." sig.
  const size_t claims_at =
      v2 ? t.find('.', kPrefixV2.size()) + 1 : kPrefixV1.size();  // npos + 1 == 0
  const size_t dot = t.rfind('.');
  if (claims_at == 0 || dot == std::string_view::npos || dot < claims_at) {
    return Bad("malformed");
  }
  const std::string_view body = t.substr(0, dot);
  auto sig = Base64UrlDecode(t.substr(dot + 1));
  if (!sig) return Bad("invalid");
  const auto ring = Snapshot();
  if (v2) {
    const std::string_view kid = t.substr(kPrefixV2.size(), claims_at - 1 - kPrefixV2.size());
    const Key* key = nullptr;
    for (const auto& k : *ring) {
      if (k.id == kid) key = &k;
    }
    if (key == nullptr || !Usable(*key, now) ||
        !ConstantTimeEquals(*sig, HmacSha256(key->secret, body))) {
      return Bad("invalid");
    }
  } else if (FindLegacySigner(*ring, body, *sig, now) == nullptr) {
    return Bad("invalid");
  }
  auto raw = Base64UrlDecode(body.substr(claims_at));
  if (!raw) return Bad("malformed");
  // Only text sbxd signed gets here; parsed like any other all the same.
  auto parsed = ParseUntrustedJson(*raw);
  if (!parsed.ok()) return Bad("malformed");
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("sid") || !j["sid"].is_string() ||
      !j.contains("ten") || !j["ten"].is_string() || !j.contains("exp") ||
      !j["exp"].is_number_integer()) {
    return Bad("malformed");
  }
  Claims c{j["sid"].get<std::string>(), j["ten"].get<std::string>(), j["exp"].get<int64_t>()};
  int64_t now_unix =
      std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  if (now_unix >= c.expires_unix) return Bad("expired");
  return c;
}

absl::StatusOr<AttachKeysView> AttachTokens::Rotate(Clock::time_point now) {
  std::lock_guard rotating(rotate_mu_);
  const auto cur = Snapshot();
  Ring next;
  for (const auto& k : *cur) {
    if (Usable(k, now)) next.push_back(k);
  }
  // The signing key has no retire time (LoadRing checks), so it is still there.
  if (next.empty() || next.back().id != cur->back().id) {
    return absl::InternalError("attach keys: the signing key has a retire time");
  }
  next.back().retire_at = ToSeconds(now) + ttl();
  if (next.size() + 1 > kMaxKeys) {
    Clock::time_point first = *next.front().retire_at;
    for (const auto& k : next) first = std::min(first, *k.retire_at);
    return ApiError(absl::StatusCode::kFailedPrecondition, "attach_key_ring_full",
                    fmt::format("the attach key ring already holds {} keys that still verify; "
                                "the first retires at {}",
                                next.size(), FormatRfc3339(first)));
  }
  // 32 bits of id: a clash with a handful of keys is all but impossible, and cheap to redraw.
  Key fresh = MakeKey(NewSecret(32), now);
  while (std::any_of(next.begin(), next.end(), [&](const Key& k) { return k.id == fresh.id; })) {
    fresh = MakeKey(NewSecret(32), now);
  }
  next.push_back(std::move(fresh));
  if (!file_.empty()) SBX_RETURN_IF_ERROR(SaveRing(file_, next));
  auto published = std::make_shared<const Ring>(std::move(next));
  {
    std::lock_guard lock(mu_);
    ring_ = published;
  }
  return ViewOf(*published);
}

AttachKeysView AttachTokens::Keys() const { return ViewOf(*Snapshot()); }

}  // namespace sbx::service

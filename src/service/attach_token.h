// Attach tokens authorize one session's data-plane routes without a store lookup: an
// HMAC-SHA256 over {session, tenant, expiry}. Management tokens never enter a sandbox; attach
// tokens are what a client may hand to a less trusted component that only needs the stream.
//
// The keys form a ring kept in STATE_DIR/attach-keys.json, so tokens survive an sbxd restart
// and a key can be rotated without cutting off the tokens already out: the newest key signs,
// and every key in the ring verifies until its retire time. A token names its key:
//
//   sat2.<kid>.<claims, base64url JSON>.<HMAC-SHA256(key, "sat2.<kid>.<claims>"), base64url>
//
// kid is the first 8 hex digits of SHA-256(key). Tokens minted before the ring existed
// ("sat1.<claims>.<sig>", no kid) are tried against every key in the ring: the old
// STATE_DIR/attach-key becomes its first member, so they verify until they expire or that
// key retires.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace sbx::service {

// Whether `token` has an attach token's shape (either format), as opposed to a management
// token: what the API looks at to choose which of the two checks a bearer token gets.
bool LooksLikeAttachToken(std::string_view token);

// The ring as a client sees it: no secrets. ToJson() is the body of
// GET/POST /v1/admin/attach-keys[:rotate]:
//   {"signing_key_id":"…","keys":[{"id":"…","created_at":"…","retire_at":"…"|null}]}
struct AttachKeysView {
  struct Key {
    std::string id;
    std::string created_at;                // RFC 3339
    std::optional<std::string> retire_at;  // RFC 3339; none for the signing key
  };
  std::string signing_key_id;
  std::vector<Key> keys;  // oldest first; the last one signs
  nlohmann::json ToJson() const;
};

class AttachTokens {
 public:
  using Clock = std::chrono::system_clock;
  struct Key {
    std::string id;      // the kid: KeyId(secret)
    std::string secret;  // the HMAC key, as bytes
    Clock::time_point created_at;
    // Tokens it signed stop verifying then: set when a newer key takes over signing.
    std::optional<Clock::time_point> retire_at;
  };
  // The kid of a key: the first 8 lowercase hex digits of SHA-256(secret).
  static std::string KeyId(std::string_view secret);
  static Key MakeKey(std::string secret, Clock::time_point created_at);

  // The file the ring lives in, in a state dir, and the single key it replaced.
  static constexpr char kRingFile[] = "attach-keys.json";
  static constexpr char kLegacyKeyFile[] = "attach-key";
  // The ring in `state_dir`/attach-keys.json. When that file does not exist it is created
  // (mode 0600) with one key: the secret in `state_dir`/attach-key when there is one, so
  // tokens minted before the upgrade keep verifying, else a new random one. A file that
  // cannot be read or parsed is an error naming it: keys are never replaced silently.
  static absl::StatusOr<std::vector<Key>> LoadOrCreateRing(const std::string& state_dir,
                                                           Clock::time_point now);
  // The ring in `path`; an error naming the file when it cannot be read or is not a valid ring.
  static absl::StatusOr<std::vector<Key>> LoadRing(const std::string& path);
  // Writes the ring to `path` atomically (a temporary file, fsync, rename), mode 0600.
  static absl::Status SaveRing(const std::string& path, const std::vector<Key>& keys);

  // One key, kept in memory only (tests, fuzz targets).
  AttachTokens(std::string key, std::chrono::seconds ttl);
  // `keys`: oldest first, the last one signs (LoadRing's order); none: one random key.
  // `file`: where Rotate keeps the ring; empty for a ring kept in memory only.
  AttachTokens(std::vector<Key> keys, std::string file, std::chrono::seconds ttl);

  // For tokens minted from now on (sbxd's configuration reload); tokens already out keep the
  // expiry they carry.
  void SetTtl(std::chrono::seconds ttl);
  std::chrono::seconds ttl() const;

  struct Minted {
    std::string token;
    std::string expires_at;  // RFC 3339
  };
  struct Claims {
    std::string session_id;
    std::string tenant_id;
    int64_t expires_unix = 0;
  };

  Minted Mint(const std::string& session_id, const std::string& tenant_id) const;
  Minted MintAt(const std::string& session_id, const std::string& tenant_id,
                Clock::time_point now) const;
  // Unauthenticated "attach token is malformed|invalid|expired": malformed for a token that is
  // not one (shape, size, claims), invalid for a bad signature or a key that is not in the
  // ring or has retired, expired past its expiry.
  absl::StatusOr<Claims> Verify(const std::string& token) const;
  absl::StatusOr<Claims> VerifyAt(const std::string& token, Clock::time_point now) const;

  // Adds a new signing key. The previous signing key retires at now + ttl(): no token it
  // signed carries a later expiry, unless the TTL was longer when it was minted (those stop
  // verifying at the retire time). Keys whose retire time has passed leave the ring here and
  // only here (Verify just ignores them meanwhile). The ring is written to the file before it
  // is used: when that fails, the ring in use does not change, nor does the file (unless only
  // the last step failed, the fsync of its directory after the rename). Refused
  // (FailedPrecondition "attach_key_ring_full") when more than kMaxKeys keys would be live.
  static constexpr size_t kMaxKeys = 8;
  using RotateResult = AttachKeysView;
  absl::StatusOr<RotateResult> Rotate(Clock::time_point now);
  AttachKeysView Keys() const;

 private:
  using Ring = std::vector<Key>;  // immutable once published
  std::shared_ptr<const Ring> Snapshot() const;

  const std::string file_;
  std::atomic<int64_t> ttl_s_;
  mutable std::mutex mu_;  // guards ring_ (the pointer, not the keys: a ring never changes)
  std::shared_ptr<const Ring> ring_;
  std::mutex rotate_mu_;  // one rotation, and one write of the file, at a time
};

}  // namespace sbx::service

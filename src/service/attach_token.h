// Attach tokens authorize one session's data-plane routes without a store lookup: an
// HMAC-SHA256 over {session, tenant, expiry}, keyed by a secret kept in the state dir so tokens
// survive an sbxd restart. Management tokens never enter a sandbox; attach tokens are what a
// client may hand to a less trusted component that only needs the stream.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace sbx::service {

class AttachTokens {
 public:
  AttachTokens(std::string key, std::chrono::seconds ttl)
      : key_(std::move(key)), ttl_s_(ttl.count()) {}

  // For tokens minted from now on (sbxd's configuration reload); tokens already out keep the
  // expiry they carry.
  void SetTtl(std::chrono::seconds ttl) { ttl_s_.store(ttl.count(), std::memory_order_relaxed); }
  std::chrono::seconds ttl() const {
    return std::chrono::seconds(ttl_s_.load(std::memory_order_relaxed));
  }

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
                std::chrono::system_clock::time_point now) const;
  // Unauthenticated on a bad signature, malformed token or expiry.
  absl::StatusOr<Claims> Verify(const std::string& token) const;
  absl::StatusOr<Claims> VerifyAt(const std::string& token,
                                  std::chrono::system_clock::time_point now) const;

 private:
  std::string key_;
  std::atomic<int64_t> ttl_s_;
};

}  // namespace sbx::service

// Per-key request rate limits (issue 18, tenancy): one token bucket per management token id,
// in memory. A restart forgets the buckets, which only means every client starts with a full
// burst again.
//
// Memory is bounded by max_keys. At the bound, a new key evicts a bucket that is full by now if
// one is among the least recently used few (a full bucket behaves exactly like a fresh one, so
// forgetting it loses nothing), else the least recently used bucket: its client then gets a
// full burst early, the one inaccuracy the bound costs. Keys are expected to be short (token
// ids, 24 bytes): memory is about max_keys * (key + ~150 bytes).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sbx::service {

class RateLimiter {
 public:
  explicit RateLimiter(size_t max_keys = 100000);
  RateLimiter(const RateLimiter&) = delete;
  RateLimiter& operator=(const RateLimiter&) = delete;

  struct Decision {
    bool allowed = true;
    uint64_t limit = 0;          // the burst; 0 when unlimited
    uint64_t remaining = 0;      // whole tokens left after this request
    double reset_s = 0;          // until the bucket is full again
    double retry_after_s = 0;    // when denied: until one token is there; else 0
  };

  // Takes one token from `key`'s bucket if it has one. The bucket holds at most `burst` tokens
  // (a burst of 0 counts as 1: a limit nothing can ever pass is a configuration error, not a
  // rate) and gains `rate_per_s` per second; a key seen for the first time starts full.
  // rate_per_s <= 0 (or NaN) means unlimited: allowed, limit 0, and no bucket is kept. The
  // rate and burst may change between calls (a configuration reload): the bucket keeps its
  // tokens, cut to the new burst. `now` comes from the caller so tests can drive the clock; a
  // `now` older than the bucket's last update counts as no time passed.
  //
  // Thread-safe. One mutex; held for a hash lookup and a few arithmetic operations (a new key
  // also allocates its bucket under it).
  Decision Take(std::string_view key, double rate_per_s, uint64_t burst,
                std::chrono::steady_clock::time_point now);

  size_t size() const;  // buckets held, at most max_keys
  size_t max_keys() const { return max_keys_; }

 private:
  struct Bucket {
    std::string key;
    double tokens = 0;
    double rate_per_s = 0;
    double burst = 0;
    std::chrono::steady_clock::time_point updated;
  };
  using List = std::list<Bucket>;  // most recently used first

  void EvictOneLocked(std::chrono::steady_clock::time_point now);

  const size_t max_keys_;
  mutable std::mutex mu_;
  List lru_;
  // Views into the Bucket::key of lru_'s nodes, which never move.
  std::unordered_map<std::string_view, List::iterator> index_;
};

// Seconds for a Retry-After or RateLimit-Reset header: rounded up (so a client that waits
// that long finds what it waited for), hence at least 1 for anything above 0; 0 for anything
// else; capped at a day so that a pathological rate cannot overflow.
uint64_t RetryAfterSeconds(double seconds);

// The headers of draft-ietf-httpapi-ratelimit-headers (the three-field form):
// RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset (integer seconds, rounded up), and
// Retry-After when the request was denied. None for an unlimited decision: "RateLimit-Limit:
// 0" would read as "nothing allowed".
std::vector<std::pair<std::string, std::string>> RateLimitHeaders(
    const RateLimiter::Decision& d);

}  // namespace sbx::service

#include "service/rate_limit.h"

#include <algorithm>
#include <cmath>

namespace sbx::service {
namespace {

// How many of the least recently used buckets eviction looks at for a full one: enough to
// find one in the common case (idle keys sit at the tail), few enough to keep the lock short.
constexpr int kEvictScan = 8;

// Refill by elapsed time is floating point: 10 steps of 0.1 s at 10/s may come to 0.9999999
// tokens, which must still pay for a request.
constexpr double kEpsilon = 1e-9;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

RateLimiter::RateLimiter(size_t max_keys) : max_keys_(std::max<size_t>(max_keys, 1)) {}

size_t RateLimiter::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

void RateLimiter::EvictOneLocked(std::chrono::steady_clock::time_point now) {
  auto victim = std::prev(lru_.end());
  auto it = victim;
  for (int i = 0; i < kEvictScan; ++i) {
    const double elapsed = now > it->updated ? Seconds(now - it->updated) : 0;
    if (it->tokens + elapsed * it->rate_per_s + kEpsilon >= it->burst) {
      victim = it;
      break;
    }
    if (it == lru_.begin()) break;
    --it;
  }
  index_.erase(std::string_view(victim->key));  // before the key it views goes
  lru_.erase(victim);
}

RateLimiter::Decision RateLimiter::Take(std::string_view key, double rate_per_s, uint64_t burst,
                                        std::chrono::steady_clock::time_point now) {
  Decision d;
  // NaN fails the comparison too: unlimited, like every rate that is not positive.
  if (!(rate_per_s > 0)) return d;
  d.limit = std::max<uint64_t>(burst, 1);
  const double cap = static_cast<double>(d.limit);

  std::lock_guard<std::mutex> lock(mu_);
  Bucket* b;
  auto found = index_.find(key);
  if (found == index_.end()) {
    if (lru_.size() >= max_keys_) EvictOneLocked(now);
    lru_.emplace_front();
    b = &lru_.front();
    b->key = std::string(key);
    b->tokens = cap;
    b->updated = now;
    index_.emplace(std::string_view(b->key), lru_.begin());
  } else {
    lru_.splice(lru_.begin(), lru_, found->second);  // the iterator stays valid
    b = &*found->second;
    if (now > b->updated) {
      b->tokens += Seconds(now - b->updated) * rate_per_s;
      b->updated = now;
    }
  }
  b->rate_per_s = rate_per_s;
  b->burst = cap;
  b->tokens = std::min(b->tokens, cap);

  if (b->tokens + kEpsilon >= 1) {
    b->tokens = std::max(b->tokens - 1, 0.0);
  } else {
    d.allowed = false;
    d.retry_after_s = (1 - b->tokens) / rate_per_s;
  }
  d.remaining = static_cast<uint64_t>(std::floor(b->tokens + kEpsilon));
  d.reset_s = std::max((cap - b->tokens) / rate_per_s, 0.0);
  return d;
}

uint64_t RetryAfterSeconds(double seconds) {
  constexpr double kDay = 86400;
  if (!(seconds > 0)) return 0;
  if (seconds >= kDay) return static_cast<uint64_t>(kDay);
  // Float noise must not turn an exact 1 s into 2, and anything above 0 is at least 1 s:
  // "Retry-After: 0" would invite a busy loop.
  return static_cast<uint64_t>(std::max(std::ceil(seconds - kEpsilon), 1.0));
}

std::vector<std::pair<std::string, std::string>> RateLimitHeaders(
    const RateLimiter::Decision& d) {
  std::vector<std::pair<std::string, std::string>> out;
  if (d.limit == 0) return out;
  out.reserve(4);
  out.emplace_back("RateLimit-Limit", std::to_string(d.limit));
  out.emplace_back("RateLimit-Remaining", std::to_string(d.remaining));
  out.emplace_back("RateLimit-Reset", std::to_string(RetryAfterSeconds(d.reset_s)));
  if (!d.allowed) {
    out.emplace_back("Retry-After", std::to_string(RetryAfterSeconds(d.retry_after_s)));
  }
  return out;
}

}  // namespace sbx::service

// Nft: libnftables in-process (never the `nft` command), for sbx's own table (nft_ruleset.h).
//
// Thread safety: all methods are safe to call concurrently (one context behind a mutex: the
// kernel serialises nftables transactions anyway).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct nft_ctx;

namespace sbx::net {

// Packets refused, per reason ("spoofed", "private", ...).
using DenialCounts = std::map<std::string, uint64_t>;

class Nft {
 public:
  static absl::StatusOr<std::unique_ptr<Nft>> Open();
  ~Nft();

  // Runs a ruleset text as one transaction: all of it or nothing. `what` names the step.
  absl::Status Run(const std::string& commands, const std::string& what);
  // The denial counters of every sandbox veth, by veth name: one read of each deny_ set.
  absl::StatusOr<std::map<std::string, DenialCounts>> ReadAllCounters();
  // The veths in the map `profile_of`, with the chain each jumps to.
  absl::StatusOr<std::map<std::string, std::string>> MappedVeths();
  // The chains of sbx's table that belong to one narrowed sandbox (named after its id).
  absl::StatusOr<std::set<std::string>> SandboxChains();

 private:
  explicit Nft(nft_ctx* ctx) : ctx_(ctx) {}
  absl::StatusOr<std::string> RunJson(const std::string& command, const std::string& what);

  std::mutex mu_;
  nft_ctx* ctx_;
};

// The elements of a `list set` JSON with their counters: veth -> packets (exposed for tests).
absl::StatusOr<std::map<std::string, uint64_t>> ParseSetCountersJson(const std::string& json);

}  // namespace sbx::net

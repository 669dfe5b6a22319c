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
  // The denial counters of every sandbox in sbx's table, by sandbox id: one netlink dump.
  absl::StatusOr<std::map<std::string, DenialCounts>> ReadAllCounters();
  // The sandbox chains in sbx's table (their names are the sandbox ids), and which veth each
  // is mapped from: what the start-up sweep compares with the sandboxes it knows.
  absl::StatusOr<std::map<std::string, std::string>> ListSandboxChains();

 private:
  Nft(nft_ctx* ctx) : ctx_(ctx) {}
  absl::StatusOr<std::string> RunJson(const std::string& command, const std::string& what);

  std::mutex mu_;
  nft_ctx* ctx_;
};

// Parses the JSON of `list counters table inet sbx` (exposed for tests).
absl::StatusOr<std::map<std::string, DenialCounts>> ParseCountersJson(const std::string& json);

}  // namespace sbx::net

#include "net/nft.h"

#include <dirent.h>
#include <fcntl.h>
#include <nftables/libnftables.h>
#include <sys/socket.h>

#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "net/nft_ruleset.h"

namespace sbx::net {
namespace {

using Json = nlohmann::json;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() > 2000) s.resize(2000);
  return s;
}

// The array under "nftables" of libnftables' JSON output.
absl::StatusOr<Json> Items(const std::string& text, const std::string& what) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("nftables") || !j["nftables"].is_array()) {
    return absl::InternalError(fmt::format("{}: output is not nftables JSON", what));
  }
  return std::move(j["nftables"]);
}

// libnftables 1.0.6 opens its netlink socket in nft_ctx_new without SOCK_CLOEXEC and keeps it
// for the context's life (sbxd's), where every program sbxd starts could inherit it. It gives
// no access to the descriptor, so each netlink socket that lacks the flag is given it: sbxd
// makes its own with SOCK_CLOEXEC (tools/check_house.py), so no other one is touched.
void MarkNetlinkSocketsCloseOnExec() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd < 3 || fd == ::dirfd(d)) continue;
    const int flags = ::fcntl(fd, F_GETFD);
    int domain = 0;
    socklen_t len = sizeof(domain);
    if (flags < 0 || (flags & FD_CLOEXEC) != 0 ||
        ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_NETLINK) {
      continue;
    }
    ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
  ::closedir(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Nft>> Nft::Open() {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return absl::InternalError("nftables: nft_ctx_new failed");
  MarkNetlinkSocketsCloseOnExec();
  if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0) {
    nft_ctx_free(ctx);
    return absl::InternalError("nftables: cannot buffer libnftables output");
  }
  return std::unique_ptr<Nft>(new Nft(ctx));
}

Nft::~Nft() { nft_ctx_free(ctx_); }

absl::Status Nft::Run(const std::string& commands, const std::string& what) {
  std::lock_guard lock(mu_);
  nft_ctx_output_set_flags(ctx_, 0);
  if (nft_run_cmd_from_buffer(ctx_, commands.c_str()) != 0) {
    return absl::InternalError(fmt::format("{}: nftables transaction refused: {}", what,
                                           Trim(nft_ctx_get_error_buffer(ctx_))));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Nft::RunJson(const std::string& command, const std::string& what) {
  std::lock_guard lock(mu_);
  nft_ctx_output_set_flags(ctx_, NFT_CTX_OUTPUT_JSON);
  int rc = nft_run_cmd_from_buffer(ctx_, command.c_str());
  nft_ctx_output_set_flags(ctx_, 0);
  if (rc != 0) {
    return absl::InternalError(
        fmt::format("{}: {}: {}", what, command, Trim(nft_ctx_get_error_buffer(ctx_))));
  }
  return std::string(nft_ctx_get_output_buffer(ctx_));
}

// nlohmann::json throws on a type it did not expect: every parse below checks types first, and
// the try blocks turn a surprise into a Status.
absl::StatusOr<std::map<std::string, uint64_t>> ParseSetCountersJson(const std::string& text) try {
  auto items = Items(text, "denial counters");
  if (!items.ok()) return items.status();
  std::map<std::string, uint64_t> out;
  for (const auto& item : *items) {
    if (!item.is_object() || !item.contains("set") || !item["set"].is_object()) continue;
    const Json& set = item["set"];
    if (!set.contains("elem") || !set["elem"].is_array()) continue;
    for (const auto& e : set["elem"]) {
      // {"elem": {"val": "sbxv0", "counter": {"packets": 3, "bytes": 180}}}
      if (!e.is_object() || !e.contains("elem") || !e["elem"].is_object()) continue;
      const Json& el = e["elem"];
      if (!el.contains("val") || !el["val"].is_string() || !el.contains("counter") ||
          !el["counter"].is_object() || !el["counter"].contains("packets") ||
          !el["counter"]["packets"].is_number_unsigned()) {
        continue;
      }
      out[el["val"].get<std::string>()] = el["counter"]["packets"].get<uint64_t>();
    }
  }
  return out;
} catch (const std::exception& e) {
  return absl::InternalError(fmt::format("denial counters: unexpected nftables JSON: {}", e.what()));
}

absl::StatusOr<std::map<std::string, DenialCounts>> Nft::ReadAllCounters() {
  std::map<std::string, DenialCounts> out;
  for (const auto& reason : DenialReasons()) {
    auto text = RunJson(fmt::format("list set inet {} deny_{}", kTable, reason), "read denial counters");
    if (!text.ok()) return text.status();
    auto counts = ParseSetCountersJson(*text);
    if (!counts.ok()) return counts.status();
    for (const auto& [veth, packets] : *counts) out[veth][reason] = packets;
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> Nft::MappedVeths() try {
  auto text = RunJson(fmt::format("list map inet {} profile_of", kTable), "list sandbox veths");
  if (!text.ok()) return text.status();
  auto items = Items(*text, "list sandbox veths");
  if (!items.ok()) return items.status();
  std::map<std::string, std::string> out;
  for (const auto& item : *items) {
    if (!item.is_object() || !item.contains("map") || !item["map"].is_object() ||
        !item["map"].contains("elem") || !item["map"]["elem"].is_array()) {
      continue;
    }
    for (const auto& e : item["map"]["elem"]) {
      // ["sbxv0", {"jump": {"target": "p_open"}}]
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_object()) continue;
      const Json& v = e[1];
      if (!v.contains("jump") || !v["jump"].is_object() || !v["jump"].contains("target") ||
          !v["jump"]["target"].is_string()) {
        continue;
      }
      out[e[0].get<std::string>()] = v["jump"]["target"].get<std::string>();
    }
  }
  return out;
} catch (const std::exception& e) {
  return absl::InternalError(fmt::format("list sandbox veths: unexpected nftables JSON: {}", e.what()));
}

absl::StatusOr<std::set<std::string>> Nft::SandboxChains() try {
  auto text = RunJson("list chains inet", "list sandbox chains");
  if (!text.ok()) return text.status();
  auto items = Items(*text, "list sandbox chains");
  if (!items.ok()) return items.status();
  std::set<std::string> out;
  for (const auto& item : *items) {
    if (!item.is_object() || !item.contains("chain") || !item["chain"].is_object()) continue;
    const Json& c = item["chain"];
    if (!c.contains("table") || c["table"] != kTable || !c.contains("name") ||
        !c["name"].is_string() || c.contains("hook")) {
      continue;
    }
    std::string name = c["name"].get<std::string>();
    if (name == "egress" || name.rfind("p_", 0) == 0) continue;
    out.insert(name);
  }
  return out;
} catch (const std::exception& e) {
  return absl::InternalError(fmt::format("list sandbox chains: unexpected nftables JSON: {}", e.what()));
}

}  // namespace sbx::net

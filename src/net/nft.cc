#include "net/nft.h"

#include <nftables/libnftables.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "net/nft_ruleset.h"

namespace sbx::net {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Nft>> Nft::Open() {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return absl::InternalError("nftables: nft_ctx_new failed");
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
    std::string err = Trim(nft_ctx_get_error_buffer(ctx_));
    if (err.size() > 2000) err.resize(2000);
    return absl::InternalError(fmt::format("{}: nftables transaction refused: {}", what, err));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Nft::RunJson(const std::string& command, const std::string& what) {
  std::lock_guard lock(mu_);
  nft_ctx_output_set_flags(ctx_, NFT_CTX_OUTPUT_JSON);
  int rc = nft_run_cmd_from_buffer(ctx_, command.c_str());
  nft_ctx_output_set_flags(ctx_, 0);
  if (rc != 0) {
    std::string err = Trim(nft_ctx_get_error_buffer(ctx_));
    if (err.size() > 2000) err.resize(2000);
    return absl::InternalError(fmt::format("{}: {}: {}", what, command, err));
  }
  return std::string(nft_ctx_get_output_buffer(ctx_));
}

absl::StatusOr<std::map<std::string, DenialCounts>> ParseCountersJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("nftables") || !j["nftables"].is_array()) {
    return absl::InternalError("nftables counters: output is not nftables JSON");
  }
  std::map<std::string, DenialCounts> out;
  for (const auto& item : j["nftables"]) {
    if (!item.is_object() || !item.contains("counter")) continue;
    const auto& c = item["counter"];
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
        !c.contains("packets") || !c["packets"].is_number_unsigned()) {
      continue;
    }
    const std::string& name = c["name"].get_ref<const std::string&>();
    size_t sep = name.find("__");
    if (sep == std::string::npos) continue;
    out[name.substr(0, sep)][name.substr(sep + 2)] = c["packets"].get<uint64_t>();
  }
  return out;
}

absl::StatusOr<std::map<std::string, DenialCounts>> Nft::ReadAllCounters() {
  auto text = RunJson(fmt::format("list counters table inet {}", kTable), "read denial counters");
  if (!text.ok()) return text.status();
  return ParseCountersJson(*text);
}

absl::StatusOr<std::map<std::string, std::string>> Nft::ListSandboxChains() {
  std::map<std::string, std::string> out;
  auto chains = RunJson("list chains inet", "list sandbox chains");
  if (!chains.ok()) return chains.status();
  nlohmann::json j = nlohmann::json::parse(*chains, nullptr, false);
  if (j.is_discarded() || !j.contains("nftables") || !j["nftables"].is_array()) {
    return absl::InternalError("list sandbox chains: output is not nftables JSON");
  }
  for (const auto& item : j["nftables"]) {
    if (!item.is_object() || !item.contains("chain")) continue;
    const auto& c = item["chain"];
    if (!c.contains("name") || !c["name"].is_string() || c.contains("hook")) continue;
    if (!c.contains("table") || c["table"] != kTable) continue;
    std::string name = c["name"].get<std::string>();
    if (name.size() > 3 && name.compare(name.size() - 3, 3, "_in") == 0) continue;
    out[name] = "";
  }
  auto map = RunJson(fmt::format("list map inet {} from_sandbox", kTable), "list sandbox veths");
  if (!map.ok()) return map.status();
  j = nlohmann::json::parse(*map, nullptr, false);
  if (j.is_discarded() || !j.contains("nftables") || !j["nftables"].is_array()) {
    return absl::InternalError("list sandbox veths: output is not nftables JSON");
  }
  for (const auto& item : j["nftables"]) {
    if (!item.is_object() || !item.contains("map") || !item["map"].contains("elem")) continue;
    for (const auto& e : item["map"]["elem"]) {
      // [ "sbxv0", { "jump": { "target": "sbx_..." } } ]
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_object()) continue;
      const auto& v = e[1];
      if (!v.contains("jump") || !v["jump"].contains("target")) continue;
      out[v["jump"]["target"].get<std::string>()] = e[0].get<std::string>();
    }
  }
  return out;
}

}  // namespace sbx::net

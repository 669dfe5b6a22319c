#include "cli/cli_common.h"

#include <algorithm>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

namespace sbx::cli {

absl::Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      // Not kUnavailable: that would read as a broken stream worth reconnecting for.
      return absl::DataLossError(fmt::format("write to {}: {}",
                                                fd == STDOUT_FILENO ? "stdout" : "stderr",
                                                std::strerror(err)));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void PrintError(std::string_view message) {
  std::string line = fmt::format("sbx: {}\n", message);
  (void)WriteAll(STDERR_FILENO, line);
}

void PrintError(const absl::Status& status) {
  std::string msg = Msg(status);
  if (absl::IsUnauthenticated(status)) msg += " (check SBX_TOKEN or --token)";
  PrintError(msg);
}

void PrintJson(const nlohmann::json& j) {
  std::string out = j.dump(2, ' ', /*ensure_ascii=*/false,
                           nlohmann::json::error_handler_t::replace) + "\n";
  (void)WriteAll(STDOUT_FILENO, out);
}

absl::StatusOr<std::map<std::string, std::string>> ParseKeyValues(
    const std::vector<std::string>& items, std::string_view flag) {
  std::map<std::string, std::string> out;
  for (const std::string& item : items) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          fmt::format("{} {}: expected KEY=VALUE", flag, item));
    }
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

absl::Status CheckId(std::string_view id, std::string_view prefix) {
  bool ok = id.size() > prefix.size() + 1 && id.substr(0, prefix.size()) == prefix &&
            id[prefix.size()] == '_' && id.size() <= 128;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) ok = false;
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\" is not an id of the form {}_…", id, prefix));
  }
  return absl::OkStatus();
}

std::string JsonString(const nlohmann::json& j, std::string_view key) {
  if (!j.is_object()) return "";
  auto it = j.find(std::string(key));
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

absl::StatusOr<nlohmann::json> WaitOperation(
    Client& client, const nlohmann::json& initial, std::chrono::seconds timeout,
    const std::function<void(const nlohmann::json&)>& each) {
  std::string id = JsonString(initial, "id");
  if (id.empty()) return absl::InternalError("sbxd returned an operation without an id");
  if (absl::Status s = CheckId(id, "op"); !s.ok()) {
    return absl::InternalError(fmt::format("sbxd returned a bad operation id: {}", Msg(s)));
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  nlohmann::json op = initial;
  for (;;) {
    if (each) each(op);
    std::string state = JsonString(op, "state");
    if (state == "succeeded") return op;
    if (state == "failed") {
      std::string code = "unknown";
      std::string message = "no error recorded";
      if (op.contains("error") && op["error"].is_object()) {
        if (auto c = JsonString(op["error"], "code"); !c.empty()) code = c;
        if (auto m = JsonString(op["error"], "message"); !m.empty()) message = m;
      }
      // A template operation names its template, a sandbox operation its sandbox.
      std::string what = JsonString(op, "sandbox_id");
      if (what.empty()) what = JsonString(op, "target");
      return absl::AbortedError(fmt::format("{} operation {} for {} failed: {}: {}",
                                            JsonString(op, "kind"), id, what, code, message));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "{} operation {} is still {} after {} s; check it with: sbx op {}",
          JsonString(op, "kind"), id, state.empty() ? "unknown" : state, timeout.count(), id));
    }
    // sbxd holds the request until the operation ends (wait_ms): no polling delay, and short
    // slices keep the overall timeout honest.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto slice = std::clamp<int64_t>(left.count(), 0, each ? 500 : 5000);
    auto next = client.Get(fmt::format("/v1/operations/{}?wait_ms={}", id, slice));
    if (!next.ok()) {
      return absl::Status(next.status().code(),
                          fmt::format("poll operation {}: {}", id, Msg(next.status())));
    }
    op = std::move(*next);
  }
}

int SignalNumber(std::string_view name) {
  if (!name.empty() && name.find_first_not_of("0123456789") == std::string_view::npos &&
      name.size() < 4) {
    return std::stoi(std::string(name));
  }
  if (name.substr(0, 3) == "SIG") name.remove_prefix(3);
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    if (abbrev != nullptr && name == abbrev) return sig;
  }
  return 0;
}

}  // namespace sbx::cli

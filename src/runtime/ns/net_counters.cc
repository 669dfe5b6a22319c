#include "runtime/ns/net_counters.h"

#include <charconv>
#include <vector>

#include "fmt/format.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

// Whitespace-separated fields of one line.
std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty()) out.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

bool ParseU64(std::string_view s, uint64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

absl::StatusOr<uint64_t> ParseIpOutNoRoutes(std::string_view snmp) {
  // The kernel prints each protocol as two lines: names, then values, in the same order.
  const std::vector<std::string_view> lines = Lines(snmp);
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    const std::vector<std::string_view> names = Fields(lines[i]);
    if (names.empty() || names[0] != "Ip:") continue;
    const std::vector<std::string_view> values = Fields(lines[i + 1]);
    if (values.size() != names.size() || values[0] != "Ip:") break;
    for (size_t k = 1; k < names.size(); ++k) {
      if (names[k] != "OutNoRoutes") continue;
      uint64_t v = 0;
      if (!ParseU64(values[k], &v)) break;
      return v;
    }
    break;
  }
  return absl::InternalError("snmp: no readable `Ip: OutNoRoutes` counter");
}

absl::StatusOr<uint64_t> ParseIp6OutNoRoutes(std::string_view snmp6) {
  for (std::string_view line : Lines(snmp6)) {
    const std::vector<std::string_view> f = Fields(line);
    if (f.size() != 2 || f[0] != "Ip6OutNoRoutes") continue;
    uint64_t v = 0;
    if (!ParseU64(f[1], &v)) break;
    return v;
  }
  return absl::InternalError("snmp6: no readable `Ip6OutNoRoutes` counter");
}

absl::StatusOr<uint64_t> ReadNoRouteCount(pid_t pid, const std::string& proc_root) {
  const std::string snmp_path = fmt::format("{}/{}/net/snmp", proc_root, pid);
  auto snmp = ReadFileToString(snmp_path);
  if (!snmp.ok()) return snmp.status();
  auto v4 = ParseIpOutNoRoutes(*snmp);
  if (!v4.ok()) {
    return absl::InternalError(
        fmt::format("{}: {}", snmp_path, std::string(v4.status().message())));
  }
  const std::string snmp6_path = fmt::format("{}/{}/net/snmp6", proc_root, pid);
  auto snmp6 = ReadFileToString(snmp6_path);
  if (!snmp6.ok()) {
    if (absl::IsNotFound(snmp6.status())) return *v4;  // IPv6 disabled on this host
    return snmp6.status();
  }
  auto v6 = ParseIp6OutNoRoutes(*snmp6);
  if (!v6.ok()) {
    return absl::InternalError(
        fmt::format("{}: {}", snmp6_path, std::string(v6.status().message())));
  }
  return *v4 + *v6;
}

}  // namespace sbx::runtime::ns

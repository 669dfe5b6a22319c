#include "api/target.h"

#include "common/status_util.h"

namespace sbx::api {
namespace {
int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::optional<std::string> PercentDecode(std::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return std::nullopt;
      int hi = Hex(in[i + 1]), lo = Hex(in[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Target> ParseTarget(std::string_view target) {
  auto bad = [](std::string_view why) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    std::string("request target ") + std::string(why));
  };
  if (target.empty() || target[0] != '/') return bad("must start with '/'");
  if (target.size() > 8192) return bad("is too long");
  Target t;
  std::string_view path = target, query;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    query = target.substr(q + 1);
  }
  if (auto h = query.find('#'); h != std::string_view::npos) query = query.substr(0, h);
  auto decoded = PercentDecode(path, false);
  if (!decoded) return bad("has a malformed percent escape");
  if (decoded->find('\0') != std::string::npos) return bad("contains a NUL byte");
  t.path = *decoded;
  size_t start = 1;
  while (start <= t.path.size()) {
    size_t end = t.path.find('/', start);
    if (end == std::string::npos) end = t.path.size();
    if (end > start) t.segments.emplace_back(t.path.substr(start, end - start));
    start = end + 1;
  }
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    auto key = PercentDecode(part.substr(0, eq), true);
    auto value = PercentDecode(eq == std::string_view::npos ? "" : part.substr(eq + 1), true);
    if (!key || !value) return bad("has a malformed query escape");
    t.query[*key] = *value;
  }
  return t;
}

std::string SseEvent(uint64_t id, std::string_view event, std::string_view data) {
  std::string out;
  out.reserve(data.size() + event.size() + 40);
  if (id > 0) {
    out += "id: ";
    out += std::to_string(id);
    out += '\n';
  }
  out += "event: ";
  out += event;
  out += "\ndata: ";
  out += data;
  out += "\n\n";
  return out;
}

}  // namespace sbx::api

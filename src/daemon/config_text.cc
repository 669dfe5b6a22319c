#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config_internal.h"

namespace sbx::daemon::config_internal {
namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return out;
}
std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string Join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

absl::Status Errors(const std::vector<std::string>& errors) {
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(Join(errors, "; "));
}

// " (did you mean 'x'?)" for a near miss (a typo), else "".
std::string DidYouMean(std::string_view wrong, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_d = 3;  // at most two edits: further than that is a different word
  for (const auto& c : candidates) {
    size_t d = EditDistance(wrong, c);
    if (d < best_d) {
      best_d = d;
      best = &c;
    }
  }
  return best ? fmt::format(" (did you mean '{}'?)", *best) : std::string();
}

std::string TypeName(Type t) {
  switch (t) {
    case Type::kString: return "a string";
    case Type::kInt: return "an integer";
    case Type::kBool: return "a boolean (true or false)";
  }
  return "?";
}

std::string TomlString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", ch);
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

// A template name as a TOML key: bare when it can be.
std::string TomlKey(std::string_view k) {
  bool bare = !k.empty() && std::all_of(k.begin(), k.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '-';
  });
  return bare ? std::string(k) : TomlString(k);
}

std::string ValueText(const Config& c, const KeyInfo& k) {
  switch (k.type) {
    case Type::kString: return TomlString(Str(c, k));
    case Type::kInt: return std::to_string(Num(c, k));
    case Type::kBool: return Bool(c, k) ? "true" : "false";
  }
  return "";
}

std::string Shown(const Config& c, const KeyInfo& k) {
  if (k.secret && !Str(c, k).empty()) return "\"<redacted>\"";
  return ValueText(c, k);
}

// How a message names a value: `--x 'v'` / `SBX_X='v'` for text as given, else TOML.
std::string Label(const KeyInfo& k, const Origin& o, const std::string& shown) {
  switch (o.source) {
    case Source::kFlag:
      return k.secret ? o.where : fmt::format("{} {}", o.where, shown);
    case Source::kEnv:
      return k.secret ? o.where : fmt::format("{}={}", o.where, shown);
    case Source::kFile:
      return k.secret ? fmt::format("{} in {}", k.path, o.where)
                      : fmt::format("{} = {} in {}", k.path, shown, o.where);
    case Source::kDefault:
      break;
  }
  return fmt::format("{} = {} (built-in default)", k.path, shown);
}

// A value as written on a command line or in a variable: strings quoted like the old flags'
// messages ("--runtime 'vm'"), numbers bare ("--default-pids 10").
std::string TextShown(const KeyInfo& k, std::string_view text) {
  return k.type == Type::kString ? fmt::format("'{}'", text) : std::string(text);
}

std::string LabelOf(const Config& c, const KeyInfo& k) {
  auto it = c.origins.find(k.path);
  if (it != c.origins.end()) return it->second.label;
  return Label(k, Origin{}, Shown(c, k));
}

std::string WarmLabel(const Config& c, const std::string& name) {
  auto it = c.origins.find(WarmPoolPath(name));
  if (it != c.origins.end()) return it->second.label;
  return fmt::format("{} = {} (built-in default)", WarmPoolPath(name), c.warm_pool.at(name));
}

std::optional<int64_t> ParseInt(std::string_view text) {
  int64_t v = 0;
  const char* b = text.data();
  const char* e = text.data() + text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (text.empty() || ec != std::errc() || p != e) return std::nullopt;
  return v;
}

std::optional<bool> ParseBool(std::string_view text) {
  const std::string t = Lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  return std::nullopt;
}

}  // namespace sbx::daemon::config_internal

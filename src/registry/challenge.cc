#include "registry/challenge.h"

#include <cctype>

namespace sbx::registry {

std::map<std::string, std::string> ParseChallengeParams(std::string_view s) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    const size_t eq = s.find('=', i);
    if (eq == std::string_view::npos) break;
    std::string key(s.substr(i, eq - i));
    i = eq + 1;
    std::string value;
    if (i < s.size() && s[i] == '"') {
      ++i;
      while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;
        value.push_back(s[i++]);
      }
      ++i;
    } else {
      while (i < s.size() && s[i] != ',') value.push_back(s[i++]);
    }
    for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out[key] = value;
  }
  return out;
}

}  // namespace sbx::registry

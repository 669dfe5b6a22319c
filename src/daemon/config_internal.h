// What the files of the configuration share and nothing else includes: access to a key's field,
// the key paths and tables, and how values and their origins are written in messages and TOML.
// config.h is the interface; these files each hold one seam of it:
//   config_keys.cc      the key table (paths, flags, ranges, help) and the names derived from it
//   config_text.cc      values as text: parsing, TOML quoting, labels naming a value's origin
//   config_sources.cc   the layers: flags, the TOML file, SBX_* variables, and Load
//   config_validate.cc  ranges, choices and relations between keys; the connection caps
//   config.cc           --print-config and what a reload applies
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "daemon/config.h"

namespace sbx::daemon::config_internal {

using Type = KeyInfo::Type;
using Source = Origin::Source;

inline constexpr char kWarmPool[] = "warm_pool";
inline constexpr int64_t kMaxWarmPool = 256;
// egress.profiles.<name>: tables of the file, not rows of the key table.
inline constexpr char kEgressProfiles[] = "egress.profiles";

// A key's field, read through the table's accessors (which never write).
const std::string& Str(const Config& c, const KeyInfo& k);
int64_t Num(const Config& c, const KeyInfo& k);
bool Bool(const Config& c, const KeyInfo& k);

// "warm_pool.<template>" entries, which are not rows of the table.
bool IsWarmPoolPath(std::string_view path);
std::string WarmPoolPath(const std::string& name);
// TOML tables that may appear: every proper prefix of a key path, and warm_pool.
const std::set<std::string>& Tables();
// Every table and key path, for "did you mean".
std::vector<std::string> AllPaths();
// SBX_<TABLE>_ prefixes: a variable starting with one is meant for sbxd.
const std::vector<std::string>& EnvPrefixes();
std::string TableOf(std::string_view path);  // "a.b.c" -> "a.b"
std::string LeafOf(std::string_view path);   // "a.b.c" -> "c"

std::string Upper(std::string_view s);  // also turns '.' into '_'
std::string Lower(std::string_view s);
std::string Join(const std::vector<std::string>& parts, std::string_view sep);
// Every problem found, joined by "; ", as one InvalidArgument; OK when there is none.
absl::Status Errors(const std::vector<std::string>& errors);
// " (did you mean 'x'?)" for a near miss (a typo), else "".
std::string DidYouMean(std::string_view wrong, const std::vector<std::string>& candidates);
std::string TypeName(Type t);  // "an integer"

std::string TomlString(std::string_view s);
// A template name as a TOML key: bare when it can be.
std::string TomlKey(std::string_view k);
// A key's value as TOML; Shown() redacts a set secret.
std::string ValueText(const Config& c, const KeyInfo& k);
std::string Shown(const Config& c, const KeyInfo& k);
// How a message names a value from origin `o` shown as `shown`.
std::string Label(const KeyInfo& k, const Origin& o, const std::string& shown);
// A value as written on a command line or in a variable: strings quoted like the old flags'
// messages ("--runtime 'vm'"), numbers bare ("--default-pids 10").
std::string TextShown(const KeyInfo& k, std::string_view text);
// The label of a key's or a warm pool entry's current value (config.h Describe).
std::string LabelOf(const Config& c, const KeyInfo& k);
std::string WarmLabel(const Config& c, const std::string& name);

std::optional<int64_t> ParseInt(std::string_view text);
std::optional<bool> ParseBool(std::string_view text);  // true/1/yes/on, false/0/no/off

}  // namespace sbx::daemon::config_internal

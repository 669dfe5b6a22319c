#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "common/files.h"
#include "common/status_util.h"
#include "daemon/config.h"
#include "daemon/config_internal.h"

namespace sbx::daemon {

using namespace config_internal;

namespace {

std::string TomlTypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time: return "a date or time";
    default: return "nothing";
  }
}

std::string FileLocation(const std::string& file, const toml::source_region& src) {
  return fmt::format("{}:{}:{}", file, src.begin.line, src.begin.column);
}

// Sets a key from a flag's or a variable's text. `where` is the flag or the variable.
absl::Status SetFromText(Config& c, const KeyInfo& k, std::string_view text, Source source,
                         const std::string& where) {
  Origin o{source, where, ""};
  auto bad = [&] {
    std::string as_given = k.secret ? where
                           : source == Source::kFlag
                               ? fmt::format("{} '{}'", where, text)
                               : fmt::format("{}='{}'", where, text);
    return absl::InvalidArgumentError(
        fmt::format("{}: expected {} ({})", as_given, TypeName(k.type), k.path));
  };
  switch (k.type) {
    case Type::kString:
      *k.str(c) = std::string(text);
      break;
    case Type::kInt: {
      auto v = ParseInt(text);
      if (!v) return bad();
      *k.num(c) = *v;
      break;
    }
    case Type::kBool: {
      auto v = ParseBool(text);
      if (!v) return bad();
      *k.boolean(c) = *v;
      break;
    }
  }
  o.label = Label(k, o, TextShown(k, text));
  c.origins[k.path] = std::move(o);
  return absl::OkStatus();
}

void SetFromToml(Config& c, const KeyInfo& k, const toml::node& node, const std::string& file,
                 std::vector<std::string>& errors) {
  const std::string where = FileLocation(file, node.source());
  bool ok = false;
  switch (k.type) {
    case Type::kString:
      if (auto v = node.as_string()) {
        *k.str(c) = v->get();
        ok = true;
      }
      break;
    case Type::kInt:
      if (auto v = node.as_integer()) {
        *k.num(c) = v->get();
        ok = true;
      }
      break;
    case Type::kBool:
      if (auto v = node.as_boolean()) {
        *k.boolean(c) = v->get();
        ok = true;
      }
      break;
  }
  if (!ok) {
    errors.push_back(fmt::format("{} in {}: expected {}, got {}", k.path, where, TypeName(k.type),
                                 TomlTypeName(node)));
    return;
  }
  Origin o{Source::kFile, where, ""};
  o.label = Label(k, o, ValueText(c, k));
  c.origins[k.path] = std::move(o);
}

void SetWarmPoolFromToml(Config& c, const toml::table& t, const std::string& file,
                         std::vector<std::string>& errors) {
  for (auto&& [key, node] : t) {
    const std::string name(key.str());
    const std::string path = WarmPoolPath(name);
    const std::string where = FileLocation(file, node.source());
    auto v = node.as_integer();
    if (!v) {
      errors.push_back(fmt::format("{} in {}: expected an integer (sandboxes kept ready), got {}",
                                   path, where, TomlTypeName(node)));
      continue;
    }
    c.warm_pool[name] = v->get();
    c.origins[path] = Origin{Source::kFile, where,
                             fmt::format("{} = {} in {}", path, v->get(), where)};
  }
}

// A TOML value as JSON, for the egress profiles (ProfileCatalog reads JSON, as the API does).
nlohmann::json TomlToJson(const toml::node& n) {
  if (auto v = n.as_string()) return v->get();
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  if (auto v = n.as_floating_point()) return v->get();
  if (auto a = n.as_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : *a) out.push_back(TomlToJson(e));
    return out;
  }
  if (auto t = n.as_table()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto&& [k, v] : *t) out[std::string(k.str())] = TomlToJson(v);
    return out;
  }
  return nullptr;  // a date or time: the profile parser names it as a bad value
}

// egress.profiles.<name> = {description, allow, deny}: checked as a whole by Validate
// (ProfileCatalog::FromJson), which names the profile and rule.
void SetEgressProfilesFromToml(Config& c, const toml::table& t, const std::string& file,
                               std::vector<std::string>& errors) {
  for (auto&& [key, node] : t) {
    const std::string name(key.str());
    const std::string path = fmt::format("{}.{}", kEgressProfiles, name);
    const std::string where = FileLocation(file, node.source());
    if (!node.as_table()) {
      errors.push_back(fmt::format("{} in {}: expected a table (description, allow, deny), got {}",
                                   path, where, TomlTypeName(node)));
      continue;
    }
    c.egress.profiles[name] = TomlToJson(node);
    c.origins[path] = Origin{Source::kFile, where, fmt::format("{} in {}", path, where)};
  }
}

void WalkTable(Config& c, const toml::table& t, const std::string& prefix, const std::string& file,
               std::vector<std::string>& errors) {
  for (auto&& [key, node] : t) {
    const std::string path =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const KeyInfo* k = FindKey(path)) {
      SetFromToml(c, *k, node, file, errors);
      continue;
    }
    if (Tables().count(path)) {
      const toml::table* sub = node.as_table();
      if (!sub) {
        errors.push_back(fmt::format("{} in {}: expected a table, got {}", path,
                                     FileLocation(file, node.source()), TomlTypeName(node)));
      } else if (path == kWarmPool) {
        SetWarmPoolFromToml(c, *sub, file, errors);
      } else if (path == kEgressProfiles) {
        SetEgressProfilesFromToml(c, *sub, file, errors);
      } else {
        WalkTable(c, *sub, path, file, errors);
      }
      continue;
    }
    errors.push_back(fmt::format("unknown key '{}' in {}{}", path,
                                 FileLocation(file, key.source()), DidYouMean(path, AllPaths())));
  }
}

// "base=2" -> {"base", 2}, with the message the flag has always given.
absl::StatusOr<std::pair<std::string, int64_t>> ParseWarmPoolFlag(const std::string& spec) {
  auto eq = spec.find('=');
  std::string name = spec.substr(0, eq);
  std::optional<int64_t> n;
  if (eq != std::string::npos) n = ParseInt(std::string_view(spec).substr(eq + 1));
  if (name.empty() || !n || *n < 0 || *n > kMaxWarmPool) {
    return absl::InvalidArgumentError(fmt::format(
        "--warm-pool '{}': expected TEMPLATE=N with N from 0 to {}", spec, kMaxWarmPool));
  }
  return std::make_pair(name, *n);
}

std::string Help(const KeyInfo& k) {
  Config defaults;
  std::string range = k.type == Type::kInt ? fmt::format("{} to {}, ", k.min, k.max) : "";
  return fmt::format("{} [{}, ${}; {}default {}{}]", k.help, k.path, EnvName(k.path), range,
                     ValueText(defaults, k), k.reloadable ? "; SIGHUP reloads it" : "");
}

const char* TypeHint(const KeyInfo& k) {
  if (std::string_view(k.path) == "server.listen") return "HOST:PORT";
  switch (k.type) {
    case Type::kString: return *k.choices ? "NAME" : "TEXT";
    case Type::kInt: return "N";
    case Type::kBool: return "BOOL";
  }
  return "TEXT";
}

}  // namespace

void AddFlags(CLI::App& app, CommandLine& cl) {
  app.add_option_function<std::string>(
         "--config", [&cl](const std::string& v) { cl.config_file = v; },
         fmt::format("TOML configuration file (default: {} when it exists; ${}; \"\" reads none)",
                     kDefaultConfigFile, kConfigEnv))
      ->type_name("FILE");
  app.add_flag("--print-config", cl.print_config,
               "print the effective configuration as TOML (secrets redacted) and exit");
  for (const auto& k : Keys()) {
    const KeyInfo* key = &k;
    app.add_option_function<std::string>(
           k.flag, [&cl, key](const std::string& v) { cl.values.emplace_back(key, v); }, Help(k))
        ->type_name(TypeHint(k));
  }
  app.add_option_function<std::vector<std::string>>(
      "--warm-pool",
      [&cl](const std::vector<std::string>& v) {
        cl.warm_pools.insert(cl.warm_pools.end(), v.begin(), v.end());
      },
      "TEMPLATE=N: keep N sandboxes of TEMPLATE ready so that creates with the default "
      "resources skip the launch (repeatable; N=0 turns a pool off) [warm_pool.TEMPLATE, "
      "$SBX_WARM_POOL_TEMPLATE; default base=2; SIGHUP reloads it]")
      ->type_name("TEMPLATE=N");
}

absl::Status ApplyToml(Config& c, std::string_view text, const std::string& file_name) {
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: TOML parse error: {}", FileLocation(file_name, e.source()), e.description()));
  }
  std::vector<std::string> errors;
  WalkTable(c, root, "", file_name, errors);
  return Errors(errors);
}

absl::Status ApplyEnv(Config& c, const std::vector<std::string>& env) {
  std::vector<std::string> errors;
  std::map<std::string, std::string> vars;
  for (const auto& entry : env) {
    auto eq = entry.find('=');
    if (eq == std::string::npos || entry.rfind("SBX_", 0) != 0) continue;
    vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::vector<std::string> env_names;
  for (const auto& k : Keys()) env_names.push_back(EnvName(k.path));
  const std::string warm_prefix = EnvName(kWarmPool) + "_";
  for (const auto& [name, value] : vars) {
    if (name == kConfigEnv || name == kAdminTokenAliasEnv) continue;
    auto key = std::find_if(Keys().begin(), Keys().end(),
                            [&](const KeyInfo& k) { return EnvName(k.path) == name; });
    if (key != Keys().end()) {
      if (auto st = SetFromText(c, *key, value, Source::kEnv, name); !st.ok()) {
        errors.push_back(std::string(st.message()));
      }
      continue;
    }
    if (name.rfind(warm_prefix, 0) == 0 && name.size() > warm_prefix.size()) {
      const std::string tmpl = Lower(name.substr(warm_prefix.size()));
      auto n = ParseInt(value);
      if (!n) {
        errors.push_back(fmt::format("{}='{}': expected an integer (sandboxes of template '{}' "
                                     "kept ready)",
                                     name, value, tmpl));
        continue;
      }
      c.warm_pool[tmpl] = *n;
      c.origins[WarmPoolPath(tmpl)] =
          Origin{Source::kEnv, name, fmt::format("{}={}", name, *n)};
      continue;
    }
    bool ours = std::any_of(EnvPrefixes().begin(), EnvPrefixes().end(),
                            [&](const std::string& p) { return name.rfind(p, 0) == 0; });
    if (ours) {
      errors.push_back(fmt::format(
          "unknown configuration variable {}{} (a variable starting with {} names a key of "
          "docs/config.md)",
          name, DidYouMean(name, env_names), Join(EnvPrefixes(), ", ")));
    }
  }
  // The alias fills in only where the canonical name is unset or empty (an empty
  // SBX_ADMIN_TOKEN always meant unset).
  const KeyInfo& token = *FindKey("server.admin_token");
  auto alias = vars.find(kAdminTokenAliasEnv);
  auto canonical = vars.find(EnvName(token.path));
  if (alias != vars.end() && !alias->second.empty()) {
    if (canonical != vars.end() && !canonical->second.empty()) {
      if (canonical->second != alias->second) {
        errors.push_back(fmt::format("{} and {} are both set, to different tokens: set one",
                                     kAdminTokenAliasEnv, EnvName(token.path)));
      }
    } else {
      (void)SetFromText(c, token, alias->second, Source::kEnv, kAdminTokenAliasEnv);
    }
  }
  return Errors(errors);
}

absl::Status ApplyFlags(Config& c, const CommandLine& cl) {
  std::vector<std::string> errors;
  for (const auto& [key, text] : cl.values) {
    if (auto st = SetFromText(c, *key, text, Source::kFlag, key->flag); !st.ok()) {
      errors.push_back(std::string(st.message()));
    }
  }
  for (const auto& spec : cl.warm_pools) {
    auto parsed = ParseWarmPoolFlag(spec);
    if (!parsed.ok()) {
      errors.push_back(std::string(parsed.status().message()));
      continue;
    }
    const std::string label = fmt::format("--warm-pool '{}'", spec);
    c.warm_pool[parsed->first] = parsed->second;
    c.origins[WarmPoolPath(parsed->first)] = Origin{Source::kFlag, label, label};
  }
  return Errors(errors);
}

absl::StatusOr<Loaded> Load(const CommandLine& cl, const std::vector<std::string>& env,
                            const std::string& default_file) {
  Loaded out;
  std::optional<std::string> file = cl.config_file;
  std::string named_by = "--config";
  if (!file) {
    const std::string prefix = std::string(kConfigEnv) + "=";
    for (const auto& e : env) {
      if (e.rfind(prefix, 0) == 0) {
        file = e.substr(prefix.size());
        named_by = kConfigEnv;
      }
    }
  }
  if (!file) {
    // Absent is fine for the default file only; anything else (EACCES) is reported by the read.
    struct stat st{};
    if (::stat(default_file.c_str(), &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) {
      file = default_file;
      named_by = "the default configuration file";
    }
  }
  if (file && !file->empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(*file);
    if (!text.ok()) {
      return Annotate(text.status(), fmt::format("configuration file (from {})", named_by));
    }
    SBX_RETURN_IF_ERROR(ApplyToml(out.config, *text, *file));
    out.file = *file;
    struct stat st{};
    if (out.config.origins.count("server.admin_token") &&
        out.config.origins.at("server.admin_token").source == Source::kFile &&
        ::stat(file->c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      out.warnings.push_back(fmt::format(
          "{} holds server.admin_token but is readable by others than its owner (mode {:04o}): "
          "chmod 600 it",
          *file, st.st_mode & 07777));
    }
  }
  SBX_RETURN_IF_ERROR(ApplyEnv(out.config, env));
  SBX_RETURN_IF_ERROR(ApplyFlags(out.config, cl));
  SBX_RETURN_IF_ERROR(Validate(out.config));
  return out;
}

}  // namespace sbx::daemon

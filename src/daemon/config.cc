// --print-config and reloads; the other seams of the configuration are listed in
// config_internal.h.
#include "daemon/config.h"

#include <fmt/format.h>

#include <set>

#include "daemon/config_internal.h"

namespace sbx::daemon {

using namespace config_internal;

std::string ShowValue(const Config& c, const std::string& path) {
  if (IsWarmPoolPath(path)) {
    auto it = c.warm_pool.find(path.substr(sizeof(kWarmPool)));
    return std::to_string(it == c.warm_pool.end() ? 0 : it->second);
  }
  const KeyInfo* k = FindKey(path);
  return k ? Shown(c, *k) : std::string();
}

std::string Describe(const Config& c, const std::string& path) {
  if (IsWarmPoolPath(path)) {
    const std::string name = path.substr(sizeof(kWarmPool));
    if (c.warm_pool.count(name)) return WarmLabel(c, name);
    return path;
  }
  const KeyInfo* k = FindKey(path);
  return k ? LabelOf(c, *k) : path;
}

std::string ToToml(const Config& c, bool redact) {
  auto comment = [&](const std::string& path) {
    auto it = c.origins.find(path);
    if (it == c.origins.end()) return std::string();
    const Origin& o = it->second;
    // A line number is enough in a file; the column is for error messages.
    std::string where = o.where;
    if (o.source == Source::kFile) where = where.substr(0, where.rfind(':'));
    return "  # " + where;
  };
  std::string out =
      "# sbxd's effective configuration (sbxd --print-config); a comment names where a value\n"
      "# came from when it is not the built-in default. See docs/config.md.\n";
  std::string table = "-";
  for (const auto& k : Keys()) {
    if (TableOf(k.path) != table) {
      table = TableOf(k.path);
      out += fmt::format("\n[{}]\n", table);
    }
    out += fmt::format("{} = {}{}\n", LeafOf(k.path), redact ? Shown(c, k) : ValueText(c, k),
                       comment(k.path));
  }
  out += fmt::format("\n[{}]\n", kWarmPool);
  for (const auto& [name, n] : c.warm_pool) {
    out += fmt::format("{} = {}{}\n", TomlKey(name), n, comment(WarmPoolPath(name)));
  }
  return out;
}

ReloadPlan PlanReload(const Config& running, const Config& loaded) {
  ReloadPlan plan;
  plan.config = loaded;
  for (const auto& k : Keys()) {
    if (ValueText(running, k) == ValueText(loaded, k)) continue;
    ReloadPlan::Change change{k.path, Shown(running, k), Shown(loaded, k)};
    if (k.reloadable) {
      plan.applied.push_back(std::move(change));
      continue;
    }
    plan.needs_restart.push_back(std::move(change));
    switch (k.type) {
      case Type::kString: *k.str(plan.config) = Str(running, k); break;
      case Type::kInt: *k.num(plan.config) = Num(running, k); break;
      case Type::kBool: *k.boolean(plan.config) = Bool(running, k); break;
    }
    if (auto it = running.origins.find(k.path); it != running.origins.end()) {
      plan.config.origins[k.path] = it->second;
    } else {
      plan.config.origins.erase(k.path);
    }
  }
  std::set<std::string> names;
  for (const auto& [name, n] : running.warm_pool) names.insert(name);
  for (const auto& [name, n] : loaded.warm_pool) names.insert(name);
  for (const auto& name : names) {
    const std::string path = WarmPoolPath(name);
    std::string from = ShowValue(running, path), to = ShowValue(loaded, path);
    if (from != to) plan.applied.push_back({path, from, to});
  }
  // Profiles wait for a restart: NetworkHost's chains are built from them at start, and a
  // sandbox keeps what it was created with anyway.
  if (running.egress.profiles != loaded.egress.profiles) {
    plan.needs_restart.push_back(
        {kEgressProfiles, running.egress.profiles.dump(), loaded.egress.profiles.dump()});
    plan.config.egress.profiles = running.egress.profiles;
  }
  return plan;
}

}  // namespace sbx::daemon

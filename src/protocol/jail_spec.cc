#include "protocol/jail_spec.h"

namespace sbx::protocol {

nlohmann::json JailSpec::ToJson() const {
  nlohmann::json binds_json = nlohmann::json::array();
  for (const auto& b : binds) binds_json.push_back({{"path", b.path}, {"writable", b.writable}, {"device", b.device}});
  return {{"uid", uid}, {"gid", gid}, {"groups", groups}, {"root", root}, {"binds", binds_json},
          {"cgroup_procs", cgroup_procs}, {"tap", tap},
          {"max_file_bytes", max_file_bytes}, {"delegate", delegate}};
}

bool JailSpec::FromJson(const nlohmann::json& j, JailSpec* out, std::string* error) {
  try {
    JailSpec s;
    s.uid = j.at("uid").get<unsigned>();
    s.gid = j.at("gid").get<unsigned>();
    s.groups = j.at("groups").get<std::vector<unsigned>>();
    s.root = j.at("root").get<std::string>();
    for (const auto& b : j.at("binds")) {
      s.binds.push_back({b.at("path").get<std::string>(), b.at("writable").get<bool>(), b.at("device").get<bool>()});
    }
    s.cgroup_procs = j.at("cgroup_procs").get<std::vector<std::string>>();
    s.tap = j.at("tap").get<std::string>();
    s.max_file_bytes = j.value("max_file_bytes", 0ULL);
    s.delegate = j.value("delegate", false);
    if (!s.delegate && (s.uid == 0 || s.gid == 0)) {
      *error = "the VMM's uid and gid must not be root's";
      return false;
    }
    for (const auto& b : s.binds) {
      if (b.path.empty() || b.path[0] != '/' || b.path.find("/..") != std::string::npos) {
        *error = "a bind is not an absolute, normalized path: " + b.path;
        return false;
      }
    }
    *out = std::move(s);
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

}  // namespace sbx::protocol

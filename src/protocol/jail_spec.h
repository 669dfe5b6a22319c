// The VMM jail's spec: what sbxd's microvm runtime writes (<dir>/jail.json, root's) and
// `sbx-agent --vm-jail` reads before it starts QEMU (agent/vm_jail.h says what each field does).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sbx::protocol {

struct JailBind {
  std::string path;       // the same path outside and inside
  bool writable = false;
  bool device = false;    // a device node: keeps dev
};

struct JailSpec {
  unsigned uid = 0;
  unsigned gid = 0;
  std::vector<unsigned> groups;
  std::string root;  // an empty directory the jail's tmpfs root is mounted on
  std::vector<JailBind> binds;
  std::vector<std::string> cgroup_procs;
  std::string tap;  // opened as fd 4 before the network namespace; empty: none
  // RLIMIT_FSIZE, with SIGXFSZ ignored: no file the VMM writes (the guest's console log above
  // all, which a guest can write without end) grows past it; a write beyond gets EFBIG.
  // 0: unlimited.
  unsigned long long max_file_bytes = 0;
  // The program jails itself (Firecracker's jailer: chroot, uid, namespaces): only the cgroups
  // and max_file_bytes are applied here, and it runs as root with the fields above unused.
  bool delegate = false;

  nlohmann::json ToJson() const;
  static bool FromJson(const nlohmann::json& j, JailSpec* out, std::string* error);
};

}  // namespace sbx::protocol

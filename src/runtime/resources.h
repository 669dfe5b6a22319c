// A sandbox's resources, one type for every layer: what a sandbox gets (Resources) and what a
// create may ask for (ResourceLimits). The numbers below are the built-in defaults and the only
// copy of them in the code: sbxd's configuration ([sandbox.defaults] and [sandbox.limits],
// daemon/config.h) holds these very structures and starts from them; api checks a request
// against the limits, the service fills what a request omits from the defaults and records the
// result as the sandbox's effective_resources, and a runtime turns it into kernel limits.
//
// It lives in runtime because that is the lowest layer all of its users may include (api ->
// service -> runtime; the daemon wires them): the request, the stored record and the cgroup
// files then share one type instead of converting between copies. It is plain values with no
// link dependency, so including it pulls in nothing else of the runtime.
#pragma once

#include <cstdint>

namespace sbx::runtime {

// vcpu, memory_mib and disk_mib may be asked for by a create; the others are deployment
// settings only. 64-bit because the configuration parses every number as such.
struct Resources {
  int64_t vcpu = 1;           // CPU quota in whole CPUs
  int64_t memory_mib = 512;   // hard memory limit
  int64_t disk_mib = 1024;    // the writable layer's disk cap
  int64_t pids = 512;         // pids.max
  // RLIMIT_NOFILE (soft = hard) of the sandbox's processes. Must not exceed sbxd's own hard
  // limit: raising a hard limit needs CAP_SYS_RESOURCE, which root lacks on some hosts.
  int64_t open_files = 4096;
  int64_t tmp_mib = 256;      // size of the tmpfs on /tmp (charged to the memory limit when used)
  int64_t shm_mib = 64;       // size of the tmpfs on /dev/shm (likewise)

  // Defaulted so that a field added later is compared too (warm pools match on all of them).
  friend bool operator==(const Resources&, const Resources&) = default;
};

// What a create may ask for, per requestable resource. min_vcpu is fixed (no key sets it): a
// sandbox without a whole CPU of quota is not offered.
struct ResourceLimits {
  int64_t min_vcpu = 1;
  int64_t max_vcpu = 64;
  int64_t min_memory_mib = 32;
  int64_t max_memory_mib = 65536;
  int64_t min_disk_mib = 64;
  int64_t max_disk_mib = int64_t{1} << 20;

  friend bool operator==(const ResourceLimits&, const ResourceLimits&) = default;
};

}  // namespace sbx::runtime

// What a microVM boots: a guest kernel and an initramfs, made from Debian's packages
// (linux-image-amd64) and sbx-agent, once per content, under <state>/microvm/assets/<key>/.
//
//   - vmlinux: the ELF kernel inside /boot/vmlinuz-<version> (a bzImage). QEMU's microvm
//     machine boots an ELF through its PVH entry, which skips the real-mode setup code, so a
//     TCG boot takes ~2 s instead of ~5 s here (research/feasibility.md, row 8c). The payload
//     is found through the bzImage header (payload_offset, payload_length) and decompressed
//     with libarchive's raw reader, whatever the kernel was compressed with.
//   - initramfs.cpio: sbx-agent as /init (agent/vm_init.h), the modules the guest needs
//     (Debian builds virtio, 9p, ext4 and overlay as modules) in dependency order with
//     /lib/modules/load.list naming that order, and /dev/console.
//
// The key is the SHA-256 of the kernel, the agent and every module taken, so a kernel update
// or a new agent makes new assets and never changes the ones running VMs booted from.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::runtime::microvm {

struct BootAssetsOptions {
  std::string kernel;       // a bzImage; empty: the newest /boot/vmlinuz-*
  std::string modules_dir;  // empty: /lib/modules/<the kernel's version>
  std::string agent_path;   // the static sbx-agent the guest runs
  std::string cache_dir;    // <state>/microvm/assets
};

struct BootAssets {
  std::string kernel;          // the bzImage they come from
  std::string kernel_version;  // "6.1.0-57-amd64"
  std::string vmlinux;
  std::string initramfs;
  std::string key;  // hex SHA-256 (the directory's name)
};

// The modules the guest loads, by name; their dependencies come from modules.dep.
const std::vector<std::string>& GuestModules();

// The newest /boot/vmlinuz-* (by version order), or NotFound saying what to install.
absl::StatusOr<std::string> FindKernel(const std::string& boot_dir = "/boot");

// The ELF image inside a bzImage's bytes.
absl::StatusOr<std::string> ExtractVmlinux(const std::string& bzimage);

// Relative paths (as in modules.dep) of `wanted` and everything they need, each after what it
// needs. A wanted name built into the kernel (listed in modules.builtin) is skipped.
absl::StatusOr<std::vector<std::string>> ModuleLoadOrder(const std::string& modules_dep,
                                                         const std::string& modules_builtin,
                                                         const std::vector<std::string>& wanted);

// Makes (or finds) the assets for these inputs. Safe to call from several threads and
// processes: a half-made directory is never used.
absl::StatusOr<BootAssets> PrepareBootAssets(const BootAssetsOptions& opts);

}  // namespace sbx::runtime::microvm

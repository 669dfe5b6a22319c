#include "runtime/microvm/boot_assets.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "common/digest.h"
#include "common/files.h"
#include "common/status_util.h"

namespace sbx::runtime::microvm {
namespace fs = std::filesystem;
namespace {

uint32_t LeU32(const std::string& b, size_t off) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[off + static_cast<size_t>(i)]);
  return v;
}

std::string ModuleName(const std::string& path) {
  std::string n = path.substr(path.rfind('/') + 1);
  n = n.substr(0, n.find('.'));
  for (char& c : n) {
    if (c == '-') c = '_';
  }
  return n;
}

// One cpio entry.
absl::Status Add(archive* a, const std::string& path, mode_t type, mode_t perm,
                 const std::string& data, unsigned rdev_major = 0, unsigned rdev_minor = 0) {
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, path.c_str());
  archive_entry_set_filetype(e, type);
  archive_entry_set_perm(e, perm);
  archive_entry_set_size(e, type == AE_IFREG ? static_cast<la_int64_t>(data.size()) : 0);
  if (type == AE_IFCHR) {
    archive_entry_set_rdevmajor(e, rdev_major);
    archive_entry_set_rdevminor(e, rdev_minor);
  }
  int rc = archive_write_header(a, e);
  archive_entry_free(e);
  if (rc != ARCHIVE_OK) {
    return absl::InternalError(
        fmt::format("initramfs: write header of {}: {}", path, archive_error_string(a)));
  }
  if (type == AE_IFREG && !data.empty() &&
      archive_write_data(a, data.data(), data.size()) != static_cast<la_ssize_t>(data.size())) {
    return absl::InternalError(
        fmt::format("initramfs: write {}: {}", path, archive_error_string(a)));
  }
  return absl::OkStatus();
}

absl::Status WriteInitramfs(const std::string& path, const std::string& agent,
                            const std::vector<std::pair<std::string, std::string>>& modules) {
  archive* a = archive_write_new();
  archive_write_set_format_cpio_newc(a);
  if (archive_write_open_filename(a, path.c_str()) != ARCHIVE_OK) {
    absl::Status st = absl::InternalError(
        fmt::format("initramfs: open {}: {}", path, archive_error_string(a)));
    archive_write_free(a);
    return st;
  }
  absl::Status st;
  auto add = [&](absl::Status s) {
    if (st.ok()) st = std::move(s);
  };
  for (const char* d : {"dev", "proc", "sys", "lib", "lib/modules"}) add(Add(a, d, AE_IFDIR, 0755, {}));
  // The kernel opens /dev/console for init before anything is mounted.
  add(Add(a, "dev/console", AE_IFCHR, 0600, {}, 5, 1));
  add(Add(a, "init", AE_IFREG, 0755, agent));
  std::string list;
  for (const auto& [name, bytes] : modules) {
    add(Add(a, "lib/modules/" + name, AE_IFREG, 0644, bytes));
    list += "/lib/modules/" + name + "\n";
  }
  add(Add(a, "lib/modules/load.list", AE_IFREG, 0644, list));
  if (archive_write_close(a) != ARCHIVE_OK && st.ok()) {
    st = absl::InternalError(fmt::format("initramfs: close {}: {}", path, archive_error_string(a)));
  }
  archive_write_free(a);
  return st;
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  FILE* f = std::fopen(path.c_str(), "wbxe");
  if (f == nullptr) return ErrnoStatus(errno, fmt::format("boot assets: fopen({})", path));
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  if (std::fclose(f) != 0 || !ok) return ErrnoStatus(errno, fmt::format("boot assets: write {}", path));
  return absl::OkStatus();
}

std::mutex g_prepare_mu;

// Every segment an ELF image's program headers name lies inside it: the whole kernel came out.
bool ElfComplete(const std::string& e) {
  if (e.size() < sizeof(Elf64_Ehdr) || e.compare(0, 4, ELFMAG) != 0 || e[EI_CLASS] != ELFCLASS64) {
    return false;
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, e.data(), sizeof(eh));
  if (eh.e_phnum == 0) return false;
  for (size_t i = 0; i < eh.e_phnum; ++i) {
    const uint64_t off = eh.e_phoff + i * uint64_t{eh.e_phentsize};
    if (off + sizeof(Elf64_Phdr) > e.size()) return false;
    Elf64_Phdr ph;
    std::memcpy(&ph, e.data() + off, sizeof(ph));
    if (ph.p_offset + ph.p_filesz > e.size()) return false;
  }
  return true;
}

}  // namespace

const std::vector<std::string>& GuestModules() {
  // crc32c_generic: ext4 asks the crypto API for "crc32c" by name, which only modprobe
  // would load (no hard dependency in modules.dep).
  static const std::vector<std::string> kModules = {
      "virtio_mmio", "virtio_console", "virtio_blk", "virtio_net", "9pnet_virtio", "9p",
      "crc32c_generic", "ext4", "overlay",
      // Firecracker has no virtio-serial: the agent's link there is vsock.
      "vmw_vsock_virtio_transport"};
  return kModules;
}

absl::StatusOr<std::string> FindKernel(const std::string& boot_dir) {
  std::string best;
  DIR* d = ::opendir(boot_dir.c_str());
  if (d != nullptr) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("vmlinuz-", 0) != 0) continue;
      if (best.empty() || ::strverscmp(n.c_str(), best.c_str()) > 0) best = n;
    }
    ::closedir(d);
  }
  if (best.empty()) {
    return absl::NotFoundError(fmt::format(
        "no guest kernel: {}/vmlinuz-* is missing (apt-get install linux-image-amd64, or set "
        "runtime.microvm.kernel)",
        boot_dir));
  }
  return boot_dir + "/" + best;
}

absl::StatusOr<std::string> ExtractVmlinux(const std::string& b) {
  // The x86 boot protocol: setup_sects at 0x1f1, "HdrS" at 0x202, payload_offset/length at
  // 0x248/0x24c relative to the protected-mode code, which starts after the setup sectors.
  if (b.size() < 0x250 || b.compare(0x202, 4, "HdrS") != 0) {
    return absl::InvalidArgumentError("guest kernel: not a bzImage (no HdrS header)");
  }
  const uint8_t setup_sects = static_cast<uint8_t>(b[0x1f1]) == 0 ? 4 : static_cast<uint8_t>(b[0x1f1]);
  const uint64_t start = (uint64_t{setup_sects} + 1) * 512 + LeU32(b, 0x248);
  uint64_t len = LeU32(b, 0x24c);
  if (start + len > b.size() || len == 0) {
    return absl::InvalidArgumentError("guest kernel: the bzImage's payload lies outside the file");
  }
  // The kernel's build appends the uncompressed size (4 bytes) after an xz stream, whose
  // footer ends in "YZ"; the decompressor would read it as a broken second stream.
  if (len > 6 && b.compare(start + len - 6, 2, "YZ") == 0) len -= 4;
  archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_raw(a);
  std::string out;
  absl::Status st;
  archive_entry* e = nullptr;
  if (archive_read_open_memory(a, b.data() + start, len) != ARCHIVE_OK ||
      archive_read_next_header(a, &e) != ARCHIVE_OK) {
    st = absl::InvalidArgumentError(
        fmt::format("guest kernel: the payload does not decompress: {}", archive_error_string(a)));
  } else {
    char buf[1 << 16];
    for (;;) {
      const la_ssize_t r = archive_read_data(a, buf, sizeof(buf));
      if (r == 0) break;
      if (r < 0) {
        // The kernel's build appends the uncompressed size after an xz, lzma or zstd stream
        // (size_append), which the decompressor reads as a broken next stream.
        if (ElfComplete(out)) break;
        st = absl::InvalidArgumentError(
            fmt::format("guest kernel: decompress the payload: {}", archive_error_string(a)));
        break;
      }
      out.append(buf, static_cast<size_t>(r));
      if (out.size() > (1u << 30)) {
        st = absl::InvalidArgumentError("guest kernel: the payload is over 1 GiB");
        break;
      }
    }
  }
  archive_read_free(a);
  SBX_RETURN_IF_ERROR(st);
  if (out.size() < 4 || out.compare(0, 4, "\x7f" "ELF") != 0) {
    return absl::InvalidArgumentError("guest kernel: the payload is not an ELF image");
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ModuleLoadOrder(const std::string& modules_dep,
                                                         const std::string& modules_builtin,
                                                         const std::vector<std::string>& wanted) {
  std::map<std::string, std::pair<std::string, std::vector<std::string>>> by_name;  // name → path, deps
  std::istringstream in(modules_dep);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string path = line.substr(0, colon);
    std::vector<std::string> deps;
    std::istringstream ds(line.substr(colon + 1));
    std::string dep;
    while (ds >> dep) deps.push_back(dep);
    by_name[ModuleName(path)] = {path, std::move(deps)};
  }
  std::set<std::string> builtin;
  std::istringstream bi(modules_builtin);
  while (std::getline(bi, line)) {
    if (!line.empty()) builtin.insert(ModuleName(line));
  }
  std::vector<std::string> order;
  std::set<std::string> done, visiting;
  std::function<absl::Status(const std::string&)> visit = [&](const std::string& name) -> absl::Status {
    if (done.count(name) != 0) return absl::OkStatus();
    if (visiting.count(name) != 0) {
      return absl::FailedPreconditionError(fmt::format("kernel modules: {} depends on itself", name));
    }
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (builtin.count(name) != 0) {
        done.insert(name);
        return absl::OkStatus();
      }
      return absl::NotFoundError(fmt::format(
          "kernel modules: {} is neither in modules.dep nor built in (is linux-image-amd64's "
          "/lib/modules complete?)",
          name));
    }
    visiting.insert(name);
    // modules.dep lists every transitive dependency; each still goes after its own.
    for (const auto& dep : it->second.second) SBX_RETURN_IF_ERROR(visit(ModuleName(dep)));
    visiting.erase(name);
    done.insert(name);
    order.push_back(it->second.first);
    return absl::OkStatus();
  };
  for (const auto& w : wanted) SBX_RETURN_IF_ERROR(visit(w));
  return order;
}

absl::StatusOr<BootAssets> PrepareBootAssets(const BootAssetsOptions& opts) {
  BootAssets out;
  if (opts.kernel.empty()) {
    SBX_ASSIGN_OR_RETURN(out.kernel, FindKernel());
  } else {
    out.kernel = opts.kernel;
  }
  const std::string base = out.kernel.substr(out.kernel.rfind('/') + 1);
  out.kernel_version = base.rfind("vmlinuz-", 0) == 0 ? base.substr(8) : std::string();
  std::string modules_dir = opts.modules_dir;
  if (modules_dir.empty()) {
    if (out.kernel_version.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "guest kernel {}: its name is not vmlinuz-<version>, so its modules cannot be found",
          out.kernel));
    }
    modules_dir = "/lib/modules/" + out.kernel_version;
  }
  SBX_ASSIGN_OR_RETURN(std::string kernel, ReadFileToString(out.kernel));
  SBX_ASSIGN_OR_RETURN(std::string agent, ReadFileToString(opts.agent_path));
  SBX_ASSIGN_OR_RETURN(std::string dep, ReadFileToString(modules_dir + "/modules.dep"));
  const std::string builtin = ReadFileOrEmpty(modules_dir + "/modules.builtin");
  SBX_ASSIGN_OR_RETURN(std::vector<std::string> order, ModuleLoadOrder(dep, builtin, GuestModules()));
  std::vector<std::pair<std::string, std::string>> modules;
  std::string keyed = Sha256Hex(kernel) + Sha256Hex(agent);
  for (const auto& rel : order) {
    SBX_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(modules_dir + "/" + rel));
    std::string name = rel.substr(rel.rfind('/') + 1);
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".ko") != 0) {
      return absl::FailedPreconditionError(fmt::format(
          "kernel modules: {} is compressed; the guest's init loads only plain .ko files", rel));
    }
    keyed += name + Sha256Hex(bytes);
    modules.emplace_back(std::move(name), std::move(bytes));
  }
  out.key = Sha256Hex(keyed);
  const std::string dir = opts.cache_dir + "/" + out.key.substr(0, 32);
  out.vmlinux = dir + "/vmlinux";
  out.initramfs = dir + "/initramfs.cpio";

  std::lock_guard lock(g_prepare_mu);
  if (::access(out.initramfs.c_str(), R_OK) == 0 && ::access(out.vmlinux.c_str(), R_OK) == 0) {
    return out;
  }
  std::error_code ec;
  fs::create_directories(opts.cache_dir, ec);
  if (ec) return absl::InternalError(fmt::format("boot assets: mkdir {}: {}", opts.cache_dir, ec.message()));
  const std::string tmp = fmt::format("{}/.tmp-{}-{}", opts.cache_dir, ::getpid(), out.key.substr(0, 8));
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) return ErrnoStatus(errno, fmt::format("boot assets: mkdir({})", tmp));
  auto cleanup = [&](absl::Status st) {
    fs::remove_all(tmp, ec);
    return st;
  };
  auto vmlinux = ExtractVmlinux(kernel);
  if (!vmlinux.ok()) return cleanup(Annotate(vmlinux.status(), out.kernel));
  if (auto st = WriteFile(tmp + "/vmlinux", *vmlinux); !st.ok()) return cleanup(st);
  if (auto st = WriteInitramfs(tmp + "/initramfs.cpio", agent, modules); !st.ok()) return cleanup(st);
  // Another process may have made it meanwhile: theirs is as good as ours.
  if (::rename(tmp.c_str(), dir.c_str()) != 0 && errno != EEXIST && errno != ENOTEMPTY) {
    return cleanup(ErrnoStatus(errno, fmt::format("boot assets: rename({}, {})", tmp, dir)));
  }
  fs::remove_all(tmp, ec);
  return out;
}

}  // namespace sbx::runtime::microvm

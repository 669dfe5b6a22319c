#include <archive.h>
#include <archive_entry.h>

#include <elf.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <fstream>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/microvm/boot_assets.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/tree_image.h"
#include "common/process.h"
#include "common/test_util.h"

namespace sbx::runtime::microvm {
namespace {

std::string Compress(const std::string& data, bool xz) {
  archive* a = archive_write_new();
  archive_write_set_format_raw(a);
  if (xz) {
    archive_write_add_filter_xz(a);
  } else {
    archive_write_add_filter_gzip(a);
  }
  std::vector<char> buf(data.size() + 65536);
  size_t used = 0;
  archive_write_open_memory(a, buf.data(), buf.size(), &used);
  archive_entry* e = archive_entry_new();
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  archive_write_header(a, e);
  archive_write_data(a, data.data(), data.size());
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
  return std::string(buf.data(), used);
}

// A bzImage as the boot protocol lays it out: setup sectors, then the protected-mode code
// whose payload_offset/payload_length point at the compressed kernel.
std::string BzImage(const std::string& payload, uint8_t setup_sects, uint32_t offset) {
  std::string b((setup_sects + 1) * 512 + offset, '\0');
  b[0x1f1] = static_cast<char>(setup_sects);
  b.replace(0x202, 4, "HdrS");
  auto put = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(0x248, offset);
  put(0x24c, static_cast<uint32_t>(payload.size()));
  b += payload;
  b += std::string(100, 'T');  // trailing bytes after the payload are not the kernel's
  return b;
}

// An ELF64 header with one program header whose segment covers the rest of the image.
std::string Elf(size_t size) {
  std::string e(size, 'k');
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = 1;
  Elf64_Phdr ph{};
  ph.p_type = PT_LOAD;
  ph.p_offset = 4096;
  ph.p_filesz = size - 4096;
  std::memcpy(e.data(), &eh, sizeof(eh));
  std::memcpy(e.data() + sizeof(eh), &ph, sizeof(ph));
  return e;
}

TEST(BootAssets, ExtractsTheElfWhateverTheCompression) {
  const std::string elf = Elf(200000);
  for (bool xz : {true, false}) {
    auto got = ExtractVmlinux(BzImage(Compress(elf, xz), 27, 0x3a0));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == elf);
  }
}

TEST(BootAssets, RefusesWhatIsNoBzImage) {
  EXPECT_FALSE(ExtractVmlinux("").ok());
  EXPECT_FALSE(ExtractVmlinux(std::string(4096, 'x')).ok());
  std::string b = BzImage(Compress("not an elf", true), 4, 0);
  EXPECT_FALSE(ExtractVmlinux(b).ok());
  // The kernel build's size_append: four bytes after the compressed stream.
  const std::string elf = Elf(100000);
  auto sized = ExtractVmlinux(BzImage(Compress(elf, true) + std::string("\xa0\x86\x01\x00", 4), 4, 0));
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_TRUE(*sized == elf);
  // A payload length past the end of the file.
  std::string cut = BzImage(Compress(std::string("\x7f" "ELF") + "x", true), 4, 0);
  cut.resize(cut.size() - 120);
  EXPECT_FALSE(ExtractVmlinux(cut).ok());
}

TEST(BootAssets, ModulesComeAfterWhatTheyNeed) {
  const std::string dep =
      "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n"
      "kernel/fs/jbd2/jbd2.ko:\n"
      "kernel/fs/mbcache.ko:\n"
      "kernel/lib/crc16.ko:\n"
      "kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n"
      "kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n"
      "kernel/drivers/virtio/virtio_ring.ko:\n";
  auto order = ModuleLoadOrder(dep, "kernel/fs/overlayfs/overlay.ko\n", {"virtio_mmio", "ext4", "overlay"});
  ASSERT_TRUE(order.ok()) << order.status();
  auto pos = [&](const std::string& p) {
    return std::find(order->begin(), order->end(), p) - order->begin();
  };
  EXPECT_EQ(order->size(), 7u);  // overlay is built in
  EXPECT_LT(pos("kernel/drivers/virtio/virtio_ring.ko"), pos("kernel/drivers/virtio/virtio.ko"));
  EXPECT_LT(pos("kernel/drivers/virtio/virtio.ko"), pos("kernel/drivers/virtio/virtio_mmio.ko"));
  EXPECT_LT(pos("kernel/fs/jbd2/jbd2.ko"), pos("kernel/fs/ext4/ext4.ko"));
  auto missing = ModuleLoadOrder(dep, "", {"9p"});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("9p"), std::string::npos);
}

TEST(Qemu, ArgvEscapesCommasAndListsEveryDiskAndShare) {
  QemuVm vm;
  vm.vmlinux = "/a/vmlinux";
  vm.initramfs = "/a/initramfs.cpio";
  vm.disks = {{"/s/guest.cfg", "sbxcfg", true}, {"/s/x,y/disk.img", "sbxdisk", false}};
  vm.serial_socket = "/s/serial.sock";
  vm.qmp_socket = "/s/qmp.sock";
  vm.console_log = "/s/console.log";
  vm.shares = {{"bind0", "/h/usr"}, {"lower0", "/t/root"}};
  vm.memory_mib = 256;
  vm.vcpus = 2;
  const auto argv = QemuArgv(vm);
  std::string all;
  for (const auto& a : argv) all += a + " ";
  EXPECT_NE(all.find("file=/s/x,,y/disk.img,format=raw,if=none,id=disk1,cache=none,aio=threads "), std::string::npos) << all;
  EXPECT_NE(all.find("file=/s/guest.cfg,format=raw,if=none,id=disk0,cache=none,aio=threads,readonly=on"), std::string::npos) << all;
  EXPECT_NE(all.find("virtio-blk-device,drive=disk0,serial=sbxcfg"), std::string::npos) << all;
  EXPECT_NE(all.find("mount_tag=bind0"), std::string::npos);
  EXPECT_EQ(all.find("-incoming"), std::string::npos);
  EXPECT_NE(all.find("path=/t/root,security_model=none,readonly=on"), std::string::npos);
  EXPECT_NE(all.find("-m 256M"), std::string::npos);
  EXPECT_NE(all.find("-smp 2"), std::string::npos);
  EXPECT_NE(all.find("-accel tcg,tb-size=64 -cpu max"), std::string::npos);
  vm.incoming_fd3 = true;
  all.clear();
  for (const auto& a : QemuArgv(vm)) all += a + " ";
  EXPECT_NE(all.find("-incoming fd:3 "), std::string::npos) << all;
}

TEST(Qemu, TcgParamsComeFromTheHostsTscAndTheKernelsHz) {
  EXPECT_EQ(TcgKernelParams("processor\t: 0\ncpu MHz\t\t: 2596.146\n", "\nCONFIG_HZ_250=y\nCONFIG_HZ=250\n"),
            "tsc_early_khz=2596146 no_timer_check lpj=10384584");
  EXPECT_EQ(TcgKernelParams("cpu MHz\t: 2000.000\n", ""), "tsc_early_khz=2000000 no_timer_check");
  EXPECT_EQ(TcgKernelParams("model name: x\n", "\nCONFIG_HZ=250\n"), "");
  EXPECT_EQ(TcgKernelParams("cpu MHz\t: nonsense\n", ""), "");
}

TEST(TreeImage, SizeCoversTheTreeAndGrowsWithIt) {
  const TreeSize small{.data_bytes = 4096, .inodes = 3};
  const TreeSize big{.data_bytes = uint64_t{1} << 30, .inodes = 30000};
  EXPECT_GE(TreeImageMib(small), 8);
  EXPECT_GT(TreeImageMib(big), 1024 + 30000 * 256 / (1 << 20));
  EXPECT_LT(TreeImageMib(big), 1024 * 13 / 10);
}

// mke2fs -d copies the tree; the image is made once and then found by the tree's identity.
TEST(TreeImage, MadeOnceFromTheTreeAndReused) {
  if (!FindProgram("mke2fs").ok()) SBX_SKIP_OR_FAIL("mke2fs (e2fsprogs) is not installed");
  namespace fs = std::filesystem;
  char tmp[] = "/tmp/sbx-tree-image-XXXXXX";
  ASSERT_NE(::mkdtemp(tmp), nullptr);
  const fs::path root = fs::path(tmp) / "tree", cache = fs::path(tmp) / "cache";
  fs::create_directories(root / "bin");
  std::ofstream(root / "bin" / "tool") << std::string(100000, 'x');
  fs::create_symlink("tool", root / "bin" / "link");
  fs::create_hard_link(root / "bin" / "tool", root / "bin" / "hard");
  auto measured = MeasureTree(root.string());
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->inodes, 5u);  // root, bin, tool, link, hard (a link counted as a file)
  auto image = TreeImage(root.string(), cache.string());
  ASSERT_TRUE(image.ok()) << image.status();
  struct stat st1, st2;
  ASSERT_EQ(::stat(image->c_str(), &st1), 0);
  EXPECT_EQ(st1.st_size, TreeImageMib(*measured) << 20);
  std::string out;
  auto rc = RunProgram({*FindProgram("debugfs"), "-R", "ls -l /bin", *image}, &out);
  ASSERT_TRUE(rc.ok());
  EXPECT_NE(out.find("tool"), std::string::npos) << out;
  EXPECT_NE(out.find("link"), std::string::npos) << out;
  auto again = TreeImage(root.string(), cache.string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *image);
  ASSERT_EQ(::stat(again->c_str(), &st2), 0);
  EXPECT_EQ(st1.st_ino, st2.st_ino);
  EXPECT_FALSE(TreeImage((fs::path(tmp) / "missing").string(), cache.string()).ok());
  fs::remove_all(tmp);
}

// A VMM that answers its control socket with hostile bytes (deep nesting, a line that never
// ends) gets an error within the deadline, never a crash or a hang of sbxd.
TEST(Qmp, HostileAnswersAreErrorsNotCrashes) {
  char dir[] = "/tmp/sbx-qmp-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/qmp.sock";
  for (const std::string& answer : {std::string(200000, '[') + "\n", std::string("{\"QMP\":1}\n") + std::string(2 << 20, 'x')}) {
    const int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    ::unlink(path.c_str());
    ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::listen(l, 1), 0);
    std::thread server([&] {
      const int c = ::accept(l, nullptr, nullptr);
      if (c >= 0) {
        (void)!::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
        char buf[256];
        while (::recv(c, buf, sizeof(buf), 0) > 0) {
        }
        ::close(c);
      }
    });
    auto st = QmpCommand(path, "query-status", nullptr, std::chrono::milliseconds(2000));
    EXPECT_FALSE(st.ok());
    ::shutdown(l, SHUT_RDWR);
    ::close(l);
    server.join();
  }
  ::unlink(path.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace sbx::runtime::microvm

namespace sbx::runtime::microvm {
namespace {

TEST(SharedAssets, TheSweepKeepsWhatAVmNamesOrLinksAndWhatIsNewAndRemovesTheRest) {
  namespace fs = std::filesystem;
  char t[] = "/tmp/sbx-assets-XXXXXX";
  ASSERT_NE(::mkdtemp(t), nullptr);
  const fs::path root(t), assets = root / "microvm-assets", vms = root / "vm";
  fs::create_directories(assets / "views" / "v-used");
  fs::create_directories(assets / "views" / "v-old");
  fs::create_directories(vms / "sbx_a" / "fc");
  for (const char* f : {"tree-used.img", "tree-old.img", "tree-new.img", "tree-linked.img", "golden-64m.img"}) {
    std::ofstream(assets / f) << f;
  }
  fs::create_hard_link(assets / "tree-linked.img", vms / "sbx_a" / "fc" / "drive2");
  std::ofstream(vms / "sbx_a" / "vm.json")
      << "{\"vmm_argv\":[\"-drive\",\"file=" << (assets / "tree-used.img").string() << ",format=raw\"]}";
  std::ofstream(vms / "sbx_a" / "jail.json") << "{\"binds\":[{\"path\":\"" << (assets / "views" / "v-used").string()
                                             << "\"}]}";
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(2);
  for (const char* p : {"tree-used.img", "tree-old.img", "tree-linked.img", "views/v-used", "views/v-old"}) {
    fs::last_write_time(assets / p, old);
  }
  std::vector<std::string> removed = SweepSharedAssets(assets.string(), vms.string(), 600);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{(assets / "tree-old.img").string(), (assets / "views" / "v-old").string()}));
  for (const char* kept : {"tree-used.img", "tree-new.img", "tree-linked.img", "golden-64m.img", "views/v-used"}) {
    EXPECT_TRUE(fs::exists(assets / kept)) << kept;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace sbx::runtime::microvm

// The layer unpacker, the layer store and the imports, on layers and archives made here
// (libarchive's writer) and by Debian's skopeo. Root: layers keep owners and make devices.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/digest.h"
#include "common/test_util.h"
#include "common/unique_fd.h"
#include "image/image.h"
#include "image/layer_unpack.h"
#include "image/oci.h"

namespace sbx::image {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

struct E {
  std::string name;
  mode_t type = AE_IFREG;
  std::string data;
  std::string link;   // symlink target or hard link name
  bool hard = false;
  int uid = 0, gid = 0;
  mode_t mode = 0644;
  dev_t rdev = 0;
  std::vector<std::pair<std::string, std::string>> xattrs;
  int64_t size = -1;  // declared size; -1: data's
};

// A tar (pax) of `es`, then compressed with `filter` ("", "gzip", "zstd").
struct Sink {
  std::string out;
  size_t cap;
};
std::string Tar(const std::vector<E>& es, const std::string& filter = "",
                size_t cap = size_t{512} << 20) {
  Sink sink{{}, cap};
  ::archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (filter == "gzip") archive_write_add_filter_gzip(a);
  if (filter == "zstd") archive_write_add_filter_zstd(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(
      a, &sink, nullptr,
      [](::archive*, void* c, const void* buf, size_t n) -> la_ssize_t {
        // A huge declared size is padded with zeros by the writer: only its start is kept
        // (a truncated stream, which is what a lying layer is).
        auto* s = static_cast<Sink*>(c);
        if (s->out.size() >= s->cap) return -1;  // stops the writer
        s->out.append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  for (const E& e : es) {
    archive_entry* en = archive_entry_new();
    archive_entry_set_pathname(en, e.name.c_str());
    archive_entry_set_uid(en, e.uid);
    archive_entry_set_gid(en, e.gid);
    archive_entry_set_perm(en, e.mode);
    archive_entry_set_mtime(en, 1700000000, 0);
    for (const auto& [k, v] : e.xattrs) archive_entry_xattr_add_entry(en, k.c_str(), v.data(), v.size());
    if (e.hard) {
      archive_entry_set_filetype(en, AE_IFREG);
      archive_entry_set_hardlink(en, e.link.c_str());
      archive_entry_set_size(en, 0);
    } else {
      archive_entry_set_filetype(en, e.type);
      if (e.type == AE_IFLNK) archive_entry_set_symlink(en, e.link.c_str());
      if (e.type == AE_IFCHR || e.type == AE_IFBLK) archive_entry_set_rdev(en, e.rdev);
      archive_entry_set_size(en, e.type == AE_IFREG ? (e.size >= 0 ? e.size : static_cast<int64_t>(e.data.size())) : 0);
    }
    archive_write_header(a, en);
    if (e.type == AE_IFREG && !e.hard && !e.data.empty()) archive_write_data(a, e.data.data(), e.data.size());
    archive_entry_free(en);
  }
  archive_write_close(a);
  archive_write_free(a);
  return sink.out;
}

std::string DiffId(const std::string& plain) { return "sha256:" + Sha256Hex(plain); }

void WriteFile(const fs::path& p, const std::string& data) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << data;
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) SBX_SKIP_OR_FAIL("layers keep owners and make whiteouts: needs root");
    char t[] = "/tmp/sbx-image-test-XXXXXX";
    ASSERT_NE(::mkdtemp(t), nullptr);
    dir_ = t;
    fs::create_directories(dir_ / "outside");
    WriteFile(dir_ / "outside" / "sentinel", "keep");
  }
  void TearDown() override {
    if (!dir_.empty()) (void)RemoveTree(dir_.string());
  }
  // Unpacks `blob` (written to a file) into a fresh directory.
  absl::StatusOr<UnpackResult> Unpack(const std::string& blob, const std::string& diff_id,
                                      uint64_t max_bytes = 1 << 30, uint64_t max_entries = 1000000,
                                      CancelFn cancel = {}) {
    WriteFile(dir_ / "blob", blob);
    dest_ = dir_ / ("dest" + std::to_string(n_++));
    fs::create_directories(dest_);
    return UnpackLayer((dir_ / "blob").string(), dest_.string(), diff_id,
                       UnpackLimits{max_bytes, max_entries}, {}, cancel);
  }
  // Nothing of an unpack reached outside its directory.
  void ExpectOutsideUntouched() {
    EXPECT_EQ(ReadAll(dir_ / "outside" / "sentinel"), "keep");
    size_t n = 0;
    for (auto& e : fs::directory_iterator(dir_ / "outside")) (void)e, ++n;
    EXPECT_EQ(n, 1u);
    EXPECT_FALSE(fs::exists("/etc/sbx-image-test-escape"));
  }
  fs::path dir_, dest_;
  int n_ = 0;
};

TEST_F(ImageTest, UnpacksEveryKindOfEntryWithOwnersModesAndUserXattrs) {
  const std::vector<E> es = {
      {.name = "etc/", .type = AE_IFDIR, .mode = 0755},
      {.name = "etc/passwd", .data = "app:x:1000:1000::/home/app:/bin/sh\n"},
      {.name = "home/app/", .type = AE_IFDIR, .uid = 1000, .gid = 1000, .mode = 0750},
      {.name = "home/app/f", .data = "hello", .uid = 1000, .gid = 1000, .mode = 0600,
       .xattrs = {{"user.keep", "1"}, {"trusted.overlay.opaque", "y"}, {"security.capability", "x"}}},
      {.name = "bin/su", .data = "#!", .mode = 04755},
      {.name = "bin/sh", .type = AE_IFLNK, .link = "/bin/busybox"},
      {.name = "bin/hard", .link = "bin/su", .hard = true},
      {.name = "run/fifo", .type = AE_IFIFO, .mode = 0600},
      {.name = "dev/sda", .type = AE_IFBLK, .rdev = makedev(8, 0)},
  };
  const std::string plain = Tar(es);
  for (const char* filter : {"", "gzip", "zstd"}) {
    SCOPED_TRACE(filter);
    auto r = Unpack(Tar(es, filter), DiffId(plain));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->diff_id, DiffId(plain));
    EXPECT_EQ(r->skipped, 1u);  // the block device
    struct stat st {};
    ASSERT_EQ(::lstat((dest_ / "home/app/f").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 1000u);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    ASSERT_EQ(::lstat((dest_ / "bin/su").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 04755u);
    EXPECT_EQ(st.st_nlink, 2u);
    EXPECT_EQ(fs::read_symlink(dest_ / "bin/sh"), "/bin/busybox");
    EXPECT_TRUE(fs::is_fifo(fs::symlink_status(dest_ / "run/fifo")));
    EXPECT_FALSE(fs::exists(dest_ / "dev/sda"));
    char v[8] = {};
    EXPECT_EQ(::getxattr((dest_ / "home/app/f").c_str(), "user.keep", v, sizeof v), 1);
    EXPECT_LT(::getxattr((dest_ / "home/app/f").c_str(), "trusted.overlay.opaque", v, sizeof v), 0);
    EXPECT_LT(::getxattr((dest_ / "home/app/f").c_str(), "security.capability", v, sizeof v), 0);
  }
}

TEST_F(ImageTest, OciWhiteoutsBecomeOverlayWhiteoutsAndOpaqueDirectories) {
  const std::vector<E> es = {
      {.name = "gone/.wh.file"},
      {.name = ".wh.top"},
      {.name = "data/", .type = AE_IFDIR, .mode = 0755},
      {.name = "data/.wh..wh..opq"},
      {.name = "data/new", .data = "n"},
  };
  auto r = Unpack(Tar(es), DiffId(Tar(es)));
  ASSERT_TRUE(r.ok()) << r.status();
  struct stat st {};
  ASSERT_EQ(::lstat((dest_ / "gone/file").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(0, 0));
  ASSERT_EQ(::lstat((dest_ / "top").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_FALSE(fs::exists(dest_ / "gone/.wh.file"));
  char v[4] = {};
  EXPECT_EQ(::getxattr((dest_ / "data").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
  EXPECT_EQ(::getxattr((dest_ / "data").c_str(), "user.overlay.opaque", v, sizeof v), 1);
  EXPECT_FALSE(fs::exists(dest_ / "data/.wh..wh..opq"));
}

TEST_F(ImageTest, HostileLayersFailOrStayInsideTheirDirectory) {
  struct Case {
    std::string what;
    std::vector<E> es;
    absl::StatusCode code;  // kOk: unpacks, contained
  };
  const std::vector<Case> cases = {
      {"dotdot", {{.name = "../outside/x", .data = "evil"}}, absl::StatusCode::kInvalidArgument},
      {"deep dotdot", {{.name = "a/../../outside/x", .data = "evil"}}, absl::StatusCode::kInvalidArgument},
      {"absolute", {{.name = "/etc/sbx-image-test-escape", .data = "x"}}, absl::StatusCode::kOk},
      {"symlink then through it",
       {{.name = "evil", .type = AE_IFLNK, .link = "/"},
        {.name = "evil/etc/sbx-image-test-escape", .data = "x"}},
       absl::StatusCode::kOk},
      {"symlink out then through it",
       {{.name = "up", .type = AE_IFLNK, .link = "../../../../outside"},
        {.name = "up/x", .data = "x"}},
       absl::StatusCode::kInvalidArgument},
      {"hard link above", {{.name = "h", .link = "../../outside/sentinel", .hard = true}},
       absl::StatusCode::kInvalidArgument},
      {"hard link absolute", {{.name = "h", .link = "/etc/passwd", .hard = true}},
       absl::StatusCode::kInvalidArgument},
      {"hard link through a symlink",
       {{.name = "l", .type = AE_IFLNK, .link = "/etc"}, {.name = "h", .link = "l/passwd", .hard = true}},
       absl::StatusCode::kInvalidArgument},
      {"deep nesting", {{.name = [] { std::string s; for (int i = 0; i < 600; ++i) s += "d/"; return s + "f"; }(), .data = "x"}},
       absl::StatusCode::kInvalidArgument},
      {"long name", {{.name = std::string(300, 'n'), .data = "x"}}, absl::StatusCode::kInvalidArgument},
      {"huge sparse claim", {{.name = "big", .data = "", .size = int64_t{1} << 40}},
       absl::StatusCode::kResourceExhausted},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string tar = Tar(c.es, "", 1 << 20);
    auto r = Unpack(tar, DiffId(tar), 64 << 20);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    ExpectOutsideUntouched();
  }
  // The contained forms landed inside.
  EXPECT_TRUE(fs::exists(dir_ / "dest2/etc/sbx-image-test-escape"));
  EXPECT_TRUE(fs::exists(dir_ / "dest3/etc/sbx-image-test-escape"));
}

TEST_F(ImageTest, BombsLiesAndLimitsStopEarly) {
  // A gzip of 256 MiB of zeros: a tar's end blocks, then more zeros than any file could take.
  std::string zeros;
  {
    ::archive* a = archive_write_new();
    archive_write_set_format_raw(a);
    archive_write_add_filter_gzip(a);
    archive_write_open(
        a, &zeros, nullptr,
        [](::archive*, void* c, const void* buf, size_t n) -> la_ssize_t {
          static_cast<std::string*>(c)->append(static_cast<const char*>(buf), n);
          return static_cast<la_ssize_t>(n);
        },
        nullptr);
    archive_entry* en = archive_entry_new();
    archive_entry_set_filetype(en, AE_IFREG);
    archive_write_header(a, en);
    std::string mib(1 << 20, '\0');
    for (int i = 0; i < 256; ++i) archive_write_data(a, mib.data(), mib.size());
    archive_entry_free(en);
    archive_write_close(a);
    archive_write_free(a);
  }
  ASSERT_LT(zeros.size(), 4u << 20);
  const auto t0 = std::chrono::steady_clock::now();
  auto bomb = Unpack(zeros, DiffId("x"), 16 << 20, 1000);
  EXPECT_EQ(bomb.status().code(), absl::StatusCode::kResourceExhausted) << bomb.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));

  const std::string tar = Tar({{.name = "a", .data = "1"}, {.name = "b", .data = "2"}});
  EXPECT_EQ(Unpack(tar, DiffId("not it")).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Unpack(tar, DiffId(tar), 1 << 20, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Unpack(tar.substr(0, 700), DiffId(tar)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Unpack(Tar({{.name = "a", .data = "1"}}, "gzip").substr(0, 30), DiffId(tar)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Unpack(tar, DiffId(tar), 1 << 20, 100, [] { return true; }).status().code(),
            absl::StatusCode::kCancelled);
  // Many entries in one directory: bounded by the entry limit, in bounded time (20k here:
  // each costs an inode on the test's file system, ~0.3 ms on the project's machines).
  std::vector<E> many;
  for (int i = 0; i < 20000; ++i) many.push_back({.name = "d/" + std::to_string(i)});
  const std::string big = Tar(many);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(Unpack(big, DiffId(big), 1 << 30, 5000).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto all = Unpack(big, DiffId(big));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->entries, 20000u);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(120));
}

TEST_F(ImageTest, RemoveTreeTakesDeepAndWideTreesWithoutFollowingLinks) {
  // 500 levels (the unpacker allows 512) and a directory of 5,000 entries, with a symlink out
  // of the tree inside: the tree goes, what the link points at stays.
  std::string deep;
  for (int i = 0; i < 500; ++i) deep += "d/";
  std::vector<E> es = {{.name = deep + "f", .data = "x"},
                       {.name = "wide/out", .type = AE_IFLNK, .link = (dir_ / "outside").string()}};
  for (int i = 0; i < 5000; ++i) es.push_back({.name = "wide/" + std::to_string(i)});
  const std::string tar = Tar(es);
  ASSERT_TRUE(Unpack(tar, DiffId(tar)).ok());
  ASSERT_TRUE(fs::exists(dest_ / (deep + "f")));
  ASSERT_TRUE(RemoveTree(dest_.string()).ok());
  EXPECT_FALSE(fs::exists(dest_));
  ExpectOutsideUntouched();
  EXPECT_TRUE(RemoveTree(dest_.string()).ok());  // gone already: nothing to do
}

TEST_F(ImageTest, TheStoreUnpacksOnceSharesAndLeavesNothingOfAFailure) {
  Limits limits;
  auto store = LayerStore::Open((dir_ / "store").string(), limits);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string tar = Tar({{.name = "f", .data = "layer"}});
  WriteFile(dir_ / "l.tar", tar);
  const std::string blob = (dir_ / "l.tar").string();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      if ((*store)->Put(blob, DiffId(tar), 1 << 20, {}, {}).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  ASSERT_TRUE((*store)->Has(DiffId(tar)));
  auto tree = (*store)->TreeOf(DiffId(tar));
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(ReadAll(*tree + "/f"), "layer");
  EXPECT_EQ((*store)->UsedBytes(), 5u);
  EXPECT_EQ(fs::status(dir_ / "store").permissions() & fs::perms::all, fs::perms::owner_all);

  auto bad = (*store)->Put(blob, DiffId("other"), 1 << 20, {}, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(fs::is_empty(dir_ / "store/tmp"));
  EXPECT_FALSE((*store)->Has(DiffId("other")));

  // A crash's leftovers go at the next sweep; the stored layer stays.
  fs::create_directories(dir_ / "store/tmp/half/x");
  fs::create_directories(dir_ / "store/layers/sha256" / std::string(64, 'a'));
  ASSERT_TRUE((*store)->Sweep().ok());
  EXPECT_TRUE(fs::is_empty(dir_ / "store/tmp"));
  EXPECT_FALSE(fs::exists(dir_ / "store/layers/sha256" / std::string(64, 'a')));
  auto reopened = LayerStore::Open((dir_ / "store").string(), limits);
  ASSERT_TRUE(reopened.ok());
  EXPECT_TRUE((*reopened)->Has(DiffId(tar)));
  ASSERT_TRUE((*reopened)->Remove(DiffId(tar)).ok());
  EXPECT_FALSE((*reopened)->Has(DiffId(tar)));
  EXPECT_FALSE(fs::exists(*tree));
}

TEST_F(ImageTest, AClusterNodeKeepsTheVerifiedBlobOfEachLayerItUnpacks) {
  Limits limits;
  limits.keep_blobs = true;
  auto store = LayerStore::Open((dir_ / "store").string(), limits);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string tar = Tar({{.name = "f", .data = "layer"}}, "gzip");
  WriteFile(dir_ / "l.tar.gz", tar);
  // As an import hands them over: the blob opened, named by /proc/self/fd.
  UniqueFd fd(::open((dir_ / "l.tar.gz").c_str(), O_RDONLY | O_CLOEXEC));
  const std::string plain = Tar({{.name = "f", .data = "layer"}});
  const std::string diff_id = DiffId(plain);
  ASSERT_TRUE((*store)->Put("/proc/self/fd/" + std::to_string(fd.get()), diff_id, 1 << 20, {}, {}).ok());
  fs::remove(dir_ / "l.tar.gz");  // the import's copy goes; the kept one stays
  auto blob = (*store)->BlobOf(diff_id);
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(ReadAll(*blob), tar);  // as put: compressed, so another node verifies it itself
  // A blob that fails its diff_id is not kept, nor is anything of it.
  WriteFile(dir_ / "bad.tar", Tar({{.name = "f", .data = "other"}}));
  EXPECT_FALSE((*store)->Put((dir_ / "bad.tar").string(), DiffId("nope"), 1 << 20, {}, {}).ok());
  EXPECT_EQ((*store)->BlobOf(DiffId("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->BlobOf("sha256:zz").status().code(), absl::StatusCode::kInvalidArgument);
  // A sweep takes half-copied blobs and those whose layer is gone; Remove takes the blob too.
  WriteFile(dir_ / "store/blobs/tmp-half", "x");
  WriteFile(dir_ / "store/blobs" / std::string(64, 'b'), "x");
  ASSERT_TRUE((*store)->Sweep().ok());
  EXPECT_FALSE(fs::exists(dir_ / "store/blobs/tmp-half"));
  EXPECT_FALSE(fs::exists(dir_ / "store/blobs" / std::string(64, 'b')));
  EXPECT_TRUE((*store)->BlobOf(diff_id).ok());
  ASSERT_TRUE((*store)->Remove(diff_id).ok());
  EXPECT_FALSE(fs::exists(*blob));

  // A single host keeps none.
  auto single = LayerStore::Open((dir_ / "single").string(), Limits{});
  ASSERT_TRUE(single.ok());
  WriteFile(dir_ / "l.tar", plain);
  ASSERT_TRUE((*single)->Put((dir_ / "l.tar").string(), diff_id, 1 << 20, {}, {}).ok());
  EXPECT_EQ((*single)->BlobOf(diff_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(fs::is_empty(dir_ / "single/blobs"));
}

// An OCI layout of two layers written here; skopeo turns it into the archives users bring.
struct Layout {
  std::string manifest_digest;
  std::vector<std::string> diff_ids;
};
Layout WriteLayout(const fs::path& dir, const std::string& arch_extra = "") {
  Layout out;
  const std::string l1 = Tar({{.name = "etc/", .type = AE_IFDIR, .mode = 0755},
                              {.name = "etc/os-release", .data = "ID=test\n"},
                              {.name = "gone", .data = "x"}});
  const std::string l2 = Tar({{.name = ".wh.gone"}, {.name = "app/run.sh", .data = "echo hi\n", .mode = 0755}});
  auto blob = [&](const std::string& data) {
    const std::string d = "sha256:" + Sha256Hex(data);
    WriteFile(dir / "blobs/sha256" / d.substr(7), data);
    return d;
  };
  std::string g1;  // layer 1 gzip-compressed, layer 2 plain
  g1 = Tar({{.name = "etc/", .type = AE_IFDIR, .mode = 0755},
            {.name = "etc/os-release", .data = "ID=test\n"},
            {.name = "gone", .data = "x"}}, "gzip");
  out.diff_ids = {DiffId(l1), DiffId(l2)};
  json config = {{"architecture", "amd64"}, {"os", "linux"},
                 {"config", {{"Env", {"PATH=/usr/bin:/bin", "APP=1"}}, {"WorkingDir", "/app"},
                             {"User", "1000:1000"}, {"Cmd", {"/app/run.sh"}}}},
                 {"rootfs", {{"type", "layers"}, {"diff_ids", out.diff_ids}}}};
  const std::string ctext = config.dump();
  json manifest = {{"schemaVersion", 2}, {"mediaType", std::string(oci::kOciManifest)},
                   {"config", {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                               {"digest", blob(ctext)}, {"size", ctext.size()}}},
                   {"layers", {{{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                                {"digest", blob(g1)}, {"size", g1.size()}},
                               {{"mediaType", "application/vnd.oci.image.layer.v1.tar"},
                                {"digest", blob(l2)}, {"size", l2.size()}}}}};
  const std::string mtext = manifest.dump();
  out.manifest_digest = blob(mtext);
  json entries = json::array();
  entries.push_back({{"mediaType", std::string(oci::kOciManifest)}, {"digest", out.manifest_digest},
                     {"size", mtext.size()}, {"platform", {{"os", "linux"}, {"architecture", "amd64"}}},
                     {"annotations", {{"org.opencontainers.image.ref.name", "t"}}}});
  if (!arch_extra.empty()) {
    entries.push_back({{"mediaType", std::string(oci::kOciManifest)}, {"digest", blob(arch_extra)},
                       {"size", arch_extra.size()}, {"platform", {{"os", "linux"}, {"architecture", "arm64"}}}});
  }
  WriteFile(dir / "index.json", json{{"schemaVersion", 2}, {"manifests", entries}}.dump());
  WriteFile(dir / "oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  return out;
}

int RunTool(const std::vector<std::string>& argv) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST_F(ImageTest, ImportsLayoutsAndTheArchivesSkopeoWrites) {
  const Layout lay = WriteLayout(dir_ / "layout");
  auto store = LayerStore::Open((dir_ / "store").string(), Limits{});
  ASSERT_TRUE(store.ok());
  auto img = ImportLayout((dir_ / "layout").string(), "", **store, {}, {});
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_EQ(img->digest, lay.manifest_digest);
  ASSERT_EQ(img->layers.size(), 2u);
  EXPECT_EQ(img->layers[0].diff_id, lay.diff_ids[0]);
  EXPECT_EQ(img->config.working_dir, "/app");
  EXPECT_EQ(img->config.user, "1000:1000");
  EXPECT_THAT(img->config.env, ::testing::ElementsAre("PATH=/usr/bin:/bin", "APP=1"));
  auto top = (*store)->TreeOf(lay.diff_ids[1]);
  ASSERT_TRUE(top.ok());
  struct stat st {};
  ASSERT_EQ(::lstat((*top + "/gone").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));

  if (::access("/usr/bin/skopeo", X_OK) != 0) SBX_SKIP_OR_FAIL("skopeo is not installed");
  const std::string src = "oci:" + (dir_ / "layout").string() + ":t";
  ASSERT_EQ(RunTool({"skopeo", "copy", "-q", src, "docker-archive:" + (dir_ / "d.tar").string() + ":img:t"}), 0);
  ASSERT_EQ(RunTool({"skopeo", "copy", "-q", src, "oci-archive:" + (dir_ / "o.tar").string() + ":t"}), 0);
  for (const char* file : {"d.tar", "o.tar"}) {
    SCOPED_TRACE(file);
    auto fresh = LayerStore::Open((dir_ / (std::string("store-") + file)).string(), Limits{});
    ASSERT_TRUE(fresh.ok());
    auto a = ImportArchive((dir_ / file).string(), "", **fresh, {}, {});
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->layers.size(), 2u);
    EXPECT_EQ(a->layers[0].diff_id, lay.diff_ids[0]);
    EXPECT_EQ(a->layers[1].diff_id, lay.diff_ids[1]);
    EXPECT_EQ(a->config.working_dir, "/app");
    // Nothing of the archive's unpacking is left beside it.
    for (auto& e : fs::directory_iterator(dir_)) {
      EXPECT_EQ(e.path().filename().string().rfind(".import-", 0), std::string::npos);
    }
    // The same archive again is the same release.
    auto again = ImportArchive((dir_ / file).string(), "", **fresh, {}, {});
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->digest, a->digest);
  }
}

TEST_F(ImageTest, LyingOrHostileImagesFailWithoutLeavingAnything) {
  auto store = LayerStore::Open((dir_ / "store").string(), Limits{});
  ASSERT_TRUE(store.ok());
  // An index of two platforms: amd64 is chosen.
  Layout multi = WriteLayout(dir_ / "multi", R"({"schemaVersion":2,"config":{},"layers":[]})");
  auto m = ImportLayout((dir_ / "multi").string(), "", **store, {}, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->digest, multi.manifest_digest);

  auto edit = [&](const std::string& name, const std::function<void(const fs::path&, Layout&)>& f) {
    fs::path d = dir_ / name;
    Layout l = WriteLayout(d);
    f(d, l);
    return ImportLayout(d.string(), "", **store, {}, {});
  };
  auto index_of = [](const fs::path& d) { return json::parse(ReadAll(d / "index.json")); };
  // The index lies about the manifest's size.
  auto r = edit("size-lie", [&](const fs::path& d, Layout&) {
    json i = index_of(d);
    i["manifests"][0]["size"] = i["manifests"][0]["size"].get<int>() + 1;
    WriteFile(d / "index.json", i.dump());
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  // A blob that is not what its name says.
  r = edit("digest-lie", [&](const fs::path& d, Layout& l) {
    WriteFile(d / "blobs/sha256" / l.manifest_digest.substr(7), "{}");
  });
  EXPECT_FALSE(r.ok());
  // A manifest blob that is a symlink to a host file.
  r = edit("symlink-blob", [&](const fs::path& d, Layout& l) {
    fs::remove(d / "blobs/sha256" / l.manifest_digest.substr(7));
    fs::create_symlink("/etc/passwd", d / "blobs/sha256" / l.manifest_digest.substr(7));
  });
  EXPECT_FALSE(r.ok());
  // No linux/amd64 image.
  r = edit("no-amd64", [&](const fs::path& d, Layout&) {
    json i = index_of(d);
    i["manifests"][0]["platform"]["architecture"] = "arm64";
    i["manifests"].push_back(i["manifests"][0]);
    WriteFile(d / "index.json", i.dump());
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  // Not JSON, and too big.
  r = edit("not-json", [&](const fs::path& d, Layout&) { WriteFile(d / "index.json", "{"); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  r = edit("huge", [&](const fs::path& d, Layout&) {
    WriteFile(d / "index.json", std::string(5 << 20, ' '));
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::is_empty(dir_ / "store/tmp"));

  // An archive whose entries climb out of its directory.
  const std::string evil = Tar({{.name = "../outside/x", .data = "evil"}, {.name = "index.json", .data = "{}"}});
  WriteFile(dir_ / "evil.tar", evil);
  auto a = ImportArchive((dir_ / "evil.tar").string(), "", **store, {}, {});
  EXPECT_FALSE(a.ok());
  ExpectOutsideUntouched();
  for (auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().rfind(".import-", 0), std::string::npos);
  }
  // Cancelled before it read anything.
  WriteFile(dir_ / "some.tar", Tar({{.name = "x", .data = "1"}}));
  EXPECT_EQ(ImportArchive((dir_ / "some.tar").string(), "", **store, {}, [] { return true; })
                .status()
                .code(),
            absl::StatusCode::kCancelled);
}

TEST(OciParsers, RefuseWhatIsNotAnImage) {
  EXPECT_FALSE(oci::ParseManifest(R"({"schemaVersion":1})").ok());
  EXPECT_FALSE(oci::ParseManifest(R"({"schemaVersion":2,"config":{"digest":"sha256:x","size":1},"layers":[]})").ok());
  const std::string d = "sha256:" + std::string(64, 'a');
  EXPECT_FALSE(oci::ParseManifest(R"({"schemaVersion":2,"config":{"digest":")" + d +
                                  R"(","size":1},"layers":[{"mediaType":"text/html","digest":")" + d +
                                  R"(","size":1}]})").ok());
  EXPECT_FALSE(oci::ParseConfig(R"({"os":"windows","rootfs":{"diff_ids":[]}})").ok());
  EXPECT_FALSE(oci::ParseConfig(R"({"rootfs":{"diff_ids":["md5:x"]}})").ok());
  EXPECT_FALSE(oci::ParseConfig(R"({"config":{"Env":"PATH"},"rootfs":{"diff_ids":[]}})").ok());
  EXPECT_FALSE(oci::ParseDockerManifest("[]").ok());
  EXPECT_FALSE(oci::ParseIndex(R"({"manifests":[{"digest":")" + d + R"(","size":-1}]})").ok());
}

}  // namespace
}  // namespace sbx::image

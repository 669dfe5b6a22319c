// COPY of a template build (build_context.h): context tars made with the project's tar writer,
// WriteCopyTar's output read back with archive::TarReader. Docker's selection and renaming
// rules, the entries of an untrusted context that must never be selected (`..`, absolute
// names), links, --chmod, owners, the digest, and the errors. ADD's unpacking of archives,
// compressed with libarchive's writer here, and the bound on the data written.
#include "image/build_context.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "archive/tar.h"
#include "common/digest.h"
#include "common/files.h"

namespace sbx::image {
namespace {

namespace fs = std::filesystem;
using archive::TarEntry;
using archive::TarType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Context entries: owned by 1000:1000 so that the output's zero owners show.
TarEntry Entry(std::string name, TarType type, uint32_t mode, uint64_t size = 0,
               std::string link = "") {
  return TarEntry{std::move(name), type, mode, 1000, 1000, 1700000000, size, std::move(link)};
}
std::pair<TarEntry, std::string> File(std::string name, std::string data, uint32_t mode = 0644) {
  const uint64_t size = data.size();
  return {Entry(std::move(name), TarType::kFile, mode, size), std::move(data)};
}
std::pair<TarEntry, std::string> Dir(std::string name, uint32_t mode = 0755) {
  return {Entry(std::move(name), TarType::kDirectory, mode), ""};
}
std::pair<TarEntry, std::string> Symlink(std::string name, std::string target) {
  return {Entry(std::move(name), TarType::kSymlink, 0777, 0, std::move(target)), ""};
}
std::pair<TarEntry, std::string> HardLink(std::string name, std::string target) {
  return {Entry(std::move(name), TarType::kHardLink, 0644, 0, std::move(target)), ""};
}

std::string Tar(const std::vector<std::pair<TarEntry, std::string>>& entries) {
  std::string out;
  for (const auto& [e, data] : entries) {
    EXPECT_TRUE(archive::AppendTarHeader(out, e).ok()) << e.name;
    out += data;
    out.append(archive::TarPadding(data.size()));
  }
  out.append(archive::TarTrailer());
  return out;
}

// One header block of `type` (which our writer does not make) for `size` bytes of data.
std::string RawHeader(const std::string& name, char type, uint64_t size) {
  std::string h;
  EXPECT_TRUE(archive::AppendTarHeader(h, Entry(name, TarType::kFile, 0644, size)).ok());
  EXPECT_EQ(h.size(), archive::kTarBlock);
  h[156] = type;
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);  // 6 digits, NUL; the space stays
  return h;
}

std::string PaxRecord(const std::string& key, const std::string& value) {
  const size_t base = key.size() + value.size() + 3;
  size_t len = base + 1;
  while (std::to_string(len).size() + base != len) ++len;
  return fmt::format("{} {}={}\n", len, key, value);
}

// `data` compressed by libarchive's writer with `filter` ("gzip", "bzip2", "xz", "zstd"; ""
// leaves it as it is).
std::string Compress(const std::string& data, const std::string& filter) {
  if (filter.empty()) return data;
  std::string out;
  ::archive* a = archive_write_new();
  EXPECT_EQ(archive_write_add_filter_by_name(a, filter.c_str()), ARCHIVE_OK) << filter;
  EXPECT_EQ(archive_write_set_format_raw(a), ARCHIVE_OK);
  EXPECT_EQ(archive_write_set_bytes_in_last_block(a, 1), ARCHIVE_OK);
  auto write = [](::archive*, void* client, const void* buf, size_t n) -> la_ssize_t {
    static_cast<std::string*>(client)->append(static_cast<const char*>(buf), n);
    return static_cast<la_ssize_t>(n);
  };
  EXPECT_EQ(archive_write_open(a, &out, nullptr, write, nullptr), ARCHIVE_OK)
      << archive_error_string(a);
  ::archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, "data");
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  EXPECT_EQ(archive_write_header(a, e), ARCHIVE_OK) << archive_error_string(a);
  EXPECT_EQ(archive_write_data(a, data.data(), data.size()), static_cast<la_ssize_t>(data.size()));
  EXPECT_EQ(archive_write_close(a), ARCHIVE_OK) << archive_error_string(a);
  archive_entry_free(e);
  archive_write_free(a);
  return out;
}

// The header block of `h` (one block) as a v7 tar has it: no "ustar" magic, version or the
// fields after them.
std::string V7(std::string h) {
  std::memset(h.data() + 257, 0, archive::kTarBlock - 257);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

struct OutEntry {
  TarEntry e;
  std::string data;
};

class BuildContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/sbx-build-context-test-XXXXXX";
    ASSERT_NE(::mkdtemp(t), nullptr);
    dir_ = t;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  std::string ContextPath() const { return (dir_ / "context.tar").string(); }
  std::string OutPath() const { return (dir_ / "out.tar").string(); }

  void WriteBytes(const std::string& path, const std::string& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    ASSERT_EQ(std::fclose(f), 0);
  }
  void Context(const std::vector<std::pair<TarEntry, std::string>>& entries) {
    WriteBytes(ContextPath(), Tar(entries));
  }

  // WriteCopyTar of the context into a fresh out.tar.
  absl::StatusOr<CopyResult> Copy(std::vector<std::string> sources, std::string dest,
                                  std::optional<uint32_t> chmod = std::nullopt,
                                  const CancelFn& cancelled = {}) {
    return Write(CopySpec{std::move(sources), std::move(dest), chmod}, cancelled);
  }
  absl::StatusOr<CopyResult> Write(const CopySpec& spec, const CancelFn& cancelled = {}) {
    const int fd = ::open(OutPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    auto r = WriteCopyTar(ContextPath(), spec, fd, cancelled);
    ::close(fd);
    return r;
  }
  // ADD: COPY that unpacks archives, with a bound on the data.
  absl::StatusOr<CopyResult> Add(std::vector<std::string> sources, std::string dest,
                                 uint64_t max_bytes = UINT64_MAX,
                                 std::optional<uint32_t> chmod = std::nullopt,
                                 const CancelFn& cancelled = {}) {
    CopySpec spec{std::move(sources), std::move(dest), chmod};
    spec.unpack_archives = true;
    spec.max_bytes = max_bytes;
    return Write(spec, cancelled);
  }
  std::vector<std::string> AddNames(std::vector<std::string> sources, std::string dest) {
    auto r = Add(std::move(sources), std::move(dest));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? OutNames() : std::vector<std::string>{};
  }

  std::string OutBytes() const {
    auto b = ReadFileToString(OutPath());
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *b : std::string();
  }

  // The output tar's entries with their data.
  std::vector<OutEntry> ReadOut() {
    const std::string bytes = OutBytes();
    bool given = false;
    archive::TarReader reader([&]() -> absl::StatusOr<std::string_view> {
      if (given) return std::string_view();
      given = true;
      return std::string_view(bytes);
    });
    std::vector<OutEntry> out;
    for (;;) {
      auto next = reader.Next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      OutEntry o{**next, ""};
      for (;;) {
        auto piece = reader.Read();
        EXPECT_TRUE(piece.ok()) << piece.status();
        if (!piece.ok() || piece->bytes.empty()) break;
        if (o.data.size() < piece->offset) o.data.resize(piece->offset, '\0');
        o.data.append(piece->bytes);
      }
      out.push_back(std::move(o));
    }
    return out;
  }
  std::vector<std::string> OutNames() {
    std::vector<std::string> names;
    for (const OutEntry& o : ReadOut()) names.push_back(o.e.name);
    return names;
  }
  // The output names after a successful copy.
  std::vector<std::string> CopyNames(std::vector<std::string> sources, std::string dest) {
    auto r = Copy(std::move(sources), std::move(dest));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? OutNames() : std::vector<std::string>{};
  }
  const OutEntry* Find(const std::vector<OutEntry>& out, const std::string& name) {
    for (const OutEntry& o : out) {
      if (o.e.name == name) return &o;
    }
    ADD_FAILURE() << name << " is not in the output";
    return nullptr;
  }

  // A small project, as `tar -C dir .` makes it ("./" names included).
  void Project() {
    Context({Dir("./"), Dir("./src"), File("./src/main.py", "print(1)\n", 0755),
             Dir("./src/sub"), File("./src/sub/x", "x-data"), File("./README", "read me"),
             File("./a.py", "a"), File("./b.py", "bb"), File("./c.txt", "c")});
  }

  fs::path dir_;
};

TEST(NormalizeContextPathTest, Forms) {
  EXPECT_EQ(NormalizeContextPath("./a//b/"), "a/b");
  EXPECT_EQ(NormalizeContextPath("a/./b"), "a/b");
  EXPECT_EQ(NormalizeContextPath("a"), "a");
  EXPECT_EQ(NormalizeContextPath("..."), "...");
  EXPECT_EQ(NormalizeContextPath(".a/..b"), ".a/..b");
  EXPECT_EQ(NormalizeContextPath("."), "");
  EXPECT_EQ(NormalizeContextPath("/"), "");
  EXPECT_EQ(NormalizeContextPath(""), "");
  EXPECT_EQ(NormalizeContextPath("/app/"), "app");
  EXPECT_EQ(NormalizeContextPath(".."), std::nullopt);
  EXPECT_EQ(NormalizeContextPath("../x"), std::nullopt);
  EXPECT_EQ(NormalizeContextPath("a/../b"), std::nullopt);
  EXPECT_EQ(NormalizeContextPath("a/.."), std::nullopt);
  EXPECT_EQ(NormalizeContextPath("./.."), std::nullopt);
}

TEST_F(BuildContextTest, CopyDotCopiesEverythingUnderDest) {
  Project();
  auto r = Copy({"."}, "/app");
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  std::vector<std::string> names;
  for (const OutEntry& o : out) names.push_back(o.e.name);
  EXPECT_THAT(names, ElementsAre("app/src", "app/src/main.py", "app/src/sub", "app/src/sub/x",
                                 "app/README", "app/a.py", "app/b.py", "app/c.txt"));
  EXPECT_EQ(r->entries, out.size());
  const OutEntry* main_py = Find(out, "app/src/main.py");
  ASSERT_NE(main_py, nullptr);
  EXPECT_EQ(main_py->e.type, TarType::kFile);
  EXPECT_EQ(main_py->data, "print(1)\n");
  EXPECT_EQ(main_py->e.mode, 0755u);
  const OutEntry* sub = Find(out, "app/src/sub");
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->e.type, TarType::kDirectory);
  EXPECT_EQ(sub->e.mode, 0755u);
  const OutEntry* x = Find(out, "app/src/sub/x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->data, "x-data");
  EXPECT_EQ(x->e.mode, 0644u);
  // "/" as DEST: the context's own names; "./" and "/" as sources are ".".
  EXPECT_THAT(CopyNames({"./"}, "/"),
              ElementsAre("src", "src/main.py", "src/sub", "src/sub/x", "README", "a.py", "b.py",
                          "c.txt"));
  EXPECT_EQ(CopyNames({"/"}, "/app/").size(), 8u);
}

TEST_F(BuildContextTest, DirectorySourceCopiesItsContentsNotItself) {
  Project();
  EXPECT_THAT(CopyNames({"src"}, "/app"), ElementsAre("app/main.py", "app/sub", "app/sub/x"));
  EXPECT_THAT(CopyNames({"src/"}, "/app/"), ElementsAre("app/main.py", "app/sub", "app/sub/x"));
  EXPECT_THAT(CopyNames({"src/sub"}, "/"), ElementsAre("x"));
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, "x-data");
}

TEST_F(BuildContextTest, FileSourceLandsAtDestOrInsideIt) {
  Project();
  EXPECT_THAT(CopyNames({"README"}, "/etc/x"), ElementsAre("etc/x"));
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].e.type, TarType::kFile);
  EXPECT_EQ(out[0].data, "read me");
  EXPECT_THAT(CopyNames({"README"}, "/etc/"), ElementsAre("etc/README"));
  EXPECT_THAT(CopyNames({"src/sub/x"}, "/etc/"), ElementsAre("etc/x"));
  EXPECT_THAT(CopyNames({"src/sub/x"}, "/etc/y"), ElementsAre("etc/y"));
  EXPECT_THAT(CopyNames({"README"}, "/"), ElementsAre("README"));
}

TEST_F(BuildContextTest, TwoSourcesGoIntoDest) {
  Project();
  // Several sources: DEST is a directory even without its trailing '/'.
  EXPECT_THAT(CopyNames({"README", "src/sub/x"}, "/dst"), ElementsAre("dst/x", "dst/README"));
  EXPECT_THAT(CopyNames({"c.txt", "src"}, "/dst/"),
              ElementsAre("dst/main.py", "dst/sub", "dst/sub/x", "dst/c.txt"));
}

TEST_F(BuildContextTest, GlobsMatchWithinOneComponent) {
  Context({File("a.py", "a"), File("b.py", "b"), File("c.txt", "c"), Dir("sub"),
           File("sub/d.py", "d"), Dir("pkg.py"), File("pkg.py/e", "e"), File("ab.py", "ab")});
  // `*` does not cross '/': sub/d.py is not *.py. A matched directory copies its contents.
  EXPECT_THAT(CopyNames({"*.py"}, "/dst/"),
              ElementsAre("dst/a.py", "dst/b.py", "dst/e", "dst/ab.py"));
  // A glob source puts files inside DEST even without the trailing '/'.
  EXPECT_THAT(CopyNames({"?.py"}, "/dst"), ElementsAre("dst/a.py", "dst/b.py"));
  EXPECT_THAT(CopyNames({"[ac].*"}, "/dst/"), ElementsAre("dst/a.py", "dst/c.txt"));
  EXPECT_THAT(CopyNames({"sub/*.py"}, "/dst/"), ElementsAre("dst/d.py"));
  EXPECT_THAT(CopyNames({"*/d.py"}, "/dst/"), ElementsAre("dst/d.py"));
  EXPECT_THAT(CopyNames({"*"}, "/dst/"),
              ElementsAre("dst/a.py", "dst/b.py", "dst/c.txt", "dst/d.py", "dst/e", "dst/ab.py"));
  auto r = Copy({"*.rs"}, "/dst/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("\"*.rs\" is not in the build context"));
}

TEST_F(BuildContextTest, GlobsMatchHiddenFilesAndDotDestIsADirectory) {
  Context({File(".env.py", "h"), File("a.py", "a")});
  // As Docker's matcher: a leading dot is no exception for `*`.
  EXPECT_THAT(CopyNames({"*.py"}, "/dst/"), ElementsAre("dst/.env.py", "dst/a.py"));
  // "/dst/." is the directory /dst: a file goes inside it, not over it.
  EXPECT_THAT(CopyNames({"a.py"}, "/dst/."), ElementsAre("dst/a.py"));
  EXPECT_THAT(CopyNames({"a.py"}, "/dst"), ElementsAre("dst"));
}

TEST_F(BuildContextTest, SourcesAreNormalized) {
  Project();
  EXPECT_THAT(CopyNames({"./src//sub/"}, "/app"), ElementsAre("app/x"));
  EXPECT_THAT(CopyNames({"./src/./main.py"}, "/app/"), ElementsAre("app/main.py"));
  EXPECT_THAT(CopyNames({"README"}, "//etc//x"), ElementsAre("etc/x"));
}

TEST_F(BuildContextTest, SourceThatClimbsOutIsRefused) {
  Project();
  for (const char* s : {"..", "../x", "src/../../x", "src/.."}) {
    auto r = Copy({s}, "/app");
    ASSERT_FALSE(r.ok()) << s;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(r.status().message(), HasSubstr("outside the build context")) << s;
  }
  auto r = Copy({"README"}, "/../etc");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BuildContextTest, SourceThatMatchesNothingIsNamed) {
  Project();
  auto r = Copy({"README", "missing/file"}, "/app/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("\"missing/file\" is not in the build context"));
  // A prefix of a name is not a match: "sr" is not "src".
  r = Copy({"sr"}, "/app/");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("\"sr\""));
  // The context's root itself does not exist as an entry, but "." still matches its entries.
  EXPECT_FALSE(CopyNames({"."}, "/app").empty());
}

TEST_F(BuildContextTest, EntriesThatClimbOutOrAreAbsoluteAreNeverSelected) {
  Context({File("../evil", "evil"), File("/abs", "abs"), File("a/../../b", "b"),
           File("a/../c", "c"), File("./../d", "d"), Dir("/etc"), File("/etc/passwd", "root"),
           File("//abs2", "abs2"), HardLink("ok-link", "../evil"), File("ok", "ok")});
  auto r = Copy({"."}, "/app");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(OutNames(), ElementsAre("app/ok"));
  for (const char* s : {"abs", "etc", "etc/passwd", "abs2", "b", "c", "d", "a"}) {
    auto named = Copy({s}, "/app/");
    ASSERT_FALSE(named.ok()) << s << ": " << OutNames().size() << " entries";
    EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument) << s;
  }
  // A glob neither.
  EXPECT_THAT(CopyNames({"*"}, "/app/"), ElementsAre("app/ok"));
  for (const OutEntry& o : ReadOut()) {
    EXPECT_EQ(o.data.find("evil"), std::string::npos);
    EXPECT_EQ(o.data.find("root"), std::string::npos);
  }
}

TEST_F(BuildContextTest, SymlinksStaySymlinksWithTheirTargets) {
  Context({Dir("d"), Symlink("d/up", "../../../etc/passwd"), Symlink("d/abs", "/etc/shadow"),
           Symlink("d/rel", "x"), File("d/x", "x")});
  auto r = Copy({"d"}, "/app", 0600);
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 4u);
  const OutEntry* up = Find(out, "app/up");
  const OutEntry* abs = Find(out, "app/abs");
  const OutEntry* rel = Find(out, "app/rel");
  ASSERT_TRUE(up && abs && rel);
  EXPECT_EQ(up->e.type, TarType::kSymlink);
  EXPECT_EQ(up->e.linkname, "../../../etc/passwd");
  EXPECT_EQ(abs->e.type, TarType::kSymlink);
  EXPECT_EQ(abs->e.linkname, "/etc/shadow");
  EXPECT_EQ(rel->e.linkname, "x");
  EXPECT_TRUE(rel->data.empty());
  // A symlink as a file source is renamed, not followed.
  EXPECT_THAT(CopyNames({"d/up"}, "/etc/link"), ElementsAre("etc/link"));
  out = ReadOut();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].e.type, TarType::kSymlink);
  EXPECT_EQ(out[0].e.linkname, "../../../etc/passwd");
}

TEST_F(BuildContextTest, HardLinksFollowTheirTargetOrAreDropped) {
  Context({Dir("src"), File("src/f", "shared"), HardLink("src/h", "src/f"),
           HardLink("src/h2", "./src//f"), File("other", "o"), HardLink("src/h3", "other"),
           HardLink("src/h4", "../src/f"), HardLink("src/h5", "missing"),
           HardLink("src/h6", "/src/f")});
  auto r = Copy({"src"}, "/app");
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  std::vector<std::string> names;
  for (const OutEntry& o : out) names.push_back(o.e.name);
  EXPECT_THAT(names, ElementsAre("app/f", "app/h", "app/h2"));
  const OutEntry* h = Find(out, "app/h");
  const OutEntry* h2 = Find(out, "app/h2");
  ASSERT_TRUE(h && h2);
  EXPECT_EQ(h->e.type, TarType::kHardLink);
  EXPECT_EQ(h->e.linkname, "app/f");
  EXPECT_EQ(h2->e.type, TarType::kHardLink);
  EXPECT_EQ(h2->e.linkname, "app/f");
  EXPECT_EQ(r->entries, 3u);
  // Both copied: the link follows its target's new name.
  EXPECT_THAT(CopyNames({"other", "src/h3"}, "/d/"), ElementsAre("d/other", "d/h3"));
  out = ReadOut();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].e.type, TarType::kHardLink);
  EXPECT_EQ(out[1].e.linkname, "d/other");
  // The link alone: its target is not in the image, so it is not either.
  EXPECT_THAT(CopyNames({"src/h"}, "/d/"), IsEmpty());
}

TEST_F(BuildContextTest, ChmodAppliesToFilesAndDirectoriesNotSymlinks) {
  Context({Dir("d", 0700), File("d/f", "f", 0600), Dir("d/e", 0711), Symlink("d/l", "f"),
           HardLink("d/h", "d/f")});
  auto r = Copy({"."}, "/app", 0751);
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 5u);
  for (const OutEntry& o : out) {
    if (o.e.type == TarType::kSymlink) {
      EXPECT_EQ(o.e.mode, 0777u) << o.e.name;
    } else if (o.e.type != TarType::kHardLink) {
      EXPECT_EQ(o.e.mode, 0751u) << o.e.name;
    }
  }
  // Without --chmod the context's modes stay.
  ASSERT_TRUE(Copy({"."}, "/app").ok());
  out = ReadOut();
  ASSERT_EQ(out.size(), 5u);
  const OutEntry* d = Find(out, "app/d");
  const OutEntry* f = Find(out, "app/d/f");
  const OutEntry* e = Find(out, "app/d/e");
  ASSERT_TRUE(d && f && e);
  EXPECT_EQ(d->e.mode, 0700u);
  EXPECT_EQ(f->e.mode, 0600u);
  EXPECT_EQ(e->e.mode, 0711u);
}

TEST_F(BuildContextTest, OwnersAreAlwaysRoot) {
  Context({Dir("d"), File("d/f", "f"), Symlink("d/l", "f"), HardLink("d/h", "d/f")});
  ASSERT_TRUE(Copy({"."}, "/app").ok());
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 4u);
  for (const OutEntry& o : out) {
    EXPECT_EQ(o.e.uid, 0u) << o.e.name;
    EXPECT_EQ(o.e.gid, 0u) << o.e.name;
    EXPECT_EQ(o.e.mtime, 1700000000) << o.e.name;
  }
}

TEST_F(BuildContextTest, DigestIsOfTheOutputAndStable) {
  // Over a flush (1 MiB) and a read (1 MiB) of the implementation, and a block's padding.
  std::string big(3 * (1 << 20) + 123, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + (i * 7919) % 26);
  Context({Dir("d"), File("d/big", big), File("d/small", "s"), File("z", "z")});
  auto first = Copy({"d"}, "/app");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string bytes = OutBytes();
  EXPECT_EQ(first->digest, Sha256Digest(bytes));
  EXPECT_EQ(first->bytes, bytes.size());
  EXPECT_EQ(first->entries, 2u);
  EXPECT_EQ(bytes.size() % archive::kTarBlock, 0u);
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].e.name, "app/big");
  EXPECT_EQ(out[0].e.size, big.size());
  EXPECT_TRUE(out[0].data == big);
  auto again = Copy({"d"}, "/app");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->digest, first->digest);
  EXPECT_EQ(OutBytes(), bytes);
  // Another DEST: another tar, another digest.
  auto other = Copy({"d"}, "/other");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->digest, first->digest);
  EXPECT_EQ(other->digest, Sha256Digest(OutBytes()));
}

TEST_F(BuildContextTest, NotATarIsInvalidArgument) {
  WriteBytes(ContextPath(), std::string(2048, 'x') + "this is not a tar archive\n");
  auto r = Copy({"."}, "/app");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // Cut in the middle of an entry's data.
  std::string cut = Tar({File("f", std::string(4096, 'f'))});
  cut.resize(archive::kTarBlock + 1000);
  WriteBytes(ContextPath(), cut);
  r = Copy({"."}, "/app");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // An empty context has nothing to copy.
  WriteBytes(ContextPath(), "");
  r = Copy({"."}, "/app");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // No context file at all.
  std::error_code ec;
  fs::remove(ContextPath(), ec);
  EXPECT_FALSE(Copy({"."}, "/app").ok());
}

// A sparse entry (pax GNU.sparse 0.1) whose map holds more data than its size says: the
// output's header must not promise fewer bytes than follow it, or the data's second block
// (here a header for ../evil) would be read as an entry of the image.
TEST_F(BuildContextTest, SparseDataBeyondTheEntrySizeIsRefused) {
  std::string smuggled;
  ASSERT_TRUE(archive::AppendTarHeader(smuggled, Entry("../evil", TarType::kFile, 0644)).ok());
  const std::string data = std::string(archive::kTarBlock, 'A') + smuggled;
  // Entry "f" whose map puts all of `data` at offset 0, with `size` as its real size.
  auto sparse = [&](uint64_t size) {
    const std::string pax = PaxRecord("GNU.sparse.size", std::to_string(size)) +
                            PaxRecord("GNU.sparse.numblocks", "1") +
                            PaxRecord("GNU.sparse.map", fmt::format("0,{}", data.size()));
    std::string tar = RawHeader("PaxHeaders/f", 'x', pax.size());
    tar += pax;
    tar.append(archive::TarPadding(pax.size()));
    tar += RawHeader("f", '0', data.size());
    tar += data;
    tar.append(archive::TarTrailer());
    return tar;
  };
  WriteBytes(ContextPath(), sparse(1));
  auto r = Copy({"."}, "/app");
  ASSERT_FALSE(r.ok()) << OutNames().size() << " entries";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("beyond the entry's size"));
  // The same entry with a size that holds its data is copied whole, and a hole is kept.
  WriteBytes(ContextPath(), sparse(data.size() + 100));
  r = Copy({"."}, "/app");
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].e.name, "app/f");
  EXPECT_EQ(out[0].e.size, data.size() + 100);
  EXPECT_TRUE(out[0].data.substr(0, data.size()) == data);
  EXPECT_EQ(r->digest, Sha256Digest(OutBytes()));
}

TEST_F(BuildContextTest, CancelReturnsCancelled) {
  Project();
  auto r = Copy({"."}, "/app", std::nullopt, [] { return true; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  // Cancelled between two reads of a context larger than one.
  Context({File("big", std::string(3 << 20, 'b')), File("after", "a")});
  int calls = 0;
  r = Copy({"."}, "/app", std::nullopt, [&] { return ++calls > 1; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_GT(calls, 1);
  // Never cancelled: the same copy succeeds.
  ASSERT_TRUE(Copy({"."}, "/app", std::nullopt, [] { return false; }).ok());
  EXPECT_THAT(OutNames(), UnorderedElementsAre("app/big", "app/after"));
}

// An archive as a client would ADD it: a directory, files, a symlink and a hard link.
std::string AppTar() {
  return Tar({Dir("./"), Dir("./pkg", 0700), File("./pkg/run", "#!/bin/sh\n", 0755),
              File("./pkg/data", "data"), Symlink("./pkg/cur", "run"),
              HardLink("./pkg/again", "./pkg/data")});
}

TEST_F(BuildContextTest, AddUnpacksATarAsIsOrCompressedIntoDest) {
  for (const char* filter : {"", "gzip", "bzip2", "xz", "zstd"}) {
    SCOPED_TRACE(filter);
    const std::string archive = Compress(AppTar(), filter);
    Context({File("app.archive", archive, 0600), File("other", "o")});
    // DEST is a directory for the archive's contents, with or without its '/'; the archive's
    // own name is not used.
    for (const char* dest : {"/opt/app", "/opt/app/"}) {
      auto r = Add({"app.archive"}, dest);
      ASSERT_TRUE(r.ok()) << r.status();
      auto out = ReadOut();
      std::vector<std::string> names;
      for (const OutEntry& o : out) names.push_back(o.e.name);
      EXPECT_THAT(names, ElementsAre("opt/app/pkg", "opt/app/pkg/run", "opt/app/pkg/data",
                                     "opt/app/pkg/cur", "opt/app/pkg/again"));
      EXPECT_EQ(r->entries, 5u);
      EXPECT_EQ(r->bytes, OutBytes().size());
      EXPECT_EQ(r->digest, Sha256Digest(OutBytes()));
      const OutEntry* pkg = Find(out, "opt/app/pkg");
      const OutEntry* run = Find(out, "opt/app/pkg/run");
      const OutEntry* cur = Find(out, "opt/app/pkg/cur");
      const OutEntry* again = Find(out, "opt/app/pkg/again");
      ASSERT_TRUE(pkg && run && cur && again);
      EXPECT_EQ(pkg->e.type, TarType::kDirectory);
      EXPECT_EQ(pkg->e.mode, 0700u);
      EXPECT_EQ(run->data, "#!/bin/sh\n");
      EXPECT_EQ(run->e.mode, 0755u);
      EXPECT_EQ(cur->e.type, TarType::kSymlink);
      EXPECT_EQ(cur->e.linkname, "run");
      // A hard link follows its target's new name.
      EXPECT_EQ(again->e.type, TarType::kHardLink);
      EXPECT_EQ(again->e.linkname, "opt/app/pkg/data");
      for (const OutEntry& o : out) {
        EXPECT_EQ(o.e.uid, 0u) << o.e.name;
        EXPECT_EQ(o.e.gid, 0u) << o.e.name;
      }
    }
  }
}

TEST_F(BuildContextTest, CopyOfAnArchiveCopiesTheFile) {
  const std::string archive = Compress(AppTar(), "gzip");
  Context({File("app.tar.gz", archive)});
  auto r = Copy({"app.tar.gz"}, "/opt/");
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].e.name, "opt/app.tar.gz");
  EXPECT_TRUE(out[0].data == archive);
  // The cache keys on the digest: ADD's tar is another.
  const std::string copied = r->digest;
  auto added = Add({"app.tar.gz"}, "/opt/");
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_NE(added->digest, copied);
}

TEST_F(BuildContextTest, AddCopiesWhatIsNotAnArchiveAsAFile) {
  const std::string text = "just text, long enough to fill a few blocks of a reader\n";
  const std::vector<std::pair<std::string, std::string>> files = {
      {"text", text},
      {"empty", ""},
      // gzip's magic, then garbage: Docker copies what it cannot decompress.
      {"bad.gz", std::string("\x1f\x8b\x08\x00", 4) + std::string(600, 'x')},
      {"bad.zst", std::string("\x28\xb5\x2f\xfd", 4) + std::string(600, 'x')},
      // A gzip of a non-tar is the .gz file.
      {"text.gz", Compress(std::string(4000, 't'), "gzip")},
      {"text.xz", Compress(text, "xz")},
      // Docker decompresses once: the tar under two gzips is not read.
      {"app.tar.gz.gz", Compress(Compress(AppTar(), "gzip"), "gzip")},
      // An archive without entries (its trailer only): Docker's reader ends at once.
      {"none.tar", std::string(archive::TarTrailer())},
      // 512 zero bytes and then a header: the archive ended at the zero block.
      {"zeros", std::string(archive::kTarBlock * 4, '\0')},
  };
  for (const auto& [name, data] : files) {
    SCOPED_TRACE(name);
    Context({File(name, data, 0640)});
    auto r = Add({name}, "/dst/f");
    ASSERT_TRUE(r.ok()) << r.status();
    auto out = ReadOut();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].e.name, "dst/f");
    EXPECT_EQ(out[0].e.type, TarType::kFile);
    EXPECT_EQ(out[0].e.mode, 0640u);
    EXPECT_EQ(out[0].e.uid, 0u);
    EXPECT_TRUE(out[0].data == data);
    EXPECT_EQ(r->entries, 1u);
    EXPECT_EQ(r->digest, Sha256Digest(OutBytes()));
    // As COPY would have it.
    ASSERT_TRUE(Copy({name}, "/dst/f").ok());
    EXPECT_EQ(OutBytes().size(), r->bytes);
  }
  // A plain copy of a spooled file as big as a few reads.
  std::string big(3 * (1 << 20) + 7, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + (i * 31) % 26);
  Context({File("big", big), HardLink("big-link", "big")});
  auto r = Add({"big", "big-link"}, "/dst/");
  ASSERT_TRUE(r.ok()) << r.status();
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].e.name, "dst/big");
  EXPECT_TRUE(out[0].data == big);
  // A hard link to a file copied as a file follows it.
  EXPECT_EQ(out[1].e.type, TarType::kHardLink);
  EXPECT_EQ(out[1].e.linkname, "dst/big");
}

TEST_F(BuildContextTest, AddRecognisesAV7Tar) {
  std::string h;
  ASSERT_TRUE(archive::AppendTarHeader(h, Entry("old.txt", TarType::kFile, 0644, 3)).ok());
  std::string v7 = V7(h) + "old" + std::string(archive::TarPadding(3));
  v7.append(archive::TarTrailer());
  ASSERT_EQ(v7.find("ustar"), std::string::npos);
  Context({File("old.tar", v7)});
  EXPECT_THAT(AddNames({"old.tar"}, "/x"), ElementsAre("x/old.txt"));
  auto out = ReadOut();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, "old");
}

TEST_F(BuildContextTest, AddUnpacksTheSourceNotFilesUnderADirectory) {
  const std::string archive = Compress(AppTar(), "gzip");
  const std::string inner = Compress(Tar({File("deep", "d")}), "gzip");
  Context({Dir("d"), File("d/x.tar.gz", archive), File("a.tgz", archive),
           File("b.tar", Tar({File("b1", "b"), File("inner.tar.gz", inner)}))});
  // A directory source: its files are copied as they are, as Docker does.
  EXPECT_THAT(AddNames({"d"}, "/dst"), ElementsAre("dst/x.tar.gz"));
  // A glob's matches and several sources: each archive into DEST.
  EXPECT_THAT(AddNames({"*.t*"}, "/dst"),
              ElementsAre("dst/pkg", "dst/pkg/run", "dst/pkg/data", "dst/pkg/cur",
                          "dst/pkg/again", "dst/b1", "dst/inner.tar.gz"));
  // An archive in the archive stays an archive.
  auto out = ReadOut();
  const OutEntry* in = Find(out, "dst/inner.tar.gz");
  ASSERT_NE(in, nullptr);
  EXPECT_TRUE(in->data == inner);
  // DEST "/": the archive's own names.
  EXPECT_THAT(AddNames({"b.tar"}, "/"), ElementsAre("b1", "inner.tar.gz"));
}

TEST_F(BuildContextTest, AddDropsDevicesAndFifosAndDanglingLinksOfAnArchive) {
  std::string tar = Tar({File("a", "a")});
  tar.resize(tar.size() - 2 * archive::kTarBlock);  // its trailer
  tar += RawHeader("fifo", '6', 0) + RawHeader("chr", '3', 0) + RawHeader("blk", '4', 0);
  tar += Tar({HardLink("h", "a"), HardLink("h2", "missing"), Dir("."), Dir("./d")});
  Context({File("x.tar", tar)});
  auto r = Add({"x.tar"}, "/dst");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(OutNames(), ElementsAre("dst/a", "dst/h", "dst/d"));
  EXPECT_EQ(r->entries, 3u);
}

TEST_F(BuildContextTest, AddAppliesChmodToAnArchivesEntries) {
  Context({File("x.tar.xz", Compress(AppTar(), "xz"))});
  auto r = Add({"x.tar.xz"}, "/dst", UINT64_MAX, 0640);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const OutEntry& o : ReadOut()) {
    if (o.e.type == TarType::kSymlink) {
      EXPECT_EQ(o.e.mode, 0777u) << o.e.name;
    } else if (o.e.type != TarType::kHardLink) {
      EXPECT_EQ(o.e.mode, 0640u) << o.e.name;
    }
  }
}

TEST_F(BuildContextTest, AddRefusesArchiveEntriesThatClimbOut) {
  const std::vector<std::pair<std::string, std::string>> archives = {
      {"up.tar", Tar({File("ok", "ok"), File("../evil", "e")})},
      {"inner-up.tar.gz", Compress(Tar({File("ok", "ok"), File("a/../../evil", "e")}), "gzip")},
      {"abs.tar", Tar({File("/etc/passwd", "root")})},
      {"link.tar", Tar({File("ok", "ok"), HardLink("l", "../ok")})},
      {"abslink.tar.bz2", Compress(Tar({File("ok", "ok"), HardLink("l", "/ok")}), "bzip2")},
  };
  for (const auto& [name, data] : archives) {
    SCOPED_TRACE(name);
    Context({File(name, data)});
    auto r = Add({name}, "/dst");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(fmt::format("ADD: \"{}\": ", name)));
    EXPECT_THAT(r.status().message(), HasSubstr("climbs out"));
  }
  Context({File("x.tar", archives[0].second)});
  auto r = Add({"x.tar"}, "/dst");
  EXPECT_THAT(r.status().message(), HasSubstr("\"../evil\""));
}

TEST_F(BuildContextTest, AddOfAnArchiveMalformedAfterItsFirstEntryFails) {
  // Cut in the middle of the second entry's data.
  std::string cut = Tar({File("a", "a"), File("b", std::string(8192, 'b'))});
  cut.resize(3 * archive::kTarBlock + 1000);
  // A second header whose checksum is wrong.
  std::string damaged = Tar({File("a", "a"), File("b", "b")});
  damaged[2 * archive::kTarBlock + 150] ^= 1;
  // The compressed stream cut: the first entry reads, the rest does not.
  std::string gz = Compress(Tar({File("a", "a"), File("b", std::string(1 << 20, 'b')),
                                 File("c", "c")}),
                            "gzip");
  gz.resize(gz.size() / 2);
  for (const auto& [name, data] : std::vector<std::pair<std::string, std::string>>{
           {"cut.tar", cut}, {"damaged.tar.gz", Compress(damaged, "gzip")}, {"x.tar.gz", gz}}) {
    SCOPED_TRACE(name);
    Context({File(name, data)});
    auto r = Add({name}, "/dst");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(fmt::format("ADD: \"{}\": ", name)));
  }
}

TEST_F(BuildContextTest, AddOfADecompressionBombStopsAtMaxBytes) {
  const std::string zeros = Tar({File("zeros", std::string(64 << 20, '\0'))});
  const std::string bomb = Compress(zeros, "gzip");
  ASSERT_LT(bomb.size(), 1u << 20);
  Context({File("bomb.tar.gz", bomb)});
  const auto start = std::chrono::steady_clock::now();
  auto r = Add({"bomb.tar.gz"}, "/dst", 1 << 20);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the template's max_unpacked_bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("1048576"));
  EXPECT_LT(OutBytes().size(), 2u << 20);
  // Refused at the entry's header, before its data is decompressed.
  EXPECT_LT(took, std::chrono::seconds(5));
  // Many small entries: their headers count too.
  std::vector<std::pair<TarEntry, std::string>> many;
  for (int i = 0; i < 3000; ++i) many.push_back(File(fmt::format("f{}", i), ""));
  Context({File("many.tar.zst", Compress(Tar(many), "zstd"))});
  r = Add({"many.tar.zst"}, "/dst", 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  r = Add({"many.tar.zst"}, "/dst", 4 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries, 3000u);
}

TEST_F(BuildContextTest, MaxBytesBoundsPlainCopies) {
  Context({File("a", std::string(100, 'a')), File("b", std::string(60, 'b')),
           File("c", std::string(60, 'c'))});
  auto bounded = [&](std::vector<std::string> sources, uint64_t max, bool add) {
    CopySpec spec{std::move(sources), "/dst/", std::nullopt};
    spec.unpack_archives = add;
    spec.max_bytes = max;
    return Write(spec);
  };
  for (bool add : {false, true}) {
    SCOPED_TRACE(add);
    EXPECT_TRUE(bounded({"a"}, 100, add).ok());
    auto r = bounded({"a"}, 99, add);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("the template's max_unpacked_bytes"));
    EXPECT_THAT(r.status().message(), HasSubstr(add ? "ADD: \"a\"" : "COPY: \"a\""));
    // The sum, not each file.
    EXPECT_TRUE(bounded({"b", "c"}, 120, add).ok());
    EXPECT_EQ(bounded({"b", "c"}, 119, add).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  // A sparse file's hole counts: 10 bytes of data at the end of 1 GiB.
  const std::string pax = PaxRecord("GNU.sparse.size", std::to_string(1ull << 30)) +
                          PaxRecord("GNU.sparse.numblocks", "1") +
                          PaxRecord("GNU.sparse.map", fmt::format("{},10", (1ull << 30) - 10));
  std::string tar = RawHeader("PaxHeaders/s", 'x', pax.size());
  tar += pax;
  tar.append(archive::TarPadding(pax.size()));
  tar += RawHeader("s", '0', 10);
  tar += std::string(10, 's');
  tar.append(archive::TarPadding(10));
  tar.append(archive::TarTrailer());
  WriteBytes(ContextPath(), tar);
  auto r = bounded({"s"}, 1 << 20, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_LT(OutBytes().size(), 2u << 20);
  // ADD spools it as a sparse file and finds no archive in it: the same bound.
  r = bounded({"s"}, 1 << 20, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
}

TEST_F(BuildContextTest, AddIsCancelledWhileItUnpacks) {
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + (i * 131) % 26);
  Context({File("x.tar", Tar({File("a", big), File("b", big)}))});
  // What COPY asks reading the context alone; ADD asks more, while it unpacks.
  int copy_calls = 0;
  ASSERT_TRUE(Copy({"x.tar"}, "/dst", std::nullopt, [&] { return ++copy_calls < 0; }).ok());
  int add_calls = 0;
  ASSERT_TRUE(Add({"x.tar"}, "/dst", UINT64_MAX, std::nullopt, [&] {
                return ++add_calls < 0;
              }).ok());
  ASSERT_GT(add_calls, copy_calls + 2);
  int calls = 0;
  auto r = Add({"x.tar"}, "/dst", UINT64_MAX, std::nullopt, [&] { return ++calls > copy_calls; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("ADD"));
}

}  // namespace
}  // namespace sbx::image

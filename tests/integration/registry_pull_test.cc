// registry::PullToLayout against a real registry (Debian's docker-registry, distribution 2.8)
// on 127.0.0.1, filled by skopeo from OCI layouts this test builds: by tag, by digest, a
// wrong digest, a multi-arch index, basic auth, resumed and cancelled pulls, and the layout
// image::ImportLayout then takes.
#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/digest.h"
#include "common/files.h"
#include "common/test_util.h"
#include "image/image.h"
#include "registry/registry.h"

extern char** environ;

namespace sbx::registry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool HaveTool(const std::string& name) {
  for (const char* dir : {"/usr/bin/", "/usr/sbin/", "/usr/local/bin/", "/bin/"}) {
    if (::access((std::string(dir) + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Runs argv (no shell), its output into `log`; the exit code, or -1.
int RunTool(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

bool PortOpen(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

void WriteFile(const fs::path& p, const std::string& data) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << data;
}

// A pax tar of `files`, plain or gzip-compressed, by libarchive's writer.
std::string Tar(const std::vector<std::pair<std::string, std::string>>& files, bool gzip) {
  std::string out;
  ::archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (gzip) archive_write_add_filter_gzip(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(
      a, &out, nullptr,
      [](::archive*, void* c, const void* buf, size_t n) -> la_ssize_t {
        static_cast<std::string*>(c)->append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  for (const auto& [name, data] : files) {
    archive_entry* en = archive_entry_new();
    archive_entry_set_pathname(en, name.c_str());
    archive_entry_set_filetype(en, AE_IFREG);
    archive_entry_set_perm(en, 0644);
    archive_entry_set_mtime(en, 1700000000, 0);
    archive_entry_set_size(en, static_cast<la_int64_t>(data.size()));
    archive_write_header(a, en);
    archive_write_data(a, data.data(), data.size());
    archive_entry_free(en);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

std::string Digest(const std::string& s) { return "sha256:" + Sha256Hex(s); }

// Blobs of an OCI layout under construction.
std::string PutBlob(const fs::path& layout, const std::string& data) {
  const std::string d = Digest(data);
  WriteFile(layout / "blobs/sha256" / d.substr(7), data);
  return d;
}

struct BuiltImage {
  std::string manifest_digest, config_digest, layer_digest;
  uint64_t layer_size = 0;
  std::string manifest;
};

// One linux/`arch` image: a layer with `payload` as /payload, its config and manifest.
BuiltImage AddImage(const fs::path& layout, const std::string& arch, const std::string& payload) {
  const std::vector<std::pair<std::string, std::string>> files = {
      {"etc/arch", arch + "\n"}, {"payload", payload}};
  const std::string plain = Tar(files, false), gz = Tar(files, true);
  BuiltImage b;
  b.layer_digest = PutBlob(layout, gz);
  b.layer_size = gz.size();
  const json config = {{"architecture", arch},
                       {"os", "linux"},
                       {"config", {{"Cmd", {"/bin/sh"}}, {"Env", {"A=1"}}}},
                       {"rootfs", {{"type", "layers"}, {"diff_ids", {Digest(plain)}}}}};
  const std::string cfg = config.dump();
  b.config_digest = PutBlob(layout, cfg);
  const json manifest = {
      {"schemaVersion", 2},
      {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
      {"config",
       {{"mediaType", "application/vnd.oci.image.config.v1+json"},
        {"digest", b.config_digest},
        {"size", cfg.size()}}},
      {"layers",
       {{{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
         {"digest", b.layer_digest},
         {"size", gz.size()}}}}};
  b.manifest = manifest.dump();
  b.manifest_digest = PutBlob(layout, b.manifest);
  return b;
}

void FinishLayout(const fs::path& layout, const std::string& media_type,
                  const std::string& digest, size_t size) {
  WriteFile(layout / "oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  const json index = {
      {"schemaVersion", 2},
      {"manifests",
       {{{"mediaType", media_type},
         {"digest", digest},
         {"size", size},
         {"annotations", {{"org.opencontainers.image.ref.name", "t"}}}}}}};
  WriteFile(layout / "index.json", index.dump());
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A docker-registry on 127.0.0.1:<port>, killed (by its PID) when this goes.
class Registry {
 public:
  // `tls`: a directory with server.crt and server.key, for https.
  Registry(const fs::path& dir, const std::string& htpasswd, const fs::path& tls = {})
      : dir_(dir) {
    port_ = FreePort();
    std::string cfg = fmt::format(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n"
        "http:\n  addr: 127.0.0.1:{}\n",
        (dir / "data").string(), port_);
    if (!tls.empty()) {
      cfg += fmt::format("  tls:\n    certificate: {}\n    key: {}\n",
                         (tls / "server.crt").string(), (tls / "server.key").string());
    }
    if (!htpasswd.empty()) {
      cfg += fmt::format("auth:\n  htpasswd:\n    realm: sbx-test\n    path: {}\n", htpasswd);
    }
    WriteFile(dir / "config.yml", cfg);
    const std::string config = (dir / "config.yml").string(), log = (dir / "registry.log").string();
    char* argv[] = {const_cast<char*>("docker-registry"), const_cast<char*>("serve"),
                    const_cast<char*>(config.c_str()), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawnp(&pid_, argv[0], &fa, nullptr, argv, environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 200 && pid_ > 0 && !PortOpen(port_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Registry() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
  bool up() const { return pid_ > 0 && PortOpen(port_); }
  std::string addr() const { return fmt::format("127.0.0.1:{}", port_); }
  std::string log() const { return ReadFileOrEmpty((dir_ / "registry.log").string()); }

 private:
  fs::path dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

class RegistryPullTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* tool : {"docker-registry", "skopeo", "htpasswd", "openssl"}) {
      if (!HaveTool(tool)) {
        missing_ = std::string(tool) + " is not installed";
        return;
      }
    }
    char tmpl[] = "/tmp/sbx-registry-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      missing_ = "mkdtemp failed";
      return;
    }
    dir_ = new fs::path(tmpl);
    // The open registry: a single-arch image (its layer 1 MiB of noise, so resume and cancel
    // have something to cut), and a two-arch index.
    plain_ = new Registry(*dir_ / "plain", "");
    if (!plain_->up()) {
      missing_ = "docker-registry did not start: " + plain_->log();
      return;
    }
    const fs::path one = *dir_ / "layout-one";
    single_ = new BuiltImage(AddImage(one, "amd64", RandomBytes(1 << 20, 1)));
    FinishLayout(one, "application/vnd.oci.image.manifest.v1+json", single_->manifest_digest,
                 single_->manifest.size());
    if (!Push(one, "team/app:t", {})) return;

    const fs::path multi = *dir_ / "layout-multi";
    amd64_ = new BuiltImage(AddImage(multi, "amd64", "for amd64\n"));
    arm64_ = new BuiltImage(AddImage(multi, "arm64", "for arm64\n"));
    json index = {{"schemaVersion", 2},
                  {"mediaType", "application/vnd.oci.image.index.v1+json"},
                  {"manifests", json::array()}};
    // arm64 first: picking the first entry would be wrong.
    for (const auto& [b, arch] : {std::pair{arm64_, "arm64"}, std::pair{amd64_, "amd64"}}) {
      index["manifests"].push_back({{"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                                    {"digest", b->manifest_digest},
                                    {"size", b->manifest.size()},
                                    {"platform", {{"os", "linux"}, {"architecture", arch}}}});
    }
    const std::string index_text = index.dump();
    FinishLayout(multi, "application/vnd.oci.image.index.v1+json", PutBlob(multi, index_text),
                 index_text.size());
    if (!Push(multi, "team/multi:t", {"--all"})) return;

    // The registry that wants basic auth (htpasswd -B: bcrypt, all distribution takes).
    const std::string htpasswd = (*dir_ / "htpasswd").string();
    if (RunTool({"htpasswd", "-Bbn", "user", "pass"}, htpasswd) != 0) {
      missing_ = "htpasswd failed";
      return;
    }
    authed_ = new Registry(*dir_ / "authed", htpasswd);
    if (!authed_->up()) {
      missing_ = "docker-registry (htpasswd) did not start: " + authed_->log();
      return;
    }
    if (!Push(one, "team/app:t", {"--dest-creds", "user:pass"}, authed_)) return;
  }

  static bool Push(const fs::path& layout, const std::string& dest,
                   std::vector<std::string> extra, Registry* to = nullptr) {
    if (to == nullptr) to = plain_;
    std::vector<std::string> args = {"skopeo", "--insecure-policy", "copy", "--quiet",
                                     "--preserve-digests", "--dest-tls-verify=false"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("oci:" + layout.string() + ":t");
    args.push_back("docker://" + to->addr() + "/" + dest);
    const std::string log = (*dir_ / "skopeo.log").string();
    if (RunTool(args, log) != 0) {
      missing_ = "skopeo copy to " + dest + " failed: " + ReadFileOrEmpty(log);
      return false;
    }
    return true;
  }

  static void TearDownTestSuite() {
    delete authed_;
    delete plain_;
    if (dir_ != nullptr) {
      std::error_code ec;
      fs::remove_all(*dir_, ec);
    }
    delete dir_;
    delete single_;
    delete amd64_;
    delete arm64_;
    authed_ = plain_ = nullptr;
    dir_ = nullptr;
  }

  void SetUp() override {
    if (!missing_.empty()) SBX_SKIP_OR_FAIL("registry pull test: " << missing_);
    out_ = *dir_ / ("out-" + std::to_string(counter_++));
    options_.registries[""].insecure = true;  // the defaults: plain http for every registry
  }

  absl::StatusOr<std::string> Pull(const std::string& ref_text, const image::CancelFn& cancel = {}) {
    auto ref = ParseReference(ref_text);
    if (!ref.ok()) return ref.status();
    return PullToLayout(*ref, options_, out_.string(),
                        [this](const image::Progress& p) { progress_.push_back(p); }, cancel);
  }

  // The layout's blob named `digest` is there and hashes to it.
  void ExpectBlob(const std::string& digest) {
    auto data = ReadFileToString((out_ / "blobs/sha256" / digest.substr(7)).string());
    ASSERT_TRUE(data.ok()) << digest << ": " << data.status();
    EXPECT_EQ(Digest(*data), digest);
  }

  void ExpectLayoutOf(const BuiltImage& b) {
    ExpectBlob(b.manifest_digest);
    ExpectBlob(b.config_digest);
    ExpectBlob(b.layer_digest);
    EXPECT_EQ(ReadFileOrEmpty((out_ / "oci-layout").string()), R"({"imageLayoutVersion":"1.0.0"})");
    const json index = json::parse(ReadFileOrEmpty((out_ / "index.json").string()), nullptr, false);
    ASSERT_TRUE(index.is_object()) << "index.json";
    ASSERT_EQ(index["manifests"].size(), 1u);
    EXPECT_EQ(index["manifests"][0]["digest"], b.manifest_digest);
    EXPECT_EQ(index["manifests"][0]["size"], b.manifest.size());
    EXPECT_EQ(index["manifests"][0]["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    for (const auto& e : fs::recursive_directory_iterator(out_)) {
      EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    }
  }

  std::string Ref(const std::string& repo) const { return plain_->addr() + "/" + repo; }

  static inline std::string missing_;
  static inline fs::path* dir_ = nullptr;
  static inline Registry* plain_ = nullptr;
  static inline Registry* authed_ = nullptr;
  static inline BuiltImage* single_ = nullptr;
  static inline BuiltImage* amd64_ = nullptr;
  static inline BuiltImage* arm64_ = nullptr;
  static inline int counter_ = 0;
  fs::path out_;
  ClientOptions options_;
  std::vector<image::Progress> progress_;
};

TEST_F(RegistryPullTest, ByTagWritesAVerifiedLayoutThatImports) {
  auto digest = Pull(Ref("team/app:t"));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, single_->manifest_digest);
  ExpectLayoutOf(*single_);
  ASSERT_FALSE(progress_.empty());
  const image::Progress& last = progress_.back();
  EXPECT_EQ(last.stage, "fetching");
  EXPECT_EQ(last.layers_done, 2);  // the config and the layer
  EXPECT_EQ(last.layers_total, 2);
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_GT(last.bytes_total, single_->layer_size);
  EXPECT_NE(last.message.find("fetched"), std::string::npos) << last.message;

  // What the registry client writes is what the image store takes.
  auto store = image::LayerStore::Open((out_ / "store").string(), image::Limits{});
  ASSERT_TRUE(store.ok()) << store.status();
  auto img = image::ImportLayout(out_.string(), *digest, **store, {}, {});
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_EQ(img->digest, *digest);
  EXPECT_EQ(img->config.architecture, "amd64");
  ASSERT_EQ(img->layers.size(), 1u);
  auto tree = (*store)->TreeOf(img->layers[0].diff_id);
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(ReadFileOrEmpty(*tree + "/etc/arch"), "amd64\n");

  // Again into the same directory: the verified blobs stay, nothing is fetched twice.
  progress_.clear();
  auto again = Pull(Ref("team/app:t"));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_FALSE(progress_.empty());
  EXPECT_NE(progress_.back().message.find("already here"), std::string::npos)
      << progress_.back().message;
}

TEST_F(RegistryPullTest, ByDigestAndAWrongDigest) {
  // The defaults under "" apply only when the registry has no settings of its own.
  options_.registries.clear();
  options_.registries[plain_->addr()].insecure = true;
  auto digest = Pull(Ref("team/app@" + single_->manifest_digest));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, single_->manifest_digest);
  ExpectLayoutOf(*single_);

  out_ += "-wrong";
  const std::string wrong = "sha256:" + std::string(64, '0');
  auto bad = Pull(Ref("team/app@" + wrong));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound) << bad.status();
  const std::string msg(bad.status().message());
  EXPECT_NE(msg.find("/v2/team/app/manifests/" + wrong), std::string::npos) << msg;
  EXPECT_NE(msg.find("HTTP 404"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MANIFEST_UNKNOWN"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out_ / "index.json"));

  auto unknown = Pull(Ref("team/nothing:t"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_NE(unknown.status().message().find("_UNKNOWN"), std::string_view::npos)
      << unknown.status();
}

TEST_F(RegistryPullTest, NotInsecureMeansTlsSoPlainHttpFails) {
  options_.registries.clear();
  auto r = Pull(Ref("team/app:t"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("https://" + plain_->addr()), std::string_view::npos)
      << r.status();
}

TEST_F(RegistryPullTest, AnIndexPicksLinuxAmd64) {
  auto digest = Pull(Ref("team/multi:t"));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, amd64_->manifest_digest);
  ExpectLayoutOf(*amd64_);
  EXPECT_FALSE(fs::exists(out_ / "blobs/sha256" / arm64_->layer_digest.substr(7)));
  EXPECT_FALSE(fs::exists(out_ / "blobs/sha256" / arm64_->config_digest.substr(7)));
}

TEST_F(RegistryPullTest, BasicAuthWithAndWithoutCredentials) {
  const std::string ref = authed_->addr() + "/team/app:t";
  auto anon = Pull(ref);
  ASSERT_FALSE(anon.ok());
  EXPECT_EQ(anon.status().code(), absl::StatusCode::kUnauthenticated) << anon.status();
  EXPECT_NE(anon.status().message().find("credentials"), std::string_view::npos)
      << anon.status();
  EXPECT_FALSE(fs::exists(out_ / "index.json"));

  options_.registries[authed_->addr()] = {.username = "user", .password = "wrong", .insecure = true};
  auto wrong = Pull(ref);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
  EXPECT_EQ(wrong.status().message().find("wrong"), std::string_view::npos)
      << "the password is in the error: " << wrong.status();

  options_.registries[authed_->addr()].password = "pass";
  auto digest = Pull(ref);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, single_->manifest_digest);
  ExpectLayoutOf(*single_);
}

TEST_F(RegistryPullTest, APartialBlobIsResumed) {
  auto layer = ReadFileToString((*dir_ / "layout-one/blobs/sha256" / single_->layer_digest.substr(7)).string());
  ASSERT_TRUE(layer.ok()) << layer.status();
  const fs::path partial = out_ / "blobs/sha256" / (single_->layer_digest.substr(7) + ".partial");
  WriteFile(partial, layer->substr(0, layer->size() / 2));
  auto digest = Pull(Ref("team/app:t"));
  ASSERT_TRUE(digest.ok()) << digest.status();
  ExpectLayoutOf(*single_);
  // The registry's access log: the layer came as a 206 (the Range from the partial's end).
  const std::string log = plain_->log();
  EXPECT_NE(log.find("/blobs/" + single_->layer_digest + " HTTP/1.1\" 206"), std::string::npos)
      << log;

  // A partial that is wrong (not the blob's start) costs one fetch from the first byte.
  out_ += "-bad";
  std::string junk = layer->substr(0, layer->size() / 2);
  junk[10] ^= 0x55;
  WriteFile(out_ / "blobs/sha256" / (single_->layer_digest.substr(7) + ".partial"), junk);
  digest = Pull(Ref("team/app:t"));
  ASSERT_TRUE(digest.ok()) << digest.status();
  ExpectLayoutOf(*single_);
}

TEST_F(RegistryPullTest, CancelReturnsCancelledAndNoLayout) {
  auto r = Pull(Ref("team/app:t"), [] { return true; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_FALSE(fs::exists(out_ / "index.json"));

  // Cancelled between blobs: the first one is kept for the next try, no index.json.
  out_ += "-later";
  options_.parallel_layers = 1;
  bool stop = false;
  auto ref = ParseReference(Ref("team/app:t"));
  ASSERT_TRUE(ref.ok());
  auto later = PullToLayout(
      *ref, options_, out_.string(),
      [&](const image::Progress& p) { stop = stop || p.layers_done > 0; }, [&] { return stop; });
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), absl::StatusCode::kCancelled) << later.status();
  EXPECT_FALSE(fs::exists(out_ / "index.json"));
  EXPECT_TRUE(fs::exists(out_ / "blobs/sha256" / single_->config_digest.substr(7)));
}

// A CA of the test's own, and a certificate for 127.0.0.1 it signed (openssl CLI).
bool MakeCa(const fs::path& dir, std::string* why) {
  fs::create_directories(dir);
  WriteFile(dir / "ext.cnf", "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n");
  const std::string d = dir.string(), log = (dir / "openssl.log").string();
  const std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "/ca.key",
       "-out", d + "/ca.crt", "-days", "2", "-subj", "/CN=sbx test CA"},
      {"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "/server.key", "-out",
       d + "/server.csr", "-subj", "/CN=127.0.0.1"},
      {"openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.crt", "-CAkey",
       d + "/ca.key", "-CAcreateserial", "-out", d + "/server.crt", "-days", "2", "-extfile",
       d + "/ext.cnf"},
  };
  for (const auto& step : steps) {
    if (RunTool(step, log) != 0) {
      *why = "openssl " + step[1] + " failed: " + ReadFileOrEmpty(log);
      return false;
    }
  }
  return true;
}

TEST_F(RegistryPullTest, TlsIsVerifiedAgainstTheConfiguredCa) {
  const fs::path tls = *dir_ / "tls";
  std::string why;
  ASSERT_TRUE(MakeCa(tls, &why)) << why;
  Registry secure(*dir_ / "secure", "", tls);
  ASSERT_TRUE(secure.up()) << secure.log();
  ASSERT_TRUE(Push(*dir_ / "layout-one", "team/app:t", {}, &secure)) << missing_;
  const std::string ref = secure.addr() + "/team/app:t";

  // No CA for it: the system's do not know this one.
  options_.registries.clear();
  auto unknown = Pull(ref);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnavailable) << unknown.status();
  EXPECT_NE(unknown.status().message().find("certificate"), std::string_view::npos)
      << unknown.status();
  EXPECT_FALSE(fs::exists(out_ / "index.json"));

  // Its CA as the defaults' ca_file, then as the registry's own.
  options_.registries[""].ca_file = (tls / "ca.crt").string();
  auto by_default = Pull(ref);
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  ExpectLayoutOf(*single_);

  out_ += "-own";
  options_.registries.clear();
  options_.registries[secure.addr()].ca_file = (tls / "ca.crt").string();
  auto own = Pull(ref);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(*own, single_->manifest_digest);
  ExpectLayoutOf(*single_);
}

}  // namespace
}  // namespace sbx::registry

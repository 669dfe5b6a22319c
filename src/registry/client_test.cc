// PullToLayout against a scripted registry on 127.0.0.1 (a blocking HTTP/1.1 responder in a
// thread, one connection at a time): the paths a real registry does not take on demand. The
// bearer-token flow, credentials kept from redirect targets, lying digests, a dropped
// connection resumed with Range, a server that ignores Range, limits, cancellation during a
// transfer and the errors' codes and texts.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/curl_init.h"
#include "common/digest.h"
#include "common/files.h"
#include "registry/registry.h"

namespace sbx::registry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

struct FakeRequest {
  std::string target;  // "/v2/…?…"
  std::string host, authorization, range, accept;
};

struct FakeResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  size_t send_only = std::string::npos;  // then close: a dropped connection
  bool stall = false;                    // after send_only bytes, hold the connection
};

class FakeRegistry {
 public:
  using Handler = std::function<FakeResponse(const FakeRequest&)>;
  explicit FakeRegistry(Handler h) : handler_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeRegistry() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string addr() const { return fmt::format("127.0.0.1:{}", port_); }
  int port() const { return port_; }
  std::vector<FakeRequest> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      Handle(c);
      ::close(c);
    }
  }

  void Handle(int c) {
    std::string in;
    char buf[4096];
    while (in.find("\r\n\r\n") == std::string::npos && in.size() < (64 << 10)) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 2000) <= 0) return;
      ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
    FakeRequest rq;
    const size_t sp1 = in.find(' '), sp2 = in.find(' ', sp1 + 1);
    rq.target = in.substr(sp1 + 1, sp2 - sp1 - 1);
    for (size_t pos = in.find("\r\n") + 2; pos < in.size();) {
      const size_t eol = in.find("\r\n", pos);
      const std::string line = in.substr(pos, eol - pos);
      pos = eol + 2;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      std::string name = line.substr(0, colon);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const std::string value = line.substr(line.find_first_not_of(' ', colon + 1));
      if (name == "host") rq.host = value;
      if (name == "authorization") rq.authorization = value;
      if (name == "range") rq.range = value;
      if (name == "accept") rq.accept = value;
    }
    {
      std::lock_guard lock(mu_);
      requests_.push_back(rq);
    }
    FakeResponse r = handler_(rq);
    std::string out = fmt::format("HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                                  r.status, r.body.size());
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    out += "\r\n";
    out += r.body.substr(0, r.send_only);
    for (size_t off = 0; off < out.size();) {
      ssize_t n = ::send(c, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
    for (int i = 0; r.stall && i < 200 && !stop_; ++i) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) return;  // the client went away
    }
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<FakeRequest> requests_;
};

std::string Digest(const std::string& s) { return "sha256:" + Sha256Hex(s); }

// An image of one config and one layer (noise: PullToLayout hashes layers, it does not read them).
struct Image {
  std::string config, layer, manifest;
  std::string config_digest, layer_digest, manifest_digest;
};

Image MakeImage(size_t layer_bytes) {
  Image im;
  std::mt19937 rng(7);
  im.layer.resize(layer_bytes);
  for (auto& c : im.layer) c = static_cast<char>(rng());
  im.config = R"({"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}})";
  im.config_digest = Digest(im.config);
  im.layer_digest = Digest(im.layer);
  im.manifest = json{{"schemaVersion", 2},
                     {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                     {"config",
                      {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                       {"digest", im.config_digest},
                       {"size", im.config.size()}}},
                     {"layers",
                      {{{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                        {"digest", im.layer_digest},
                        {"size", im.layer.size()}}}}}
                    .dump();
  im.manifest_digest = Digest(im.manifest);
  return im;
}

// The plain registry routes of `im` under /v2/team/app, or nullopt for another path.
std::optional<FakeResponse> Serve(const Image& im, const FakeRequest& rq) {
  const std::string base = "/v2/team/app/";
  if (rq.target == base + "manifests/t" || rq.target == base + "manifests/" + im.manifest_digest) {
    return FakeResponse{.headers = {{"Content-Type", "application/vnd.oci.image.manifest.v1+json"}},
                        .body = im.manifest};
  }
  if (rq.target == base + "blobs/" + im.config_digest) return FakeResponse{.body = im.config};
  if (rq.target == base + "blobs/" + im.layer_digest) return FakeResponse{.body = im.layer};
  return std::nullopt;
}

FakeResponse NotFound() {
  return {.status = 404,
          .headers = {{"Content-Type", "application/json"}},
          .body = R"({"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]})"};
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-registry-client-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.registries[""].insecure = true;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  absl::StatusOr<std::string> Pull(const FakeRegistry& reg, const std::string& what = "team/app:t",
                                   const image::CancelFn& cancel = {}) {
    auto ref = ParseReference(reg.addr() + "/" + what);
    if (!ref.ok()) return ref.status();
    return PullToLayout(*ref, options_, (dir_ / "out").string(), {}, cancel);
  }

  std::string Blob(const std::string& digest) {
    return ReadFileOrEmpty((dir_ / "out/blobs/sha256" / digest.substr(7)).string());
  }
  bool Whole() { return fs::exists(dir_ / "out/index.json"); }

  fs::path dir_;
  ClientOptions options_;
};

TEST_F(ClientTest, BearerTokenFlowAndRedirectsKeepCredentialsHome) {
  const Image im = MakeImage(200 << 10);
  int port = 0;
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    if (rq.target.rfind("/token?", 0) == 0) {
      if (rq.authorization != "Basic dXNlcjpwYXNz") return {.status = 401};
      return {.body = R"({"access_token":"tok-123","expires_in":300})"};
    }
    if (rq.target.rfind("/storage/", 0) == 0) {
      auto r = Serve(im, {.target = "/v2/team/app/blobs/" + rq.target.substr(9)});
      return r ? *r : NotFound();
    }
    if (rq.authorization != "Bearer tok-123") {
      return {.status = 401,
              .headers = {{"WWW-Authenticate",
                           fmt::format(R"(Bearer realm="http://127.0.0.1:{}/token",service="fake reg",scope="repository:team/app:pull")",
                                       port)}}};
    }
    // Blobs live in "storage" on another host name: the token must not follow them there.
    if (rq.target.find("/blobs/") != std::string::npos) {
      return {.status = 307,
              .headers = {{"Location", fmt::format("http://localhost:{}/storage/{}", port,
                                                   rq.target.substr(rq.target.rfind('/') + 1))}}};
    }
    auto r = Serve(im, rq);
    return r ? *r : NotFound();
  });
  port = reg.port();
  options_.registries[reg.addr()] = {.username = "user", .password = "pass", .insecure = true};
  auto digest = Pull(reg);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, im.manifest_digest);
  EXPECT_EQ(Blob(im.layer_digest), im.layer);
  EXPECT_TRUE(Whole());

  int tokens = 0, storage = 0;
  for (const FakeRequest& rq : reg.requests()) {
    if (rq.target.rfind("/token?", 0) == 0) {
      ++tokens;
      EXPECT_EQ(rq.target, "/token?service=fake%20reg&scope=repository%3Ateam%2Fapp%3Apull");
    } else if (rq.target.rfind("/storage/", 0) == 0) {
      ++storage;
      EXPECT_EQ(rq.authorization, "") << "credentials followed a redirect to " << rq.host;
    } else if (rq.target.find("/manifests/") != std::string::npos) {
      EXPECT_NE(rq.accept.find("application/vnd.oci.image.index.v1+json"), std::string::npos);
      EXPECT_NE(rq.accept.find("application/vnd.docker.distribution.manifest.v2+json"),
                std::string::npos);
    }
  }
  EXPECT_EQ(tokens, 1) << "the token is fetched once per pull";
  EXPECT_EQ(storage, 2);

  // Without credentials: an anonymous token, refused here.
  fs::remove_all(dir_ / "out");
  options_.registries.erase(reg.addr());
  auto anon = Pull(reg);
  ASSERT_FALSE(anon.ok());
  EXPECT_EQ(anon.status().code(), absl::StatusCode::kPermissionDenied) << anon.status();
  EXPECT_NE(anon.status().message().find("anonymous"), std::string_view::npos) << anon.status();
}

TEST_F(ClientTest, LyingDigestsAreDataLoss) {
  const Image im = MakeImage(10 << 10);
  std::string bad_layer = im.layer;
  bad_layer[5] ^= 1;
  const std::string other = "sha256:" + std::string(64, 'e');
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    if (rq.target == "/v2/team/app/blobs/" + im.layer_digest) return {.body = bad_layer};
    if (rq.target == "/v2/team/app/manifests/" + other) return {.body = im.manifest};
    if (rq.target == "/v2/team/app/manifests/lies") {
      return {.headers = {{"Docker-Content-Digest", other}}, .body = im.manifest};
    }
    auto r = Serve(im, rq);
    return r ? *r : NotFound();
  });
  auto blob = Pull(reg);
  ASSERT_FALSE(blob.ok());
  EXPECT_EQ(blob.status().code(), absl::StatusCode::kDataLoss) << blob.status();
  EXPECT_NE(blob.status().message().find(im.layer_digest), std::string_view::npos) << blob.status();
  EXPECT_FALSE(Whole());
  EXPECT_EQ(Blob(im.layer_digest), "");
  EXPECT_FALSE(fs::exists(dir_ / "out/blobs/sha256" / (im.layer_digest.substr(7) + ".partial")));

  for (const std::string& what : {"team/app@" + other, std::string("team/app:lies")}) {
    auto r = Pull(reg, what);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(im.manifest_digest), std::string_view::npos) << r.status();
  }
}

TEST_F(ClientTest, ADroppedConnectionIsResumedWithRange) {
  const Image im = MakeImage(300 << 10);
  std::atomic<int> layer_gets{0};
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    if (rq.target == "/v2/team/app/blobs/" + im.layer_digest) {
      if (layer_gets++ == 0) return {.body = im.layer, .send_only = 100000};
      if (rq.range != "bytes=100000-") return {.status = 400};
      return {.status = 206,
              .headers = {{"Content-Range", fmt::format("bytes 100000-{}/{}", im.layer.size() - 1,
                                                        im.layer.size())}},
              .body = im.layer.substr(100000)};
    }
    auto r = Serve(im, rq);
    return r ? *r : NotFound();
  });
  auto digest = Pull(reg);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(layer_gets, 2);
  EXPECT_EQ(Blob(im.layer_digest), im.layer);

  // No retries: the dropped connection is the pull's error, Unavailable, naming the URL.
  fs::remove_all(dir_ / "out");
  layer_gets = 0;
  options_.retries = 0;
  auto once = Pull(reg);
  ASSERT_FALSE(once.ok());
  EXPECT_EQ(once.status().code(), absl::StatusCode::kUnavailable) << once.status();
  EXPECT_NE(once.status().message().find("/v2/team/app/blobs/" + im.layer_digest),
            std::string_view::npos)
      << once.status();
  EXPECT_FALSE(Whole());
}

TEST_F(ClientTest, AServerThatIgnoresRangeStartsTheBlobOver) {
  const Image im = MakeImage(50 << 10);
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    auto r = Serve(im, rq);  // 200 and all of it, whatever the Range
    return r ? *r : NotFound();
  });
  const fs::path partial = dir_ / "out/blobs/sha256" / (im.layer_digest.substr(7) + ".partial");
  fs::create_directories(partial.parent_path());
  std::ofstream(partial, std::ios::binary) << im.layer.substr(0, 20000);
  auto digest = Pull(reg);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(Blob(im.layer_digest), im.layer);
  bool ranged = false;
  for (const auto& rq : reg.requests()) ranged = ranged || rq.range == "bytes=20000-";
  EXPECT_TRUE(ranged);

  // A whole .partial (stopped before its rename) is taken without a GET.
  fs::remove_all(dir_ / "out");
  fs::create_directories(partial.parent_path());
  std::ofstream(partial, std::ios::binary) << im.layer;
  const size_t before = reg.requests().size();
  digest = Pull(reg);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(Blob(im.layer_digest), im.layer);
  for (size_t i = before; i < reg.requests().size(); ++i) {
    EXPECT_EQ(reg.requests()[i].target.find(im.layer_digest), std::string::npos);
  }
}

TEST_F(ClientTest, LimitsHold) {
  const Image im = MakeImage(10 << 10);
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    if (rq.target == "/v2/team/app/blobs/" + im.layer_digest) {
      return {.body = im.layer + "and then some"};
    }
    auto r = Serve(im, rq);
    return r ? *r : NotFound();
  });
  auto longer = Pull(reg);
  ASSERT_FALSE(longer.ok());
  EXPECT_EQ(longer.status().code(), absl::StatusCode::kDataLoss) << longer.status();
  EXPECT_FALSE(Whole());

  options_.max_blob_bytes = 1000;
  auto big = Pull(reg);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();

  options_.max_manifest_bytes = 100;
  auto manifest = Pull(reg);
  ASSERT_FALSE(manifest.ok());
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kResourceExhausted) << manifest.status();
  EXPECT_FALSE(Whole());
}

TEST_F(ClientTest, CancelStopsATransferMidway) {
  const Image im = MakeImage(1 << 20);
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    if (rq.target == "/v2/team/app/blobs/" + im.layer_digest) {
      return {.body = im.layer, .send_only = 4096, .stall = true};
    }
    auto r = Serve(im, rq);
    return r ? *r : NotFound();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Pull(reg, "team/app:t", [&] { return std::chrono::steady_clock::now() - t0 > 500ms; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_FALSE(Whole());
}

TEST_F(ClientTest, ErrorsNameTheRegistrysCode) {
  FakeRegistry reg([&](const FakeRequest& rq) -> FakeResponse {
    if (rq.target.find("denied") != std::string::npos) {
      return {.status = 403,
              .body = R"({"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]})"};
    }
    if (rq.target.find("broken") != std::string::npos) return {.status = 500, .body = "oops"};
    return {.status = 404,
            .body = R"({"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known to registry"}]})"};
  });
  struct Case {
    std::string what;
    absl::StatusCode code;
    std::string text;
  } cases[] = {
      {"team/denied:t", absl::StatusCode::kPermissionDenied, "HTTP 403: DENIED requested access"},
      {"team/broken:t", absl::StatusCode::kUnavailable, "HTTP 500"},
      {"team/none:t", absl::StatusCode::kNotFound, "NAME_UNKNOWN repository name not known"},
  };
  for (const Case& c : cases) {
    auto r = Pull(reg, c.what);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find(c.text), std::string::npos) << msg;
    EXPECT_NE(msg.find("fetch the manifest"), std::string::npos) << msg;
    EXPECT_NE(msg.find("http://" + reg.addr() + "/v2/" + c.what.substr(0, c.what.find(':'))),
              std::string::npos)
        << msg;
  }
  // Nobody listening: Unavailable.
  auto ref = ParseReference("127.0.0.1:1/team/app:t");
  ASSERT_TRUE(ref.ok());
  auto refused = PullToLayout(*ref, options_, (dir_ / "out").string(), {}, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
}

// Every curl handle sbx makes (CurlEasyInit) connects through a close-on-exec socket: libcurl's
// own would be inherited by whatever another thread of sbxd starts during a pull.
TEST(CurlInit, TheHandlesSocketsAreCloseOnExec) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::unique_ptr<CURL, void (*)(CURL*)> c(CurlEasyInit(), curl_easy_cleanup);
  ASSERT_NE(c, nullptr);
  std::vector<int> flags;  // F_GETFD of each socket the transfer made
  auto record = +[](void* out, curl_socket_t fd, curlsocktype) -> int {
    static_cast<std::vector<int>*>(out)->push_back(::fcntl(fd, F_GETFD));
    return CURL_SOCKOPT_OK;
  };
  const std::string url = fmt::format("http://127.0.0.1:{}/v2/", ntohs(addr.sin_port));
  curl_easy_setopt(c.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(c.get(), CURLOPT_SOCKOPTFUNCTION, record);
  curl_easy_setopt(c.get(), CURLOPT_SOCKOPTDATA, &flags);
  curl_easy_setopt(c.get(), CURLOPT_TIMEOUT_MS, 300L);  // nobody answers: the connect is enough
  curl_easy_perform(c.get());
  ::close(listener);
  ASSERT_EQ(flags.size(), 1u);
  EXPECT_EQ(flags[0] & FD_CLOEXEC, FD_CLOEXEC);
}

}  // namespace
}  // namespace sbx::registry

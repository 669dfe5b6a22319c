// PullToLayout (registry.h) over libcurl: manifests and blobs of the Registry HTTP API v2, with
// anonymous, basic and bearer-token auth, verified digests and resumed blobs.
//
// Trust: the registry, its token service and whatever its redirects point at are untrusted.
// Every manifest fetched by digest is hashed against it, every blob against its descriptor's
// digest and size; responses are bounded (max_manifest_bytes, the descriptor's size) before
// they reach memory or disk; nothing lands under blobs/sha256/<hex> unverified, and index.json,
// which makes the directory a layout, is renamed into place last.
#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "archive/untar.h"
#include "common/curl_init.h"
#include "common/digest.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "image/oci.h"
#include "registry/auth.h"
#include "registry/registry.h"

namespace sbx::registry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
namespace oci = image::oci;

constexpr const char* kAccept =
    "Accept: application/vnd.oci.image.index.v1+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json";
// Error bodies are kept for their errors[0] only.
constexpr size_t kMaxErrorBody = 64 << 10;
constexpr uint64_t kMaxTokenAnswer = 1 << 20;

// The digest of a file already on disk (a blob fetched by an earlier pull), and its size.
absl::StatusOr<std::string> DigestOfPath(const std::string& path, uint64_t* size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return ErrnoStatus(errno, "registry: open " + path);
  SBX_ASSIGN_OR_RETURN(FileDigest d, Sha256OfFile(fd.get()));
  *size = d.size;
  return d.digest;
}

// Whole or not at all: a reader of the layout never sees half a file under `path`.
absl::Status WriteFileAtomic(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) return ErrnoStatus(errno, "registry: open " + tmp);
  absl::Status st = archive::WriteAll(fd.get(), data, tmp);
  if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoStatus(errno, "registry: fsync " + tmp);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoStatus(errno, "registry: rename " + path);
  }
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

template <typename T>
absl::StatusOr<T> AnnotateOr(absl::StatusOr<T> s, std::string_view context) {
  if (!s.ok()) return Annotate(s.status(), context);
  return s;
}

struct Response {
  long status = 0;
  std::string body;
  std::string content_type;
  std::string www_authenticate;
  std::string docker_digest;  // Docker-Content-Digest
};

// One HTTP exchange: where the body goes and how much of it may come.
struct Request {
  std::string url;
  bool accept_manifests = false;
  std::string authorization;  // a whole header line, or ""
  int fd = -1;                // the body goes here (2xx only) instead of Response::body
  uint64_t resume_from = 0;   // Range: bytes=N- when > 0
  uint64_t cap = 0;           // most bytes of the (whole) body
  // Past the cap: a blob longer than its descriptor lies (DataLoss); a manifest or token
  // answer is merely more than sbx takes (ResourceExhausted).
  absl::StatusCode over_cap = absl::StatusCode::kResourceExhausted;
};

// One pull: the registry's settings, the cached credentials' header, cancellation.
class Puller {
 public:
  Puller(const Reference& ref, const ClientOptions& opts, const image::CancelFn& cancelled)
      : ref_(ref), opts_(opts), cancelled_(cancelled) {
    auto it = opts.registries.find(ref.registry);
    if (it == opts.registries.end()) it = opts.registries.find("");
    if (it != opts.registries.end()) settings_ = it->second;
    // insecure means plain http: a lab registry without TLS. Certificates are always verified
    // for https (a private CA goes in ca_file).
    base_ = fmt::format("{}://{}/v2/{}", settings_.insecure ? "http" : "https", ref.registry,
                        ref.repository);
  }

  const std::string& base() const { return base_; }
  bool Cancelled() const { return cancelled_ && cancelled_(); }

  // GET of a manifest into memory, at most `cap` bytes.
  absl::StatusOr<Response> GetManifest(const std::string& url, uint64_t cap) {
    for (int attempt = 0;; ++attempt) {
      Response r;
      Request rq{.url = url, .accept_manifests = true, .authorization = Authorization(),
                 .cap = cap};
      SBX_RETURN_IF_ERROR(Perform(rq, &r));
      if (r.status == 401 && attempt == 0) {
        SBX_RETURN_IF_ERROR(Authenticate(r, rq.authorization));
        continue;
      }
      if (r.status == 401) return RefusedAfterAuth(url, r);
      if (r.status != 200) return HttpError(url, r);
      return r;
    }
  }

  // GET of a blob into `path`, resumed from the bytes already there; `cap` bytes in all.
  absl::Status GetBlob(const std::string& url, const std::string& path, uint64_t cap) {
    for (int attempt = 0;; ++attempt) {
      UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
      if (!fd) return ErrnoStatus(errno, "registry: open " + path);
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "registry: fstat " + path);
      uint64_t have = static_cast<uint64_t>(st.st_size);
      if (have >= cap) {  // whole but wrong (else it would have been renamed), or too long
        if (::ftruncate(fd.get(), 0) != 0) return ErrnoStatus(errno, "registry: truncate " + path);
        have = 0;
      }
      if (::lseek(fd.get(), static_cast<off_t>(have), SEEK_SET) < 0) {
        return ErrnoStatus(errno, "registry: lseek " + path);
      }
      Response r;
      Request rq{.url = url, .authorization = Authorization(), .fd = fd.get(),
                 .resume_from = have, .cap = cap,
                 .over_cap = absl::StatusCode::kDataLoss};
      SBX_RETURN_IF_ERROR(Perform(rq, &r));
      if (r.status == 401 && attempt == 0) {
        SBX_RETURN_IF_ERROR(Authenticate(r, rq.authorization));
        continue;
      }
      if (r.status == 401) return RefusedAfterAuth(url, r);
      if (r.status == 416 && have > 0 && attempt < 2) {  // it does not take our Range: start over
        if (::ftruncate(fd.get(), 0) != 0) return ErrnoStatus(errno, "registry: truncate " + path);
        continue;
      }
      if (r.status != 200 && r.status != 206) return HttpError(url, r);
      return absl::OkStatus();
    }
  }

 private:
  struct Transfer {
    const Puller* self;
    const Request* rq;
    Response* r;
    CURL* curl;
    uint64_t resume_from;
    uint64_t written = 0;
    bool started = false;
    absl::Status error;
  };

  std::string Authorization() const {
    std::lock_guard lock(header_mu_);
    return auth_header_;
  }

  static size_t OnHeader(char* data, size_t size, size_t n, void* p) {
    auto* t = static_cast<Transfer*>(p);
    std::string_view h(data, size * n);
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      if (h.size() < name.size() + 1 || h[name.size()] != ':') return std::nullopt;
      for (size_t i = 0; i < name.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(h[i])) != name[i]) return std::nullopt;
      }
      std::string v(h.substr(name.size() + 1, 8192));
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
      v.erase(0, std::min(v.find_first_not_of(' '), v.size()));
      return v;
    };
    // A redirect's headers come first: each response starts afresh.
    if (h.rfind("HTTP/", 0) == 0) *t->r = Response{};
    if (auto v = value("content-type")) t->r->content_type = *v;
    if (auto v = value("www-authenticate")) t->r->www_authenticate = *v;
    if (auto v = value("docker-content-digest")) t->r->docker_digest = *v;
    return size * n;
  }

  static size_t OnData(char* data, size_t size, size_t n, void* p) {
    auto* t = static_cast<Transfer*>(p);
    const size_t len = size * n;
    if (!t->started) {
      t->started = true;
      curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->r->status);
      // A server that ignored the Range sends it all again: so the file starts over.
      if (t->rq->fd >= 0 && t->r->status == 200 && t->resume_from > 0) {
        if (::ftruncate(t->rq->fd, 0) != 0 || ::lseek(t->rq->fd, 0, SEEK_SET) != 0) {
          t->error = ErrnoStatus(errno, "registry: restart a blob");
          return 0;
        }
        t->resume_from = 0;
      }
    }
    const bool to_file = t->rq->fd >= 0 && (t->r->status == 200 || t->r->status == 206);
    if (!to_file && t->r->status != 200) {  // an error body: its start is all we want
      const size_t keep = std::min(len, kMaxErrorBody - std::min(kMaxErrorBody, t->r->body.size()));
      t->r->body.append(data, keep);
      return len;
    }
    t->written += len;
    if (t->resume_from + t->written > t->rq->cap) {
      t->error = absl::Status(
          t->rq->over_cap,
          fmt::format("registry: GET {}: the response is longer than the {} bytes {}", t->rq->url,
                      t->rq->cap,
                      t->rq->fd >= 0 ? "its descriptor says" : "sbx takes (max_manifest_bytes)"));
      return 0;
    }
    if (!to_file) {
      t->r->body.append(data, len);
      return len;
    }
    absl::Status st = archive::WriteAll(t->rq->fd, std::string_view(data, len), "a blob");
    if (!st.ok()) {
      t->error = st;
      return 0;
    }
    return len;
  }

  static int OnProgress(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto* t = static_cast<Transfer*>(p);
    if (t->self->Cancelled()) {
      t->error = absl::CancelledError("registry pull: cancelled");
      return 1;
    }
    return 0;
  }

  absl::Status Perform(const Request& rq, Response* r) const {
    std::unique_ptr<CURL, void (*)(CURL*)> c(CurlEasyInit(), curl_easy_cleanup);
    if (!c) return absl::InternalError("registry: curl_easy_init failed");
    Transfer t{this, &rq, r, c.get(), rq.resume_from};
    curl_slist* headers = nullptr;
    if (rq.accept_manifests) headers = curl_slist_append(headers, kAccept);
    if (!rq.authorization.empty()) headers = curl_slist_append(headers, rq.authorization.c_str());
    std::unique_ptr<curl_slist, void (*)(curl_slist*)> hold(headers, curl_slist_free_all);
    const std::string range = fmt::format("{}-", rq.resume_from);
    CURL* h = c.get();
    curl_easy_setopt(h, CURLOPT_URL, rq.url.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "sbx");
    // Blob GETs are redirected to storage elsewhere. libcurl (>= 7.58) sends a custom
    // Authorization header on to the first request's host only, and with UNRESTRICTED_AUTH
    // off never to another: the credentials stay with the registry.
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(h, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    // A stalled transfer fails (and is retried) instead of holding the pull forever.
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    // "" rather than unset: the environment's *_proxy never applies, only the configuration.
    curl_easy_setopt(h, CURLOPT_PROXY, opts_.proxy.c_str());
    if (!opts_.no_proxy.empty()) curl_easy_setopt(h, CURLOPT_NOPROXY, opts_.no_proxy.c_str());
    if (!settings_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, settings_.ca_file.c_str());
    if (rq.resume_from > 0) curl_easy_setopt(h, CURLOPT_RANGE, range.c_str());
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &Puller::OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Puller::OnData);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &Puller::OnProgress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
    char detail[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, detail);
    const CURLcode rc = curl_easy_perform(h);
    if (!t.error.ok()) return t.error;
    if (rc != CURLE_OK) {
      // The buffer says which certificate check failed, or what the connection did.
      return absl::UnavailableError(fmt::format("registry: GET {}: {}{}{:.200}", rq.url,
                                                curl_easy_strerror(rc), detail[0] ? ": " : "",
                                                detail));
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    return absl::OkStatus();
  }

  // After a 401 to a request sent with `used`: works out the credentials the challenge asks
  // for and caches them for the rest of the pull.
  absl::Status Authenticate(const Response& r, const std::string& used) {
    std::lock_guard auth_lock(auth_mu_);
    if (Authorization() != used) return absl::OkStatus();  // another layer's thread did it
    const Challenge ch = ParseChallenge(r.www_authenticate);
    const bool creds = !settings_.username.empty();
    if (ch.scheme == "basic") {
      if (!creds) {
        return absl::UnauthenticatedError(fmt::format(
            "registry {} asks for credentials (HTTP 401, basic auth) and none are configured "
            "for it", ref_.registry));
      }
      const std::string header = BasicAuthorization(settings_.username, settings_.password);
      if (used == header) {
        return absl::PermissionDeniedError(fmt::format(
            "registry {} refused the configured credentials of user \"{:.100}\" (HTTP 401)",
            ref_.registry, settings_.username));
      }
      SetAuthorization(header);
      return absl::OkStatus();
    }
    if (ch.scheme != "bearer") {
      return absl::UnauthenticatedError(fmt::format(
          "registry {} answered HTTP 401 with auth scheme \"{:.40}\", which sbx does not speak",
          ref_.registry, ch.scheme));
    }
    SBX_ASSIGN_OR_RETURN(std::string token, FetchToken(ch, creds));
    SetAuthorization("Authorization: Bearer " + token);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> FetchToken(const Challenge& ch, bool creds) const {
    auto get = [&](const char* k) {
      auto it = ch.params.find(k);
      return it == ch.params.end() ? std::string() : it->second;
    };
    const std::string realm = get("realm");
    const bool https = realm.rfind("https://", 0) == 0;
    if (!https && realm.rfind("http://", 0) != 0) {
      return absl::UnauthenticatedError(fmt::format(
          "registry {}: its token realm \"{:.200}\" is not an http(s) URL", ref_.registry, realm));
    }
    // Passwords cross the network in the clear only to a registry configured as plain http.
    if (creds && !https && !settings_.insecure) {
      return absl::UnauthenticatedError(fmt::format(
          "registry {}: its token realm {:.200} is plain http; sbx sends credentials there only "
          "when the registry is configured insecure", ref_.registry, realm));
    }
    std::unique_ptr<CURL, void (*)(CURL*)> c(CurlEasyInit(), curl_easy_cleanup);
    auto escape = [&](const std::string& s) {
      char* e = curl_easy_escape(c.get(), s.data(), static_cast<int>(s.size()));
      std::string out = e ? e : "";
      curl_free(e);
      return out;
    };
    std::string url = realm + (realm.find('?') == std::string::npos ? "?" : "&");
    if (!get("service").empty()) url += "service=" + escape(get("service")) + "&";
    url += "scope=" + escape("repository:" + ref_.repository + ":pull");
    Response r;
    Request rq{.url = url, .cap = kMaxTokenAnswer};
    if (creds) rq.authorization = BasicAuthorization(settings_.username, settings_.password);
    SBX_RETURN_IF_ERROR(Annotate(Perform(rq, &r), "get a pull token"));
    if (r.status == 401 || r.status == 403) {
      return absl::PermissionDeniedError(fmt::format(
          "registry {}: its token service {:.200} refused {} (HTTP {})", ref_.registry, realm,
          creds ? "the configured credentials" : "an anonymous pull", r.status));
    }
    if (r.status != 200) return Annotate(HttpError(realm, r), "get a pull token");
    auto token = TokenFromAnswer(r.body);
    if (!token.ok()) {
      return absl::UnauthenticatedError(fmt::format(
          "registry {}: token service {:.200}: {}", ref_.registry, realm, std::string(token.status().message())));
    }
    return token;
  }

  void SetAuthorization(std::string header) {
    std::lock_guard lock(header_mu_);
    auth_header_ = std::move(header);
  }

  // A 401 to the credentials the registry's own challenge asked for.
  absl::Status RefusedAfterAuth(const std::string& url, const Response& r) const {
    return absl::PermissionDeniedError(fmt::format(
        "registry {} refused {} (GET {}: HTTP 401{})", ref_.registry,
        settings_.username.empty() ? "an anonymous token"
                                   : fmt::format("the credentials of user \"{:.100}\"",
                                                 settings_.username),
        url, RegistryErrorDetail(r.body)));
  }

  static absl::Status HttpError(const std::string& url, const Response& r) {
    const std::string msg = fmt::format("registry: GET {}: HTTP {}{}", url, r.status,
                                        RegistryErrorDetail(r.body));
    if (r.status == 404) return absl::NotFoundError(msg);
    if (r.status == 401) return absl::UnauthenticatedError(msg);
    if (r.status == 403) return absl::PermissionDeniedError(msg);
    if (r.status == 408 || r.status == 429 || r.status >= 500) return absl::UnavailableError(msg);
    return absl::FailedPreconditionError(msg);
  }

  const Reference ref_;
  const ClientOptions& opts_;
  const image::CancelFn& cancelled_;
  RegistrySettings settings_;
  std::string base_;
  std::mutex auth_mu_;            // one token fetch at a time
  mutable std::mutex header_mu_;  // guards auth_header_
  std::string auth_header_;       // the cached credentials, a whole header line
};

// The image manifest of `ref` (through an index or manifest list to linux/amd64), verified
// against every digest that names it.
struct FetchedManifest {
  std::string body;
  std::string digest;
  std::string media_type;
  oci::Manifest manifest;
};

// The index entry for linux/amd64; an index of one entry without a platform is taken as is.
absl::StatusOr<oci::Descriptor> PickPlatform(const oci::Index& index) {
  SBX_ASSIGN_OR_RETURN(oci::Descriptor d, oci::Choose(index, ""));
  if ((!d.os.empty() && d.os != "linux") || (!d.architecture.empty() && d.architecture != "amd64")) {
    return absl::NotFoundError(fmt::format("image index: no linux/amd64 image (it has {}/{})",
                                           d.os, d.architecture));
  }
  return d;
}

std::string MediaTypeOf(const Response& r) {
  std::string media = r.content_type.substr(0, r.content_type.find(';'));
  auto j = ParseUntrustedJson(r.body);
  if (j.ok() && j->is_object()) {
    auto it = j->find("mediaType");
    if (it != j->end() && it->is_string()) media = it->get<std::string>();
  }
  return media;
}

absl::StatusOr<FetchedManifest> FetchManifest(Puller& p, const Reference& ref,
                                              const ClientOptions& options) {
  std::string want = ref.digest.empty() ? ref.tag : ref.digest;
  for (int depth = 0;; ++depth) {
    const std::string url = p.base() + "/manifests/" + want;
    SBX_ASSIGN_OR_RETURN(Response r, p.GetManifest(url, options.max_manifest_bytes));
    FetchedManifest out;
    out.digest = Sha256Digest(r.body);
    // By digest: the bytes must be the ones asked for. By tag: the registry's own digest, when
    // it says one, must match what came.
    const bool by_digest = want.rfind("sha256:", 0) == 0;
    if ((by_digest && out.digest != want) ||
        (!by_digest && r.docker_digest.rfind("sha256:", 0) == 0 && r.docker_digest != out.digest)) {
      return absl::DataLossError(fmt::format(
          "registry: GET {}: the manifest hashes to {}, not {}", url, out.digest,
          by_digest ? want : r.docker_digest));
    }
    out.media_type = MediaTypeOf(r);
    if (out.media_type == oci::kOciIndex || out.media_type == oci::kDockerList) {
      if (depth >= 1) {
        return absl::InvalidArgumentError(fmt::format("registry: GET {}: an index in an index", url));
      }
      SBX_ASSIGN_OR_RETURN(oci::Index index, AnnotateOr(oci::ParseIndex(r.body), "GET " + url));
      SBX_ASSIGN_OR_RETURN(oci::Descriptor d, AnnotateOr(PickPlatform(index), "GET " + url));
      if (d.size > options.max_manifest_bytes) {
        return absl::ResourceExhaustedError(fmt::format(
            "registry: manifest {} is {} bytes, more than {}", d.digest, d.size,
            options.max_manifest_bytes));
      }
      want = d.digest;
      continue;
    }
    SBX_ASSIGN_OR_RETURN(out.manifest, AnnotateOr(oci::ParseManifest(r.body), "GET " + url));
    if (out.media_type.empty()) out.media_type = std::string(oci::kOciManifest);
    out.body = std::move(r.body);
    return out;
  }
}

// Config and layers into blobs/sha256/, `parallel_layers` at a time.
class BlobFetcher {
 public:
  BlobFetcher(Puller& p, const ClientOptions& options, const std::string& blob_dir,
              const image::ProgressFn& progress)
      : p_(p), options_(options), dir_(blob_dir), progress_(progress) {}

  absl::Status FetchAll(const oci::Manifest& m) {
    std::set<std::string> seen;
    for (const oci::Descriptor& d : {m.config}) todo_.push_back(d);
    for (const oci::Descriptor& d : m.layers) todo_.push_back(d);
    // The same blob twice (an empty layer repeated) is fetched once: two threads must never
    // write one .partial.
    std::erase_if(todo_, [&](const oci::Descriptor& d) { return !seen.insert(d.digest).second; });
    for (const auto& d : todo_) {
      if (d.size > options_.max_blob_bytes) {
        return absl::ResourceExhaustedError(fmt::format(
            "registry: blob {} is {} bytes, more than the {} allowed", d.digest, d.size,
            options_.max_blob_bytes));
      }
      total_ += d.size;
    }
    const int workers =
        std::clamp<int>(options_.parallel_layers, 1, static_cast<int>(todo_.size()));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) threads.emplace_back([this] { Work(); });
    for (auto& t : threads) t.join();
    return first_error_;
  }

 private:
  void Work() {
    for (;;) {
      const size_t i = next_++;
      if (i >= todo_.size()) return;
      {
        std::lock_guard lock(mu_);
        if (!first_error_.ok()) return;
      }
      absl::Status st = Fetch(todo_[i]);
      std::lock_guard lock(mu_);
      if (!st.ok() && first_error_.ok()) first_error_ = Annotate(st, "fetch blob " + todo_[i].digest);
    }
  }

  absl::Status Fetch(const oci::Descriptor& d) {
    const std::string final_path = dir_ + d.digest.substr(7);
    const std::string partial = final_path + ".partial";
    const std::string url = p_.base() + "/blobs/" + d.digest;
    uint64_t size = 0;
    if (auto have = DigestOfPath(final_path, &size); have.ok() && *have == d.digest && size == d.size) {
      Done(d, "already here");
      return absl::OkStatus();
    }
    // A whole .partial (a pull stopped between its last byte and the rename) needs no GET.
    if (auto have = DigestOfPath(partial, &size); have.ok() && *have == d.digest && size == d.size) {
      return Finish(d, partial, final_path, "fetched earlier");
    }
    bool resumed = false, restarted = false;
    absl::Status last;
    for (int attempt = 0; attempt <= options_.retries; ++attempt) {
      if (p_.Cancelled()) return absl::CancelledError("registry pull: cancelled");
      struct stat st {};
      resumed = resumed || (::stat(partial.c_str(), &st) == 0 && st.st_size > 0);
      last = p_.GetBlob(url, partial, d.size);
      if (last.ok()) {
        SBX_ASSIGN_OR_RETURN(std::string got, DigestOfPath(partial, &size));
        if (got == d.digest && size == d.size) break;
        ::unlink(partial.c_str());
        // What an earlier try left may have been wrong: one more go, from the first byte.
        if (resumed && !restarted) {
          restarted = true;
          resumed = false;
          --attempt;
          continue;
        }
        return absl::DataLossError(fmt::format(
            "registry: GET {}: {} bytes hashing to {} came; the manifest says {} bytes, {}", url,
            size, got, d.size, d.digest));
      }
      // Only what a later try can cure is retried: a dropped connection, a busy server.
      if (!absl::IsUnavailable(last) || attempt == options_.retries) return last;
      spdlog::info("registry: GET {} (try {} of {}): {}; resuming", url, attempt + 1,
                   options_.retries + 1, std::string(last.message()));
      std::this_thread::sleep_for(std::chrono::milliseconds(250 << std::min(attempt, 4)));
    }
    if (!last.ok()) return last;
    return Finish(d, partial, final_path, "fetched");
  }

  absl::Status Finish(const oci::Descriptor& d, const std::string& partial,
                      const std::string& final_path, std::string_view how) {
    if (::rename(partial.c_str(), final_path.c_str()) != 0) {
      return ErrnoStatus(errno, "registry: rename " + partial);
    }
    Done(d, how);
    return absl::OkStatus();
  }

  void Done(const oci::Descriptor& d, std::string_view how) {
    std::lock_guard lock(mu_);
    bytes_done_ += d.size;
    ++done_;
    if (!progress_) return;
    progress_({.stage = "fetching",
               .layers_done = done_,
               .layers_total = static_cast<int>(todo_.size()),
               .bytes_done = bytes_done_,
               .bytes_total = total_,
               .message = fmt::format("blob {} {}: {} bytes", d.digest.substr(0, 19), how, d.size)});
  }

  Puller& p_;
  const ClientOptions& options_;
  const std::string dir_;
  const image::ProgressFn& progress_;
  std::vector<oci::Descriptor> todo_;
  uint64_t total_ = 0;
  std::atomic<size_t> next_{0};
  std::mutex mu_;  // guards what follows, and serializes progress_
  absl::Status first_error_;
  int done_ = 0;
  uint64_t bytes_done_ = 0;
};

}  // namespace

absl::StatusOr<std::string> PullToLayout(const Reference& ref, const ClientOptions& options,
                                         const std::string& layout_dir,
                                         const image::ProgressFn& progress,
                                         const image::CancelFn& cancelled,
                                         const std::function<bool(const std::string&)>& have) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  const std::string what = "pull " + ref.String();
  std::error_code ec;
  fs::create_directories(fs::path(layout_dir) / "blobs" / "sha256", ec);
  if (ec) {
    return absl::InternalError(fmt::format("registry: {}: mkdir {}: {}", what, layout_dir,
                                           ec.message()));
  }
  Puller p(ref, options, cancelled);
  if (progress) progress({.stage = "fetching", .message = "fetching the manifest of " + ref.String()});
  SBX_ASSIGN_OR_RETURN(FetchedManifest m,
                       AnnotateOr(FetchManifest(p, ref, options), what + ": fetch the manifest"));
  if (have && have(m.digest)) return m.digest;
  const std::string blob_dir = layout_dir + "/blobs/sha256/";
  BlobFetcher blobs(p, options, blob_dir, progress);
  SBX_RETURN_IF_ERROR(Annotate(blobs.FetchAll(m.manifest), what));
  SBX_RETURN_IF_ERROR(
      Annotate(WriteFileAtomic(blob_dir + m.digest.substr(7), m.body), what));
  SBX_RETURN_IF_ERROR(Annotate(
      WriteFileAtomic(layout_dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})"), what));
  // Last: with index.json there, the directory is a whole layout.
  json index = {{"schemaVersion", 2},
                {"manifests",
                 {{{"mediaType", m.media_type},
                   {"digest", m.digest},
                   {"size", m.body.size()}}}}};
  SBX_RETURN_IF_ERROR(Annotate(WriteFileAtomic(layout_dir + "/index.json", index.dump()), what));
  return m.digest;
}

}  // namespace sbx::registry

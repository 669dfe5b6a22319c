// PullToLayout (registry.h) over libcurl: manifests and blobs of the Registry HTTP API v2, with
// anonymous, basic and bearer-token auth, verified digests and resumed blobs.
#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/digest.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "image/layer_unpack.h"
#include "image/oci.h"
#include "registry/challenge.h"
#include "registry/registry.h"

namespace sbx::registry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kAccept =
    "Accept: application/vnd.oci.image.index.v1+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json";

// The digest and size of a blob file ("" when it is not there).
absl::StatusOr<FileDigest> DigestOfPath(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return ErrnoStatus(errno, "registry: open " + path);
  return Sha256OfFile(fd.get());
}

// "Authorization: Basic …" of the configured credentials.
std::string BasicHeader(const RegistrySettings& s) {
  const std::string plain = s.username + ":" + s.password;
  std::string b64((plain.size() + 2) / 3 * 4 + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()),
                                reinterpret_cast<const unsigned char*>(plain.data()),
                                static_cast<int>(plain.size()));
  b64.resize(static_cast<size_t>(n));
  return "Authorization: Basic " + b64;
}

std::string Escape(CURL* c, const std::string& s) {
  char* e = curl_easy_escape(c, s.data(), static_cast<int>(s.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

struct Response {
  long status = 0;
  std::string body;
  std::string content_type;
  std::string www_authenticate;
};

// One pull: the registry's settings, the credentials' answer (a header), cancellation.
class Puller {
 public:
  Puller(const Reference& ref, const ClientOptions& opts, const image::CancelFn& cancelled)
      : ref_(ref), opts_(opts), cancelled_(cancelled) {
    auto it = opts.registries.find(ref.registry);
    if (it == opts.registries.end()) it = opts.registries.find("");
    if (it != opts.registries.end()) settings_ = it->second;
    // insecure: plain http (a lab registry without TLS).
    base_ = fmt::format("{}://{}/v2/{}", settings_.insecure ? "http" : "https", ref.registry,
                        ref.repository);
  }

  const std::string& base() const { return base_; }

  // GET of a manifest or small document into memory, at most `cap` bytes.
  absl::StatusOr<Response> GetSmall(const std::string& url, uint64_t cap, bool accept) {
    for (int attempt = 0;; ++attempt) {
      Response r;
      SBX_RETURN_IF_ERROR(Perform(url, accept, &r, nullptr, 0, cap));
      if (r.status == 401 && attempt == 0 && !r.www_authenticate.empty()) {
        SBX_RETURN_IF_ERROR(Authenticate(r.www_authenticate));
        continue;
      }
      if (r.status != 200) return HttpError(url, r);
      return r;
    }
  }

  // GET of a blob into `path` (resumed from its current size), at most `cap` bytes in all.
  absl::Status GetToFile(const std::string& url, const std::string& path, uint64_t cap) {
    for (int attempt = 0;; ++attempt) {
      struct stat st {};
      uint64_t have = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
      if (!fd) return ErrnoStatus(errno, "registry: open " + path);
      if (::lseek(fd.get(), static_cast<off_t>(have), SEEK_SET) < 0) {
        return ErrnoStatus(errno, "registry: lseek " + path);
      }
      Response r;
      SBX_RETURN_IF_ERROR(Perform(url, false, &r, &fd, have, cap));
      if (r.status == 401 && attempt == 0 && !r.www_authenticate.empty()) {
        SBX_RETURN_IF_ERROR(Authenticate(r.www_authenticate));
        continue;
      }
      if (r.status == 416 && have > 0) {  // the partial file is whole already, or wrong
        if (::ftruncate(fd.get(), 0) != 0) return ErrnoStatus(errno, "registry: truncate");
        continue;
      }
      if (r.status != 200 && r.status != 206) return HttpError(url, r);
      return absl::OkStatus();
    }
  }

 private:
  struct Transfer {
    Puller* self;
    Response* r;
    UniqueFd* fd;
    uint64_t resume_from;
    uint64_t cap;
    uint64_t written = 0;
    bool started = false;
    absl::Status error;
    CURL* curl;
  };

  static size_t OnHeader(char* data, size_t size, size_t n, void* p) {
    auto* t = static_cast<Transfer*>(p);
    std::string_view h(data, size * n);
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      if (h.size() < name.size() + 1) return std::nullopt;
      for (size_t i = 0; i < name.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(h[i])) != name[i]) return std::nullopt;
      }
      if (h[name.size()] != ':') return std::nullopt;
      std::string v(h.substr(name.size() + 1));
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      return v;
    };
    if (auto v = value("content-type")) t->r->content_type = *v;
    if (auto v = value("www-authenticate")) t->r->www_authenticate = *v;
    return size * n;
  }

  static size_t OnData(char* data, size_t size, size_t n, void* p) {
    auto* t = static_cast<Transfer*>(p);
    const size_t len = size * n;
    if (!t->started) {
      t->started = true;
      curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->r->status);
      // A server that ignored the Range starts over: so does the file.
      if (t->fd != nullptr && t->r->status == 200 && t->resume_from > 0) {
        if (::ftruncate(t->fd->get(), 0) != 0 || ::lseek(t->fd->get(), 0, SEEK_SET) != 0) {
          t->error = ErrnoStatus(errno, "registry: restart a blob");
          return 0;
        }
        t->resume_from = 0;
      }
    }
    t->written += len;
    if (t->resume_from + t->written > t->cap) {
      t->error = absl::DataLossError(
          fmt::format("registry: the response is larger than the {} bytes expected", t->cap));
      return 0;
    }
    const bool ok_status = t->r->status == 200 || t->r->status == 206;
    if (t->fd == nullptr || !ok_status) {
      if (t->r->body.size() < (64u << 10) || t->fd == nullptr) t->r->body.append(data, len);
      return len;
    }
    const char* q = data;
    size_t left = len;
    while (left > 0) {
      ssize_t w = ::write(t->fd->get(), q, left);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        t->error = ErrnoStatus(errno, "registry: write a blob");
        return 0;
      }
      q += w;
      left -= static_cast<size_t>(w);
    }
    return len;
  }

  static int OnProgress(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto* t = static_cast<Transfer*>(p);
    if (t->self->cancelled_ && t->self->cancelled_()) {
      t->error = absl::CancelledError("registry pull: cancelled");
      return 1;
    }
    return 0;
  }

  absl::Status Perform(const std::string& url, bool accept, Response* r, UniqueFd* fd,
                       uint64_t resume_from, uint64_t cap) {
    std::unique_ptr<CURL, void (*)(CURL*)> c(curl_easy_init(), curl_easy_cleanup);
    if (!c) return absl::InternalError("registry: curl_easy_init");
    Transfer t{this, r, fd, resume_from, cap};
    t.curl = c.get();
    curl_slist* headers = nullptr;
    if (accept) headers = curl_slist_append(headers, kAccept);
    {
      std::lock_guard lock(mu_);
      if (!auth_header_.empty()) headers = curl_slist_append(headers, auth_header_.c_str());
    }
    std::unique_ptr<curl_slist, void (*)(curl_slist*)> hold(headers, curl_slist_free_all);
    const std::string range = fmt::format("{}-", resume_from);
    CURL* h = c.get();
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "sbx");
    // Blob GETs are redirected to storage; curl sends our Authorization header to the
    // registry's host only (CURLOPT_UNRESTRICTED_AUTH off).
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(h, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    // The environment's *_proxy never applies: only the configuration's.
    curl_easy_setopt(h, CURLOPT_PROXY, opts_.proxy.c_str());
    if (!opts_.no_proxy.empty()) curl_easy_setopt(h, CURLOPT_NOPROXY, opts_.no_proxy.c_str());
    if (!settings_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, settings_.ca_file.c_str());
    if (resume_from > 0) curl_easy_setopt(h, CURLOPT_RANGE, range.c_str());
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &Puller::OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Puller::OnData);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &Puller::OnProgress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
    CURLcode rc = curl_easy_perform(h);
    if (!t.error.ok()) return t.error;
    if (rc != CURLE_OK) {
      return absl::UnavailableError(
          fmt::format("registry: GET {}: {}", url, curl_easy_strerror(rc)));
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    return absl::OkStatus();
  }

  absl::Status Authenticate(const std::string& challenge) {
    const size_t sp = challenge.find(' ');
    std::string scheme = challenge.substr(0, sp);
    for (auto& ch : scheme) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const bool creds = !settings_.username.empty();
    if (scheme == "basic") {
      if (!creds) {
        return absl::UnauthenticatedError(fmt::format(
            "registry {} asks for credentials: set them in templates.registry_auth_file",
            ref_.registry));
      }
      const std::string header = BasicHeader(settings_);
      std::lock_guard lock(mu_);
      if (auth_header_ == header) {
        return absl::PermissionDeniedError(
            fmt::format("registry {} refused the configured credentials", ref_.registry));
      }
      auth_header_ = header;
      return absl::OkStatus();
    }
    if (scheme != "bearer") {
      return absl::UnauthenticatedError(
          fmt::format("registry {} asks for auth scheme \"{:.40}\", which sbx does not speak",
                      ref_.registry, scheme));
    }
    auto params = ParseChallengeParams(sp == std::string::npos ? "" : challenge.substr(sp + 1));
    const std::string realm = params["realm"];
    if (realm.rfind("https://", 0) != 0 && realm.rfind("http://", 0) != 0) {
      return absl::UnauthenticatedError(
          fmt::format("registry {}: its token realm \"{:.200}\" is not a URL", ref_.registry, realm));
    }
    std::unique_ptr<CURL, void (*)(CURL*)> c(curl_easy_init(), curl_easy_cleanup);
    std::string scope = params.count("scope") ? params["scope"]
                                              : "repository:" + ref_.repository + ":pull";
    std::string url = realm + (realm.find('?') == std::string::npos ? "?" : "&") +
                      "service=" + Escape(c.get(), params["service"]) +
                      "&scope=" + Escape(c.get(), scope);
    Response r;
    {
      // The token endpoint takes the configured credentials as basic auth; they go nowhere else.
      std::lock_guard lock(mu_);
      auth_header_.clear();
    }
    absl::Status st;
    if (creds) {
      {
        std::lock_guard lock(mu_);
        auth_header_ = BasicHeader(settings_);
      }
      st = Perform(url, false, &r, nullptr, 0, 1 << 20);
      std::lock_guard lock(mu_);
      auth_header_.clear();
    } else {
      st = Perform(url, false, &r, nullptr, 0, 1 << 20);
    }
    SBX_RETURN_IF_ERROR(st);
    if (r.status == 401 || r.status == 403) {
      return absl::PermissionDeniedError(fmt::format(
          "registry {}: its token service refused {} (HTTP {})", ref_.registry,
          creds ? "the configured credentials" : "an anonymous pull", r.status));
    }
    if (r.status != 200) return HttpError(realm, r);
    auto j = ParseUntrustedJson(r.body);
    std::string token;
    if (j.ok() && j->is_object()) {
      token = j->value("token", "");
      if (token.empty()) token = j->value("access_token", "");
    }
    if (token.empty() || token.size() > 16384 ||
        token.find_first_of("\r\n") != std::string::npos) {
      return absl::UnauthenticatedError(
          fmt::format("registry {}: its token service answered no usable token", ref_.registry));
    }
    std::lock_guard lock(mu_);
    auth_header_ = "Authorization: Bearer " + token;
    return absl::OkStatus();
  }

  absl::Status HttpError(const std::string& url, const Response& r) const {
    std::string detail;
    auto j = ParseUntrustedJson(r.body);
    if (j.ok() && j->is_object() && j->contains("errors") && (*j)["errors"].is_array() &&
        !(*j)["errors"].empty() && (*j)["errors"][0].is_object()) {
      const json& e = (*j)["errors"][0];
      detail = fmt::format(": {} {}", e.value("code", ""), e.value("message", ""));
    }
    const std::string msg = fmt::format("registry: GET {}: HTTP {}{:.300}", url, r.status, detail);
    if (r.status == 404) return absl::NotFoundError(msg);
    if (r.status == 401) return absl::UnauthenticatedError(msg);
    if (r.status == 403) return absl::PermissionDeniedError(msg);
    if (r.status == 429 || r.status >= 500) return absl::UnavailableError(msg);
    return absl::FailedPreconditionError(msg);
  }

  const Reference ref_;
  const ClientOptions& opts_;
  const image::CancelFn& cancelled_;
  RegistrySettings settings_;
  std::string base_;
  std::mutex mu_;
  std::string auth_header_;
};

absl::Status WriteFile(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return ErrnoStatus(errno, "registry: open " + tmp);
  if (::write(fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
    return ErrnoStatus(errno, "registry: write " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus(errno, "registry: rename " + path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> PullToLayout(const Reference& ref, const ClientOptions& options,
                                         const std::string& layout_dir,
                                         const image::ProgressFn& progress,
                                         const image::CancelFn& cancelled) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::error_code ec;
  fs::create_directories(fs::path(layout_dir) / "blobs" / "sha256", ec);
  if (ec) return absl::InternalError(fmt::format("registry: mkdir {}: {}", layout_dir, ec.message()));
  Puller p(ref, options, cancelled);
  std::mutex progress_mu;
  auto report = [&](const image::Progress& pr) {
    if (!progress) return;
    std::lock_guard lock(progress_mu);
    progress(pr);
  };
  report({.stage = "fetching", .message = "fetching the manifest of " + ref.String()});

  // The manifest: by digest (verified against it), or the tag's, then the platform's.
  std::string want = ref.digest.empty() ? ref.tag : ref.digest;
  SBX_ASSIGN_OR_RETURN(Response r, p.GetSmall(p.base() + "/manifests/" + want,
                                              options.max_manifest_bytes, true));
  std::string digest = Sha256Digest(r.body);
  if (!ref.digest.empty() && digest != ref.digest) {
    return absl::DataLossError(fmt::format(
        "registry: the manifest of {} hashes to {}, not the digest asked for", ref.String(), digest));
  }
  std::string media = r.content_type.substr(0, r.content_type.find(';'));
  {
    auto j = ParseUntrustedJson(r.body);
    if (j.ok() && j->is_object() && j->contains("mediaType") && (*j)["mediaType"].is_string()) {
      media = (*j)["mediaType"].get<std::string>();
    }
  }
  for (int depth = 0; media == image::oci::kOciIndex || media == image::oci::kDockerList; ++depth) {
    if (depth >= 2) return absl::InvalidArgumentError("registry: indexes nest too deep");
    SBX_ASSIGN_OR_RETURN(image::oci::Index index, image::oci::ParseIndex(r.body));
    SBX_ASSIGN_OR_RETURN(image::oci::Descriptor d, image::oci::Choose(index, ""));
    SBX_ASSIGN_OR_RETURN(r, p.GetSmall(p.base() + "/manifests/" + d.digest,
                                       options.max_manifest_bytes, true));
    digest = Sha256Digest(r.body);
    if (digest != d.digest) {
      return absl::DataLossError(fmt::format(
          "registry: the linux/amd64 manifest hashes to {}, not {} as its index says", digest,
          d.digest));
    }
    media = d.media_type;
  }
  SBX_ASSIGN_OR_RETURN(image::oci::Manifest m, image::oci::ParseManifest(r.body));
  const std::string blobs = layout_dir + "/blobs/sha256/";
  SBX_RETURN_IF_ERROR(WriteFile(blobs + digest.substr(7), r.body));

  std::vector<image::oci::Descriptor> todo = {m.config};
  for (const auto& l : m.layers) todo.push_back(l);
  uint64_t total = 0;
  for (const auto& d : todo) total += d.size;
  std::atomic<uint64_t> done_bytes{0};
  std::atomic<int> done_layers{0};
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  absl::Status first_error;
  auto fetch = [&](const image::oci::Descriptor& d) -> absl::Status {
    if (d.size > options.max_blob_bytes) {
      return absl::ResourceExhaustedError(fmt::format(
          "registry: blob {} is {} bytes, more than {}", d.digest, d.size, options.max_blob_bytes));
    }
    const std::string final_path = blobs + d.digest.substr(7);
    const std::string partial = final_path + ".partial";
    if (auto have = DigestOfPath(final_path); have.ok() && have->digest == d.digest &&
                                               have->size == d.size) {
      return absl::OkStatus();  // fetched by an earlier try
    }
    absl::Status last;
    for (int attempt = 0; attempt <= options.retries; ++attempt) {
      if (cancelled && cancelled()) return absl::CancelledError("registry pull: cancelled");
      last = p.GetToFile(p.base() + "/blobs/" + d.digest, partial, d.size);
      if (last.ok() || absl::IsCancelled(last) || absl::IsNotFound(last) ||
          absl::IsPermissionDenied(last) || absl::IsUnauthenticated(last)) {
        break;
      }
      spdlog::info("registry: blob {} (try {}): {}; resuming", d.digest, attempt + 1,
                   std::string(last.message()));
    }
    SBX_RETURN_IF_ERROR(last);
    SBX_ASSIGN_OR_RETURN(FileDigest got, DigestOfPath(partial));
    if (got.digest != d.digest || got.size != d.size) {
      ::unlink(partial.c_str());
      return absl::DataLossError(fmt::format(
          "registry: blob {} arrived as {} bytes hashing to {}; its manifest says {} bytes",
          d.digest, got.size, got.digest, d.size));
    }
    if (::rename(partial.c_str(), final_path.c_str()) != 0) {
      return ErrnoStatus(errno, "registry: rename " + final_path);
    }
    done_bytes += d.size;
    report({.stage = "fetching",
            .layers_done = ++done_layers,
            .layers_total = static_cast<int>(todo.size()),
            .bytes_done = done_bytes.load(),
            .bytes_total = total,
            .message = fmt::format("blob {} fetched: {:.1f} MiB", d.digest.substr(0, 19),
                                   static_cast<double>(d.size) / (1 << 20))});
    return absl::OkStatus();
  };
  const int workers = std::max(1, std::min<int>(options.parallel_layers, static_cast<int>(todo.size())));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (;;) {
        const size_t i = next++;
        if (i >= todo.size()) return;
        {
          std::lock_guard lock(err_mu);
          if (!first_error.ok()) return;
        }
        absl::Status st = fetch(todo[i]);
        if (!st.ok()) {
          std::lock_guard lock(err_mu);
          if (first_error.ok()) first_error = st;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!first_error.ok()) return Annotate(first_error, "pull " + ref.String());

  json index = {{"schemaVersion", 2},
                {"manifests",
                 {{{"mediaType", m.media_type.empty() ? std::string(image::oci::kOciManifest)
                                                      : m.media_type},
                   {"digest", digest},
                   {"size", r.body.size()}}}}};
  SBX_RETURN_IF_ERROR(WriteFile(layout_dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})"));
  SBX_RETURN_IF_ERROR(WriteFile(layout_dir + "/index.json", index.dump()));
  return digest;
}

}  // namespace sbx::registry

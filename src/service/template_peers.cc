// Templates across the nodes of a cluster (docs/scale.md, "Templates"). The catalogue (releases
// and tags) is shared in the store; the layers are each node's own. A node keeps the blob of
// every layer it unpacks (LayerStore keep_blobs) and gives it to the other nodes at
// GET /v1/admin/layers/{diff_id}; before a create of an image template, a node asks the store
// what the reference names now and fetches from a node that holds them the layers it lacks,
// verifying each against its diff_id as an import does. A node therefore never creates from a
// tag another node moved, and a template made on one node can be used on all of them.
#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/curl_init.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/template_ref.h"
#include "service/template_service.h"

namespace sbx::service {
namespace {

namespace fs = std::filesystem;
using store::ImageRecord;
using store::NodeRecord;
using store::TagRecord;
using store::Tx;

struct Download {
  int fd = -1;
  uint64_t written = 0;
  uint64_t max_bytes = 0;
  std::string error_body;  // the first bytes of a non-200 answer, for the message
  long status = 0;
  CURL* handle = nullptr;
  const image::CancelFn* cancelled = nullptr;
  bool too_big = false;
  int write_errno = 0;
};

size_t OnData(char* data, size_t size, size_t n, void* arg) {
  auto* d = static_cast<Download*>(arg);
  const size_t len = size * n;
  if (d->status == 0) curl_easy_getinfo(d->handle, CURLINFO_RESPONSE_CODE, &d->status);
  if (d->status != 200) {
    if (d->error_body.size() < 2048) d->error_body.append(data, std::min<size_t>(len, 2048));
    return len;
  }
  if (d->written + len > d->max_bytes) {
    d->too_big = true;
    return 0;
  }
  for (size_t off = 0; off < len;) {
    const ssize_t w = ::write(d->fd, data + off, len - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      d->write_errno = errno;
      return 0;
    }
    off += static_cast<size_t>(w);
  }
  d->written += len;
  return len;
}

int OnProgress(void* arg, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* d = static_cast<Download*>(arg);
  return d->cancelled != nullptr && *d->cancelled && (*d->cancelled)() ? 1 : 0;
}

// A handle for one request to another node: the token in `headers`, the node's own address
// only (never a proxy nor a redirect: the token must not go anywhere else), errors in `detail`.
CURL* NodeRequest(const std::string& url, curl_slist* headers, char* detail) {
  CURL* h = CurlEasyInit();
  if (h == nullptr) return nullptr;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "sbx-node");
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, detail);
  return h;
}

// GET of `url` (the node's GET /v1/admin/layers/<diff_id>) into `dest` (created; removed on
// failure).
absl::Status FetchBlob(const NodeRecord& peer, const std::string& url, const std::string& token,
                       const std::string& diff_id, const std::string& dest, uint64_t max_bytes,
                       const image::CancelFn& cancelled) {
  Download d;
  d.fd = ::open(dest.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (d.fd < 0) return ErrnoStatus(errno, fmt::format("template fetch: open({})", dest));
  d.max_bytes = max_bytes;
  d.cancelled = &cancelled;
  const std::string auth = "Authorization: Bearer " + token;
  curl_slist* headers = curl_slist_append(nullptr, auth.c_str());
  char detail[CURL_ERROR_SIZE] = {0};
  CURL* h = NodeRequest(url, headers, detail);
  if (h == nullptr) {
    curl_slist_free_all(headers);
    ::close(d.fd);
    ::unlink(dest.c_str());
    return absl::InternalError("template fetch: curl_easy_init failed");
  }
  d.handle = h;
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnData);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &d);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &d);
  const CURLcode rc = curl_easy_perform(h);
  if (d.status == 0) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &d.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  ::close(d.fd);
  absl::Status st = absl::OkStatus();
  if (d.too_big) {
    st = absl::ResourceExhaustedError(
        fmt::format("node {} sends more than {} bytes for layer {}", peer.name, max_bytes, diff_id));
  } else if (d.write_errno != 0) {
    st = ErrnoStatus(d.write_errno, fmt::format("template fetch: write({})", dest));
  } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
    st = absl::CancelledError("template fetch: cancelled");
  } else if (rc != CURLE_OK) {
    st = absl::UnavailableError(fmt::format("node {} ({}): {}", peer.name, url,
                                            detail[0] != '\0' ? detail : curl_easy_strerror(rc)));
  } else if (d.status != 200) {
    st = absl::UnavailableError(fmt::format("node {} answered {}: {:.300}", peer.name, d.status,
                                            d.error_body));
  }
  if (!st.ok()) ::unlink(dest.c_str());
  return st;
}

size_t OnSmallBody(char* data, size_t size, size_t n, void* arg) {
  auto* body = static_cast<std::string*>(arg);
  const size_t len = size * n;
  if (body->size() + len > (64 << 10)) return 0;  // a node's JSON answer is small
  body->append(data, len);
  return len;
}

// POST `url` (no body) with the token; the node's JSON answer, or why there is none.
absl::StatusOr<nlohmann::json> PostToNode(const NodeRecord& peer, const std::string& url,
                                          const std::string& token) {
  const std::string auth = "Authorization: Bearer " + token;
  curl_slist* headers = curl_slist_append(nullptr, auth.c_str());
  std::string body;
  char detail[CURL_ERROR_SIZE] = {0};
  CURL* h = NodeRequest(url, headers, detail);
  if (h == nullptr) {
    curl_slist_free_all(headers);
    return absl::InternalError("curl_easy_init failed");
  }
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);  // a gc of a large store takes a while
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnSmallBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  const CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(fmt::format("node {} ({}): {}", peer.name, url,
                                              detail[0] != '\0' ? detail : curl_easy_strerror(rc)));
  }
  auto j = ParseUntrustedJson(body);  // bounded depth, as any JSON sbxd did not write
  if (status != 200 || !j.ok() || !j->is_object()) {
    return absl::UnavailableError(fmt::format("node {} answered {}: {:.300}", peer.name, status, body));
  }
  return *j;
}

bool Reports(const NodeRecord& n, const std::string& digest) {
  auto t = n.capacity.find("templates");
  if (t == n.capacity.end() || !t->is_array()) return false;
  return std::any_of(t->begin(), t->end(),
                     [&](const auto& v) { return v.is_string() && v.template get<std::string>() == digest; });
}

}  // namespace

absl::Status TemplateService::SyncFromCluster(const std::string& ref, const std::string& ns) {
  if (!opts_.cluster || !opts_.layer_url) return absl::OkStatus();
  auto r = ParseTemplateRef(ref);
  if (!r.ok() || r->name == "base") return absl::OkStatus();  // Resolve answers for those
  std::vector<std::string> names;
  if (!ns.empty()) names.push_back(QualifiedTemplateName(ns, r->name));
  names.push_back(r->name);
  // What the store says the reference names now; the registry in memory follows it.
  std::string tag_name, digest = r->digest;
  // A digest never moves: only a tag costs a read here (on every create of it).
  if (r->digest.empty()) {
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
      tag_name.clear();
      for (const std::string& name : names) {
        auto t = tx.GetTag(name, r->tag);
        if (absl::IsNotFound(t.status())) continue;
        SBX_RETURN_IF_ERROR(t.status());
        tag_name = name;
        digest = t->digest;
        return absl::OkStatus();
      }
      return absl::OkStatus();
    }));
    if (tag_name.empty()) {
      // Removed on another node: so it is here.
      for (const std::string& name : names) templates_.RemoveTag(name, r->tag);
      return absl::OkStatus();
    }
    if (templates_.TagDigest(tag_name, r->tag) == digest) return absl::OkStatus();
  }
  if (templates_.ResolvePinned(ref, digest).ok()) {
    if (!tag_name.empty()) {
      templates_.SetTag(tag_name, r->tag, digest);
      if (opts_.template_changed) opts_.template_changed();
    }
    return absl::OkStatus();
  }
  // A release this node has not loaded: made on another node, or its layers are missing here.
  ImageRecord rec;
  std::vector<NodeRecord> nodes;
  bool named = false;  // the release is one `ref` may name (Resolve's rule for name@digest)
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    named = false;
    auto img = tx.GetImage(digest);
    if (absl::IsNotFound(img.status())) return absl::OkStatus();
    SBX_RETURN_IF_ERROR(img.status());
    rec = *img;
    named = !tag_name.empty() || std::find(names.begin(), names.end(), rec.name) != names.end();
    if (!named) {
      SBX_ASSIGN_OR_RETURN(std::vector<TagRecord> tags, tx.ListTags());
      for (const TagRecord& t : tags) {
        if (t.digest == digest && std::find(names.begin(), names.end(), t.name) != names.end()) {
          named = true;
        }
      }
    }
    if (named) {
      SBX_ASSIGN_OR_RETURN(nodes, tx.ListNodes());
    }
    return absl::OkStatus();
  }));
  // Not a release the caller may name: nothing is fetched, and Resolve says it is not found.
  if (!named) return absl::OkStatus();
  SBX_RETURN_IF_ERROR(FetchLayers(rec, std::move(nodes)));
  SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec spec, SpecOf(rec));
  templates_.AddImage(spec);
  if (!tag_name.empty()) templates_.SetTag(tag_name, r->tag, digest);
  if (opts_.template_changed) opts_.template_changed();
  return absl::OkStatus();
}

absl::StatusOr<int> TemplateService::SyncTagsFromStore() {
  if (!opts_.cluster) return 0;
  // Taken before the read: a tag this node sets or moves after it (an import, a create's
  // SyncFromCluster) is newer than what the read saw, and ReplaceTag leaves it alone.
  const std::map<std::string, std::string> before = templates_.Tags();
  std::vector<TagRecord> stored;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(stored, tx.ListTags());
    return absl::OkStatus();
  }));
  std::map<std::string, std::string> want;  // "name:tag" -> digest, as the store has them
  for (const TagRecord& t : stored) want[t.name + ":" + t.tag] = t.digest;
  int changed = 0;
  auto replace = [&](const std::string& key, const std::string& from, const std::string& to) {
    const size_t colon = key.rfind(':');
    if (templates_.ReplaceTag(key.substr(0, colon), key.substr(colon + 1), from, to)) ++changed;
  };
  for (const auto& [key, digest] : before) {
    if (key.rfind(':') == std::string::npos || key == "base:latest") continue;
    auto it = want.find(key);
    if (it == want.end()) {
      replace(key, digest, "");  // removed on another node
    } else if (it->second != digest) {
      // Moved on another node: followed only to a release held here; otherwise dropped, and the
      // next create of the tag fetches that release (SyncFromCluster) and sets it.
      replace(key, digest, templates_.HoldsRelease(it->second) ? it->second : std::string());
    }
  }
  for (const auto& [key, digest] : want) {
    // A tag made elsewhere on a release this node holds (a second tag on an image it fetched).
    if (before.count(key) == 0 && templates_.HoldsRelease(digest)) replace(key, "", digest);
  }
  if (changed > 0 && opts_.template_changed) opts_.template_changed();
  return changed;
}

absl::Status TemplateService::FetchLayers(const ImageRecord& rec, std::vector<NodeRecord> nodes) {
  // One fetch at a time: creates of one new template on several threads wait for the first,
  // then find its layers here.
  std::lock_guard fetching(fetch_mu_);
  std::vector<std::string> missing;
  if (rec.layers.is_array()) {
    for (const auto& l : rec.layers) {
      const std::string diff_id = l.is_object() ? l.value("diff_id", "") : "";
      if (!layers_->Has(diff_id)) missing.push_back(diff_id);
    }
  }
  if (missing.empty()) return absl::OkStatus();
  // Nodes that report the release first, in a random order (the first creates of a new
  // template spread over its holders), then every other node that may have it: a release just
  // made is in the store before its node's next heartbeat reports it.
  std::erase_if(nodes, [&](const NodeRecord& n) {
    return n.name == opts_.node_name || n.state == "lost" || n.url.empty();
  });
  std::mt19937 rng(std::random_device{}());
  std::shuffle(nodes.begin(), nodes.end(), rng);
  std::stable_partition(nodes.begin(), nodes.end(),
                        [&](const NodeRecord& n) { return Reports(n, rec.digest); });
  if (nodes.empty()) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "template_unavailable",
                    fmt::format("template {} ({}): its layers are not here and no other node is "
                                "live to give them (import or pull it again)",
                                SplitTemplateName(rec.name).name, rec.digest),
                    "template");
  }
  const std::string dir = fmt::format("{}/pulls/peer-{}", opts_.dir, NewId("f"));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(fmt::format("template fetch: mkdir({}): {}", dir, ec.message()));
  auto cleanup = [&] { fs::remove_all(dir, ec); };
  const image::CancelFn cancelled = [this] { return stopping_.load(); };
  uint64_t used = 0;
  for (size_t i = 0; i < missing.size(); ++i) {
    const std::string& diff_id = missing[i];
    std::string errors;
    bool done = false;
    for (const NodeRecord& peer : nodes) {
      const std::string blob = fmt::format("{}/{}", dir, i);
      const auto started = std::chrono::steady_clock::now();
      absl::Status st = FetchBlob(peer, opts_.layer_url(peer.url, diff_id), opts_.peer_token,
                                  diff_id, blob, opts_.limits.max_archive_bytes, cancelled);
      if (st.ok()) {
        auto info = layers_->Put(blob, diff_id, opts_.limits.max_image_bytes - used, nullptr,
                                 cancelled);
        ::unlink(blob.c_str());
        if (info.ok()) {
          used += info->unpacked_bytes;
          spdlog::info("templates: layer {} of {} fetched from node {} in {:.0f} ms", diff_id,
                       rec.digest, peer.name,
                       std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - started).count());
          done = true;
          break;
        }
        st = info.status();
      }
      if (absl::IsCancelled(st)) {
        cleanup();
        return st;
      }
      spdlog::warn("templates: layer {} from node {}: {}", diff_id, peer.name,
                   std::string(st.message()));
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", std::string(st.message()));
    }
    if (!done) {
      cleanup();
      return ApiError(absl::StatusCode::kUnavailable, "template_unavailable",
                      fmt::format("template {} ({}): no node gave layer {}: {}",
                                  SplitTemplateName(rec.name).name, rec.digest, diff_id, errors),
                      "template");
    }
  }
  cleanup();
  return absl::OkStatus();
}

absl::StatusOr<std::string> TemplateService::LayerBlob(const std::string& diff_id) const {
  if (!IsSha256Digest(diff_id)) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    "a layer is named by its diff_id, sha256:<64 hex digits>", "id");
  }
  auto path = layers_->BlobOf(diff_id);
  if (absl::IsNotFound(path.status())) {
    return ApiError(absl::StatusCode::kNotFound, "not_found", std::string(path.status().message()));
  }
  return path;
}

void TemplateService::GcOtherNodes(nlohmann::json& out) {
  if (!opts_.gc_url) return;
  std::vector<NodeRecord> nodes;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(nodes, tx.ListNodes());
    return absl::OkStatus();
  });
  nlohmann::json per_node = nlohmann::json::object();
  if (!st.ok()) {
    out["nodes"] = {{"error", std::string(st.message())}};
    return;
  }
  per_node[opts_.node_name] = {{"layers_removed", out["layers_removed"]},
                               {"bytes_freed", out["bytes_freed"]}};
  // One node at a time: each walks its own disk, and this answer waits for all of them.
  for (const NodeRecord& n : nodes) {
    if (n.name == opts_.node_name || n.state == "lost" || n.url.empty()) continue;
    auto r = PostToNode(n, opts_.gc_url(n.url), opts_.peer_token);
    if (!r.ok()) {
      spdlog::warn("template gc: {}", std::string(r.status().message()));
      per_node[n.name] = {{"error", std::string(r.status().message())}};
      continue;
    }
    const int64_t layers = r->value("layers_removed", int64_t{0});
    const int64_t bytes = r->value("bytes_freed", int64_t{0});
    per_node[n.name] = {{"layers_removed", layers}, {"bytes_freed", bytes}};
    out["layers_removed"] = out["layers_removed"].get<int64_t>() + layers;
    out["bytes_freed"] = out["bytes_freed"].get<int64_t>() + bytes;
  }
  out["nodes"] = std::move(per_node);
}

}  // namespace sbx::service

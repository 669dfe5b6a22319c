// TemplateService (template_service.h): what is in the catalog, delete and garbage collection.
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/files.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/template_ref.h"
#include "service/template_service.h"

namespace sbx::service {

namespace fs = std::filesystem;

using json = nlohmann::json;
using store::ImageRecord;
using store::TagRecord;
using store::Tx;

namespace {

std::vector<std::string> DiffIds(const ImageRecord& rec) {
  std::vector<std::string> out;
  if (!rec.layers.is_array()) return out;
  for (const auto& l : rec.layers) {
    if (l.is_object()) out.push_back(l.value("diff_id", ""));
  }
  return out;
}

int64_t LayerBytes(const json& layer) {
  auto it = layer.find("unpacked_bytes");
  return it != layer.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

struct Catalog {
  std::vector<TagRecord> tags;
  std::map<std::string, ImageRecord> images;  // by digest
};

absl::StatusOr<Catalog> ReadCatalog(store::Store& store) {
  Catalog c;
  SBX_RETURN_IF_ERROR(store.Transact([&](Tx& tx) -> absl::Status {
    c.images.clear();
    SBX_ASSIGN_OR_RETURN(c.tags, tx.ListTags());
    SBX_ASSIGN_OR_RETURN(std::vector<ImageRecord> images, tx.ListImages());
    for (auto& rec : images) c.images[rec.digest] = std::move(rec);
    return absl::OkStatus();
  }));
  return c;
}

absl::Status TemplateNotFound(const std::string& what) {
  return ApiError(absl::StatusCode::kNotFound, "not_found",
                  fmt::format("no template {}", what));
}

}  // namespace

json TemplateService::TemplateView(const std::string& name, const std::vector<TagRecord>& tags,
                                   const std::map<std::string, ImageRecord>& images) const {
  // unique_size: bytes of the layers no release of another name lists (what deleting this
  // name and running gc would free).
  std::map<std::string, std::set<std::string>> names_of_layer;
  for (const auto& [digest, rec] : images) {
    for (const std::string& d : DiffIds(rec)) names_of_layer[d].insert(rec.name);
  }
  json tag_map = json::object();
  std::set<std::string> digests;
  const TagRecord* newest = nullptr;
  for (const TagRecord& t : tags) {
    if (t.name != name) continue;
    tag_map[t.tag] = t.digest;
    digests.insert(t.digest);
    if (t.tag == "latest" || newest == nullptr ||
        (newest->tag != "latest" && t.updated_at > newest->updated_at)) {
      newest = &t;
    }
  }
  json releases = json::array();
  for (const auto& [digest, rec] : images) {
    if (rec.name != name && !digests.count(digest)) continue;
    int64_t unique = 0;
    for (const auto& l : rec.layers) {
      const std::string d = l.is_object() ? l.value("diff_id", "") : "";
      if (names_of_layer[d].size() <= 1) unique += LayerBytes(l);
    }
    json tags_of = json::array();
    for (const TagRecord& t : tags) {
      if (t.name == name && t.digest == digest) tags_of.push_back(t.tag);
    }
    releases.push_back({{"digest", digest},     {"tags", tags_of},
                        {"size", rec.size},     {"unique_size", unique},
                        {"source", rec.source}, {"config", rec.config},
                        {"layers", rec.layers}, {"created_at", rec.created_at}});
  }
  const SplitName shown = SplitTemplateName(name);
  json out = {{"name", shown.name}, {"tags", tag_map}, {"releases", releases}};
  // The release of `latest` (or the tag moved last) in the summary fields.
  const ImageRecord* head = nullptr;
  if (newest != nullptr) {
    if (auto it = images.find(newest->digest); it != images.end()) head = &it->second;
  }
  out["digest"] = head ? json(head->digest) : json(nullptr);
  out["size"] = head ? head->size : 0;
  out["source"] = head ? head->source : json(nullptr);
  out["config"] = head ? head->config : json(nullptr);
  out["created_at"] = head ? json(head->created_at) : json(nullptr);
  out["builtin"] = false;
  out["shared"] = shown.ns.empty();
  return out;
}

namespace {

// What namespace `ns` sees of the catalogue: its own tags and the shared ones, and the releases
// made under those names or named by those tags. Another tenant's never shows, not even in the
// sizes (unique_size is computed among what is seen).
Catalog Visible(const Catalog& all, const std::string& ns) {
  Catalog c;
  std::set<std::string> digests;
  auto sees = [&](const std::string& name) {
    const std::string owner = SplitTemplateName(name).ns;
    return owner.empty() || owner == ns;
  };
  for (const TagRecord& t : all.tags) {
    if (!sees(t.name)) continue;
    c.tags.push_back(t);
    digests.insert(t.digest);
  }
  for (const auto& [digest, rec] : all.images) {
    if (sees(rec.name) || digests.count(digest)) c.images[digest] = rec;
  }
  return c;
}

}  // namespace

absl::StatusOr<json> TemplateService::List(const Caller& caller) {
  SBX_ASSIGN_OR_RETURN(Catalog all, ReadCatalog(store_));
  const std::string ns = NamespaceOf(caller);
  const Catalog c = Visible(all, ns);
  json list = json::array();
  list.push_back({{"name", "base"},
                  {"tags", {{"latest", templates_.base_digest()}}},
                  {"digest", templates_.base_digest()},
                  {"builtin", true},
                  {"shared", true},
                  {"source", {{"kind", "builtin"}}}});
  std::set<std::string> names;
  for (const TagRecord& t : c.tags) names.insert(t.name);
  for (const auto& [digest, rec] : c.images) {
    const std::string owner = SplitTemplateName(rec.name).ns;
    if (owner.empty() || owner == ns) names.insert(rec.name);
  }
  // The caller's own first: a name of its own hides the shared one of that name in Get and in
  // creates.
  for (const std::string& n : names) {
    if (!SplitTemplateName(n).ns.empty()) list.push_back(TemplateView(n, c.tags, c.images));
  }
  for (const std::string& n : names) {
    if (SplitTemplateName(n).ns.empty()) list.push_back(TemplateView(n, c.tags, c.images));
  }
  json out = {{"templates", list}};
  // The layer store is the deployment's: its size is the operator's to see.
  if (ns.empty()) out["store_bytes"] = layers_->UsedBytes();
  return out;
}

absl::StatusOr<json> TemplateService::Get(const Caller& caller, const std::string& name) {
  SBX_RETURN_IF_ERROR(CheckTemplateName(name));
  SBX_ASSIGN_OR_RETURN(json all, List(caller));
  for (const json& t : all["templates"]) {
    if (t["name"] == name) return t;  // the caller's own comes first
  }
  return TemplateNotFound(name);
}

absl::StatusOr<TemplateService::Removed> TemplateService::RemoveTags(
    const std::function<bool(const TagRecord&)>& goes, const std::string& what,
    bool refuse_in_use) {
  Removed out;
  std::map<std::string, int> pooled =
      opts_.pooled_digests ? opts_.pooled_digests() : std::map<std::string, int>();
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    out = Removed{};
    SBX_ASSIGN_OR_RETURN(std::vector<TagRecord> tags, tx.ListTags());
    std::map<std::string, int> tags_left;  // digest -> tags that stay
    for (const TagRecord& t : tags) {
      if (goes(t)) {
        out.tags.push_back(t);
      } else {
        ++tags_left[t.digest];
      }
    }
    if (out.tags.empty()) return absl::OkStatus();
    std::set<std::string> orphans;
    for (const TagRecord& t : out.tags) {
      if (tags_left[t.digest] == 0) orphans.insert(t.digest);
    }
    for (const std::string& d : orphans) {
      const int held = pooled.count(d) ? pooled[d] : 0;
      SBX_ASSIGN_OR_RETURN(int64_t live, tx.CountLiveSandboxesWithDigest(d));
      if (held == 0 && live == 0) {
        SBX_RETURN_IF_ERROR(tx.DeleteImage(d));
        out.releases.push_back(d);
        continue;
      }
      if (!refuse_in_use) continue;  // gc takes it once nothing runs it
      const std::string why =
          held > 0 ? fmt::format("is held by {} warm-pool sandbox(es): set its warm_pool size to "
                                 "0 first, or move another tag to this release",
                                 held)
                   : fmt::format("is used by {} sandbox(es): delete them first, or move another "
                                 "tag to this release to keep it",
                                 live);
      return WithDetail(ApiError(absl::StatusCode::kFailedPrecondition, "template_in_use",
                                 fmt::format("template {} ({}) {}", what, d, why)),
                        "digest", d);
    }
    for (const TagRecord& t : out.tags) SBX_RETURN_IF_ERROR(tx.DeleteTag(t.name, t.tag));
    return absl::OkStatus();
  }));
  for (const TagRecord& t : out.tags) templates_.RemoveTag(t.name, t.tag);
  for (const std::string& d : out.releases) templates_.RemoveImage(d);
  if (!out.tags.empty() && opts_.template_changed) opts_.template_changed();
  return out;
}

absl::StatusOr<json> TemplateService::Delete(const Caller& caller, const std::string& ref_text) {
  // "name" or "name:tag"; ParseTemplateRef would read a bare name as name:latest.
  std::string name = ref_text, tag;
  if (size_t colon = ref_text.rfind(':');
      colon != std::string::npos && ref_text.find('/', colon) == std::string::npos) {
    name = ref_text.substr(0, colon);
    tag = ref_text.substr(colon + 1);
    SBX_RETURN_IF_ERROR(CheckTemplateTag(tag, "template"));
  }
  SBX_RETURN_IF_ERROR(CheckTemplateName(name, "template"));
  if (name == "base") {
    return ApiError(absl::StatusCode::kFailedPrecondition, "template_builtin",
                    "`base` is the built-in template and cannot be deleted");
  }
  const std::string ns = NamespaceOf(caller);
  const std::string stored = QualifiedTemplateName(ns, name);
  const std::string what = tag.empty() ? name : name + ":" + tag;
  SBX_ASSIGN_OR_RETURN(
      Removed removed,
      RemoveTags([&](const TagRecord& t) { return t.name == stored && (tag.empty() || t.tag == tag); },
                 what, /*refuse_in_use=*/true));
  if (removed.tags.empty()) {
    if (!ns.empty() && templates_.Resolve(what, "").ok()) {
      // Seen, so not a 404: it is the deployment's, not this tenant's.
      return WithDetail(ApiError(absl::StatusCode::kPermissionDenied, "missing_scope",
                                 fmt::format("template {} is shared by the operator: only the "
                                             "operator tenant changes it",
                                             what)),
                        "scope", "admin");
    }
    return TemplateNotFound(what);
  }
  json tags_out = json::array();
  for (const TagRecord& t : removed.tags) {
    tags_out.push_back({{"name", name}, {"tag", t.tag}, {"digest", t.digest}});
  }
  spdlog::info("template {} deleted: {} tags, {} releases (their layers stay until gc)", stored,
               removed.tags.size(), removed.releases.size());
  return json{{"deleted_tags", tags_out}, {"deleted_releases", removed.releases}};
}

absl::StatusOr<int> TemplateService::DeleteNamespace(const std::string& tenant_id) {
  if (tenant_id.empty() || tenant_id == kOperatorTenant) return 0;
  SBX_ASSIGN_OR_RETURN(
      Removed removed,
      RemoveTags([&](const TagRecord& t) { return SplitTemplateName(t.name).ns == tenant_id; },
                 "of tenant " + tenant_id, /*refuse_in_use=*/false));
  if (!removed.tags.empty()) {
    spdlog::info("templates of tenant {} deleted: {} tags, {} releases", tenant_id,
                 removed.tags.size(), removed.releases.size());
  }
  return static_cast<int>(removed.tags.size());
}

absl::StatusOr<json> TemplateService::Tag(const Caller& caller, const std::string& target,
                                           const std::string& from) {
  SBX_ASSIGN_OR_RETURN(TemplateRef to, ParseTemplateRef(target, "template"));
  if (!to.digest.empty()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_template_ref",
                    "a tag is name:tag, not a digest", "template");
  }
  if (to.name == "base") {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_template_ref",
                    "`base` is the built-in template: choose another name", "template");
  }
  SBX_ASSIGN_OR_RETURN(TemplateRef src, ParseTemplateRef(from, "from"));
  const std::string ns = NamespaceOf(caller);
  // What the caller sees, as a create would: its own name first, then a shared one. A release
  // of another tenant is not found, even by its digest.
  auto resolved = templates_.Resolve(from, ns);
  if (!resolved.ok()) return TemplateNotFound(src.String());
  const std::string digest = resolved->digest;
  const std::string stored = QualifiedTemplateName(ns, to.name);
  std::string previous;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    previous.clear();
    auto img = tx.GetImage(digest);
    if (absl::IsNotFound(img.status())) return TemplateNotFound(src.String());  // base, or gone
    SBX_RETURN_IF_ERROR(img.status());
    SBX_ASSIGN_OR_RETURN(std::vector<TagRecord> tags, tx.ListTags());
    std::map<std::string, int64_t> sizes;
    SBX_ASSIGN_OR_RETURN(std::vector<ImageRecord> images, tx.ListImages());
    for (const ImageRecord& i : images) sizes[i.digest] = i.size;
    auto size_of = [&](const std::string& d) { return sizes.count(d) ? sizes[d] : 0; };
    const TagRecord put{stored, to.tag, digest, NowRfc3339()};
    SBX_RETURN_IF_ERROR(CheckTemplateQuota(tx, caller.tenant_id,
                                           UsageOfNamespace(ns, tags, std::nullopt, size_of),
                                           UsageOfNamespace(ns, tags, put, size_of)));
    if (auto cur = tx.GetTag(stored, to.tag); cur.ok()) previous = cur->digest;
    return tx.PutTag(put);
  }));
  templates_.SetTag(stored, to.tag, digest);
  if (opts_.template_changed && previous != digest) opts_.template_changed();
  spdlog::info("template {}:{} -> {} (was {})", stored, to.tag, digest,
               previous.empty() ? "untagged" : previous);
  return json{{"name", to.name},
              {"tag", to.tag},
              {"digest", digest},
              {"previous", previous.empty() ? json(nullptr) : json(previous)}};
}

absl::StatusOr<json> TemplateService::Gc(const Caller& caller, bool this_node_only) {
  // The layer store is the deployment's (shared by every tenant's releases).
  if (!NamespaceOf(caller).empty()) {
    return WithDetail(ApiError(absl::StatusCode::kPermissionDenied, "missing_scope",
                               "template gc collects the deployment's layer store: only the "
                               "operator tenant runs it (a tenant's deletes free its share)"),
                      "scope", "admin");
  }
  {
    // An import or pull in flight has layers in the store that no release lists yet.
    std::lock_guard lock(mu_);
    if (!cancels_.empty() || gc_running_) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "template_operation_in_progress",
                      fmt::format("{} template import(s) or pull(s) are running: collect when "
                                  "they have finished",
                                  cancels_.size()));
    }
    gc_running_ = true;
  }
  struct Done {
    TemplateService* self;
    ~Done() {
      std::lock_guard lock(self->mu_);
      self->gc_running_ = false;
    }
  } done{this};
  std::vector<std::string> releases_removed;
  std::set<std::string> kept_layers;
  // Warm-pool sandboxes run on their release's layers as much as created ones do.
  const std::map<std::string, int> pooled =
      opts_.pooled_digests ? opts_.pooled_digests() : std::map<std::string, int>();
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    releases_removed.clear();
    kept_layers.clear();
    SBX_ASSIGN_OR_RETURN(std::vector<TagRecord> tags, tx.ListTags());
    SBX_ASSIGN_OR_RETURN(std::vector<ImageRecord> images, tx.ListImages());
    std::set<std::string> tagged;
    for (const TagRecord& t : tags) tagged.insert(t.digest);
    for (const ImageRecord& rec : images) {
      // Another node's gc decided about the releases: this one only drops what none lists.
      bool keep = this_node_only || tagged.count(rec.digest) > 0 || pooled.count(rec.digest) > 0;
      if (!keep) {
        SBX_ASSIGN_OR_RETURN(int64_t live, tx.CountLiveSandboxesWithDigest(rec.digest));
        keep = live > 0;
      }
      if (keep) {
        for (const std::string& d : DiffIds(rec)) kept_layers.insert(d);
        continue;
      }
      SBX_RETURN_IF_ERROR(tx.DeleteImage(rec.digest));
      releases_removed.push_back(rec.digest);
    }
    return absl::OkStatus();
  }));
  for (const std::string& d : releases_removed) templates_.RemoveImage(d);
  int layers_removed = 0;
  uint64_t freed = 0;
  for (const image::LayerInfo& l : layers_->List()) {
    if (kept_layers.count(l.diff_id)) continue;
    if (absl::Status st = layers_->Remove(l.diff_id); !st.ok()) {
      spdlog::warn("template gc: layer {}: {}", l.diff_id, std::string(st.message()));
      continue;
    }
    ++layers_removed;
    freed += l.unpacked_bytes;
  }
  // Build-cache entries of layers gone now would only ever miss.
  int cache_removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(opts_.dir + "/build-cache", ec)) {
    auto j = ParseUntrustedJson(ReadFileOrEmpty(e.path().string()));
    const std::string diff_id = j.ok() && j->is_object() ? j->value("diff_id", "") : "";
    // A registry parent's entry lists its layers: it goes with the first of them.
    bool parent_gone = false;
    if (j.ok() && j->is_object() && j->contains("layers") && (*j)["layers"].is_array()) {
      for (const auto& l : (*j)["layers"]) {
        if (!l.is_object() || !layers_->Has(l.value("diff_id", ""))) parent_gone = true;
      }
    }
    if (!j.ok() || parent_gone || (!diff_id.empty() && !layers_->Has(diff_id))) {
      if (fs::remove(e.path(), ec)) ++cache_removed;
    }
  }
  spdlog::info("template gc: {} releases and {} layers removed, {} MiB freed, {} build-cache "
               "entries dropped",
               releases_removed.size(), layers_removed, freed >> 20, cache_removed);
  json out{{"releases_removed", releases_removed},
           {"layers_removed", layers_removed},
           {"bytes_freed", freed},
           {"cache_entries_removed", cache_removed}};
  // Each node of a cluster holds its own layers: the others collect theirs too.
  if (opts_.cluster && !this_node_only) GcOtherNodes(out);
  return out;
}

}  // namespace sbx::service

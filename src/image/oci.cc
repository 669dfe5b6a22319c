#include "image/oci.h"

#include <fmt/format.h>

#include "common/json_util.h"
#include "common/status_util.h"
#include "image/layer_unpack.h"

namespace sbx::image::oci {
namespace {

using json = nlohmann::json;

absl::Status Bad(std::string_view what, std::string_view why) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", what, why));
}

absl::StatusOr<json> ParseObject(std::string_view text, std::string_view what) {
  if (text.size() > kMaxDocumentBytes) {
    return Bad(what, fmt::format("{} bytes, more than {}", text.size(), kMaxDocumentBytes));
  }
  auto j = ParseUntrustedJson(text);
  if (!j.ok()) return Bad(what, fmt::format("not JSON: {}", std::string(j.status().message())));
  if (!j->is_object()) return Bad(what, "not a JSON object");
  return std::move(*j);
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

absl::StatusOr<std::vector<std::string>> StrList(const json& j, const char* key,
                                                 std::string_view what) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return Bad(what, fmt::format("{} is not an array", key));
  for (const auto& v : *it) {
    if (!v.is_string()) return Bad(what, fmt::format("{} holds a non-string", key));
    out.push_back(v.get<std::string>());
  }
  return out;
}

absl::StatusOr<Descriptor> ParseDescriptor(const json& j, std::string_view what) {
  if (!j.is_object()) return Bad(what, "a descriptor is not an object");
  Descriptor d;
  d.media_type = Str(j, "mediaType");
  d.digest = Str(j, "digest");
  if (!IsDigest(d.digest)) {
    return Bad(what, fmt::format("descriptor digest \"{:.80}\" is not sha256:<64 hex>", d.digest));
  }
  auto size = j.find("size");
  if (size == j.end() || !size->is_number_integer() || size->get<int64_t>() < 0) {
    return Bad(what, fmt::format("descriptor {} has no valid size", d.digest));
  }
  d.size = size->get<uint64_t>();
  if (auto p = j.find("platform"); p != j.end() && p->is_object()) {
    d.os = Str(*p, "os");
    d.architecture = Str(*p, "architecture");
    d.variant = Str(*p, "variant");
  }
  if (auto a = j.find("annotations"); a != j.end() && a->is_object()) {
    d.ref_name = Str(*a, "org.opencontainers.image.ref.name");
  }
  return d;
}

}  // namespace

bool IsLayerType(std::string_view t) {
  return t == "application/vnd.oci.image.layer.v1.tar" ||
         t == "application/vnd.oci.image.layer.v1.tar+gzip" ||
         t == "application/vnd.oci.image.layer.v1.tar+zstd" ||
         t == "application/vnd.docker.image.rootfs.diff.tar.gzip" ||
         t == "application/vnd.docker.image.rootfs.diff.tar" ||
         // Non-distributable layers are ordinary layers once they are here.
         t == "application/vnd.oci.image.layer.nondistributable.v1.tar" ||
         t == "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip" ||
         t == "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" ||
         t == "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";
}

absl::StatusOr<Index> ParseIndex(std::string_view text) {
  SBX_ASSIGN_OR_RETURN(json j, ParseObject(text, "image index"));
  auto m = j.find("manifests");
  if (m == j.end() || !m->is_array()) return Bad("image index", "no manifests array");
  if (m->size() > 1024) return Bad("image index", "more than 1024 manifests");
  Index out;
  for (const auto& e : *m) {
    SBX_ASSIGN_OR_RETURN(Descriptor d, ParseDescriptor(e, "image index"));
    out.manifests.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<Manifest> ParseManifest(std::string_view text) {
  SBX_ASSIGN_OR_RETURN(json j, ParseObject(text, "image manifest"));
  Manifest out;
  out.media_type = Str(j, "mediaType");
  if (!out.media_type.empty() && out.media_type != kOciManifest &&
      out.media_type != kDockerManifest) {
    return Bad("image manifest", fmt::format("media type \"{:.100}\" is not an image manifest",
                                             out.media_type));
  }
  auto v = j.find("schemaVersion");
  if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != 2) {
    return Bad("image manifest", "schemaVersion is not 2 (Docker schema 1 is not supported)");
  }
  auto c = j.find("config");
  if (c == j.end()) return Bad("image manifest", "no config");
  SBX_ASSIGN_OR_RETURN(out.config, ParseDescriptor(*c, "image manifest config"));
  auto l = j.find("layers");
  if (l == j.end() || !l->is_array()) return Bad("image manifest", "no layers array");
  if (l->size() > kMaxLayers) {
    return Bad("image manifest", fmt::format("{} layers, more than {}", l->size(), kMaxLayers));
  }
  for (const auto& e : *l) {
    SBX_ASSIGN_OR_RETURN(Descriptor d, ParseDescriptor(e, "image manifest layer"));
    if (!IsLayerType(d.media_type)) {
      return Bad("image manifest", fmt::format("layer {} has media type \"{:.100}\", which is "
                                               "not a tar layer (tar, gzip or zstd)",
                                               d.digest, d.media_type));
    }
    out.layers.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<Config> ParseConfig(std::string_view text) {
  SBX_ASSIGN_OR_RETURN(json j, ParseObject(text, "image config"));
  Config out;
  ImageConfig& c = out.config;
  c.os = Str(j, "os");
  c.architecture = Str(j, "architecture");
  if (!c.os.empty() && c.os != "linux") {
    return Bad("image config", fmt::format("os is \"{:.40}\": sbx runs linux images", c.os));
  }
  if (auto cfg = j.find("config"); cfg != j.end() && cfg->is_object()) {
    SBX_ASSIGN_OR_RETURN(c.env, StrList(*cfg, "Env", "image config"));
    SBX_ASSIGN_OR_RETURN(c.entrypoint, StrList(*cfg, "Entrypoint", "image config"));
    SBX_ASSIGN_OR_RETURN(c.cmd, StrList(*cfg, "Cmd", "image config"));
    c.working_dir = Str(*cfg, "WorkingDir");
    c.user = Str(*cfg, "User");
    if (auto labels = cfg->find("Labels"); labels != cfg->end() && labels->is_object()) {
      for (const auto& [k, v] : labels->items()) {
        if (v.is_string()) c.labels[k] = v.get<std::string>();
      }
    }
    for (const std::string& kv : c.env) {
      if (kv.find('=') == std::string::npos || kv.front() == '=') {
        return Bad("image config", fmt::format("Env entry \"{:.80}\" is not K=V", kv));
      }
    }
  }
  auto rootfs = j.find("rootfs");
  if (rootfs == j.end() || !rootfs->is_object()) return Bad("image config", "no rootfs");
  SBX_ASSIGN_OR_RETURN(out.diff_ids, StrList(*rootfs, "diff_ids", "image config rootfs"));
  if (out.diff_ids.size() > kMaxLayers) return Bad("image config", "too many diff_ids");
  for (const std::string& d : out.diff_ids) {
    if (!IsDigest(d)) {
      return Bad("image config", fmt::format("diff_id \"{:.80}\" is not sha256:<64 hex>", d));
    }
  }
  return out;
}

absl::StatusOr<std::vector<DockerImage>> ParseDockerManifest(std::string_view text) {
  if (text.size() > kMaxDocumentBytes) return Bad("manifest.json", "too large");
  auto j = ParseUntrustedJson(text);
  if (!j.ok() || !j->is_array()) return Bad("manifest.json", "not a JSON array");
  if (j->size() > 1024) return Bad("manifest.json", "more than 1024 images");
  std::vector<DockerImage> out;
  for (const auto& e : *j) {
    if (!e.is_object()) return Bad("manifest.json", "an entry is not an object");
    DockerImage img;
    img.config = Str(e, "Config");
    if (img.config.empty()) return Bad("manifest.json", "an entry has no Config");
    SBX_ASSIGN_OR_RETURN(img.repo_tags, StrList(e, "RepoTags", "manifest.json"));
    SBX_ASSIGN_OR_RETURN(img.layers, StrList(e, "Layers", "manifest.json"));
    if (img.layers.size() > kMaxLayers) return Bad("manifest.json", "too many layers");
    out.push_back(std::move(img));
  }
  if (out.empty()) return Bad("manifest.json", "no image");
  return out;
}

absl::StatusOr<Descriptor> Choose(const Index& index, const std::string& ref_name) {
  if (index.manifests.empty()) return Bad("image index", "no manifests");
  if (!ref_name.empty()) {
    for (const Descriptor& d : index.manifests) {
      if (d.ref_name == ref_name) return d;
    }
    return absl::NotFoundError(fmt::format("image index: no image named \"{:.100}\"", ref_name));
  }
  if (index.manifests.size() == 1) return index.manifests[0];
  for (const Descriptor& d : index.manifests) {
    if (d.os == "linux" && d.architecture == "amd64") return d;
  }
  std::string platforms;
  for (const Descriptor& d : index.manifests) {
    platforms += fmt::format("{}{}/{}", platforms.empty() ? "" : ", ", d.os, d.architecture);
  }
  return absl::NotFoundError(
      fmt::format("image index: no linux/amd64 image (it has {:.300})", platforms));
}

nlohmann::json ConfigJson(const ImageConfig& c) {
  return {{"env", c.env},
          {"entrypoint", c.entrypoint},
          {"cmd", c.cmd},
          {"working_dir", c.working_dir},
          {"user", c.user},
          {"labels", c.labels},
          {"os", c.os},
          {"architecture", c.architecture}};
}

}  // namespace sbx::image::oci

// Fuzz target for the OCI / Docker document parsers (src/image/oci.h), which read what image
// archives and registries send. Properties: never crashes or throws; what parses is within the
// documented bounds (digests well-formed, at most kMaxLayers layers, diff_ids as many as the
// parser says) and Choose never returns an entry the index does not hold.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "image/layer_unpack.h"
#include "image/oci.h"

namespace {
const std::string kDigest = "sha256:" + std::string(64, 'a');
const std::string kIndex = R"({"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":")" +
                           kDigest + R"(","size":7,"platform":{"os":"linux","architecture":"amd64"},"annotations":{"org.opencontainers.image.ref.name":"t"}}]})";
const std::string kManifest = R"({"schemaVersion":2,"config":{"mediaType":"x","digest":")" + kDigest +
                              R"(","size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":")" +
                              kDigest + R"(","size":3}]})";
const std::string kConfig = R"({"os":"linux","config":{"Env":["A=1"],"Cmd":["sh"],"WorkingDir":"/w","User":"app","Labels":{"a":"b"}},"rootfs":{"diff_ids":[")" +
                            kDigest + R"("]}})";
const char kDocker[] = R"([{"Config":"c.json","RepoTags":["a:b"],"Layers":["l/layer.tar"]}])";
}  // namespace

extern const char* const kFuzzSeeds[] = {kIndex.c_str(), kManifest.c_str(), kConfig.c_str(), kDocker, "", "{}"};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace oci = sbx::image::oci;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto index = oci::ParseIndex(text); index.ok()) {
    for (const auto& d : index->manifests) {
      if (!sbx::image::IsDigest(d.digest)) std::abort();
    }
    if (auto c = oci::Choose(*index, ""); c.ok()) {
      bool found = false;
      for (const auto& d : index->manifests) found |= d.digest == c->digest;
      if (!found) std::abort();
    }
    (void)oci::Choose(*index, "t");
  }
  if (auto m = oci::ParseManifest(text); m.ok()) {
    if (m->layers.size() > oci::kMaxLayers || !sbx::image::IsDigest(m->config.digest)) std::abort();
    for (const auto& l : m->layers) {
      if (!oci::IsLayerType(l.media_type) || !sbx::image::IsDigest(l.digest)) std::abort();
    }
  }
  if (auto c = oci::ParseConfig(text); c.ok()) {
    if (c->diff_ids.size() > oci::kMaxLayers) std::abort();
    for (const auto& d : c->diff_ids) {
      if (!sbx::image::IsDigest(d)) std::abort();
    }
    (void)oci::ConfigJson(c->config).dump();
  }
  (void)oci::ParseDockerManifest(text);
  return 0;
}

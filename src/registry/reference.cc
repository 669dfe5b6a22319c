// Image references as Docker reads them (distribution/reference's rules).
#include <fmt/format.h>

#include "image/layer_unpack.h"
#include "registry/registry.h"

namespace sbx::registry {
namespace {

bool PathChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
         c == '/';
}
bool TagChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

std::string Reference::String() const {
  std::string out = registry + "/" + repository;
  if (!digest.empty()) return out + "@" + digest;
  return out + ":" + (tag.empty() ? "latest" : tag);
}

absl::StatusOr<Reference> ParseReference(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(fmt::format("image reference \"{:.200}\": {}", text, why));
  };
  if (text.empty() || text.size() > 512) return bad("must be 1 to 512 bytes");
  Reference r;
  std::string rest = text;
  if (size_t at = rest.find('@'); at != std::string::npos) {
    r.digest = rest.substr(at + 1);
    rest = rest.substr(0, at);
    if (!image::IsDigest(r.digest)) return bad("the digest is not sha256:<64 lowercase hex>");
  }
  // The registry: a first component with '.' or ':', or localhost.
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string first = rest.substr(0, slash);
    if (first.find('.') != std::string::npos || first.find(':') != std::string::npos ||
        first == "localhost") {
      r.registry = first;
      rest = rest.substr(slash + 1);
    }
  }
  if (r.registry.empty()) r.registry = "registry-1.docker.io";
  if (r.registry == "docker.io" || r.registry == "index.docker.io") {
    r.registry = "registry-1.docker.io";
  }
  for (char c : r.registry) {
    if (!(TagChar(c) || c == ':' || c == '[' || c == ']')) return bad("bad registry host");
  }
  // A tag after the last '/'.
  const size_t last_slash = rest.rfind('/');
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos && (last_slash == std::string::npos || colon > last_slash)) {
    r.tag = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    constexpr const char* kTagRule =
        "the tag must be 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'";
    if (r.tag.empty() || r.tag.size() > 128 || r.tag[0] == '.' || r.tag[0] == '-') {
      return bad(kTagRule);
    }
    for (char c : r.tag) {
      if (!TagChar(c)) return bad(kTagRule);
    }
  }
  if (rest.empty()) return bad("no repository");
  for (char c : rest) {
    if (!PathChar(c)) return bad("a repository has lowercase letters, digits, '.', '_', '-', '/'");
  }
  // Each path component starts and ends with a letter or digit ("a/.b", "a-/b" are not names).
  for (size_t start = 0; start <= rest.size();) {
    size_t end = rest.find('/', start);
    if (end == std::string::npos) end = rest.size();
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    if (end == start || !alnum(rest[start]) || !alnum(rest[end - 1])) {
      return bad("each repository path component starts and ends with a letter or digit");
    }
    start = end + 1;
  }
  if (r.registry == "registry-1.docker.io" && rest.find('/') == std::string::npos) {
    rest = "library/" + rest;
  }
  r.repository = rest;
  // A digest pins the image: a tag beside it ("app:1@sha256:…") says nothing more.
  if (!r.digest.empty()) r.tag.clear();
  if (r.tag.empty() && r.digest.empty()) r.tag = "latest";
  return r;
}

}  // namespace sbx::registry

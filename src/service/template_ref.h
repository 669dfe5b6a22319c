// Template references as clients write them (docs/templates.md): `name`, `name:tag` (tags
// move), `name@sha256:<hex>` (fixed). `base` is the built-in template.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx::service {

struct TemplateRef {
  std::string name;
  std::string tag;     // "latest" when neither tag nor digest was given; "" with a digest
  std::string digest;  // "sha256:<hex>" or ""
  std::string String() const;  // name:tag or name@digest
};

// InvalidArgument (API code invalid_template_ref, field `field`) naming what is wrong.
absl::StatusOr<TemplateRef> ParseTemplateRef(std::string_view text, const char* field = "template");
// Name: lowercase letters, digits, '.', '_' and '-', 1-128 bytes, starting and ending with a
// letter or digit (one path segment). Tag: letters, digits, '_', '.', '-', 1-128 bytes, not
// starting with '.' or '-' (Docker's rule).
absl::Status CheckTemplateName(std::string_view name, const char* field = "name");
absl::Status CheckTemplateTag(std::string_view tag, const char* field = "tag");
bool IsSha256Digest(std::string_view digest);

// Template namespaces (docs/tenancy.md, "Templates"). The operator tenant's templates are the
// deployment's shared catalogue, namespace ""; every other tenant's own are in the namespace
// named by its id. The store and the registry keep a tenant's names qualified as
// "<tenant>/<name>": a name never holds '/', so a qualified name never meets a shared one, and
// the API never shows the qualifier.
std::string QualifiedTemplateName(std::string_view ns, std::string_view name);
struct SplitName {
  std::string ns;    // "" for a shared template
  std::string name;  // as its owner wrote it
};
SplitName SplitTemplateName(std::string_view stored);

}  // namespace sbx::service

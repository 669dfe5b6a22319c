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

}  // namespace sbx::service

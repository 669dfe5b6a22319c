// Opaque, prefixed identifiers ("sbx_", "op_", "ses_", "tpl_", "ten_") and secrets.
#pragma once

#include <string>
#include <string_view>

namespace sbx {

// NewId("sbx") -> "sbx_" + 20 lowercase base32 characters (100 random bits). Lowercase
// alphanumerics only, so an id is safe in paths, cgroup names and nft table names.
std::string NewId(std::string_view prefix);

// True when `id` has the given prefix and the shape NewId produces. Used to reject
// hostile ids before they reach a path or a store query.
bool IsValidId(std::string_view id, std::string_view prefix);

// A random secret of `bytes` bytes, URL-safe base64 without padding.
std::string NewSecret(size_t bytes = 32);

}  // namespace sbx

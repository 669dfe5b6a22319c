// [templates] of sbxd's configuration into the registry client's settings (docs/config.md).
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "registry/registry.h"

namespace sbx::daemon {

// Per registry host: the credentials of templates.registry_auth_file (Docker's config.json
// form), the insecure switch of templates.registry_insecure, templates.registry_ca_file. A file
// that does not read or parse stops sbxd, naming the key and what is wrong (never the secret).
absl::StatusOr<std::map<std::string, registry::RegistrySettings>> RegistryCredentials(
    const Config& cfg);

// The same from the file's text (tests).
absl::StatusOr<std::map<std::string, registry::RegistrySettings>> ParseRegistryAuth(
    const std::string& text, const std::string& where);

}  // namespace sbx::daemon

// The topmost lower of every image template (docs/templates.md): the mount points the runtimes
// mount over (/proc, /dev, /sys, /tmp, /etc for resolv.conf and hosts, /run), which an image
// need not have (a `FROM scratch` image has none of them). Directories only: an image's own
// /bin, /lib, /usr come from its layers, and a directory here merges with the image's.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace sbx::runtime {

// Makes `dir` and its mount points (root-owned, 0755; tmp 01777), idempotently.
absl::Status EnsureImageSkeleton(const std::string& dir);

}  // namespace sbx::runtime

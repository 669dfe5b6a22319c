// For the archive tests: a whole archive of `entries` (each with its data) made by our writer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "archive/tar.h"

namespace sbx::archive {

inline std::string BuildTar(const std::vector<std::pair<TarEntry, std::string>>& entries) {
  std::string out;
  for (const auto& [e, data] : entries) {
    EXPECT_TRUE(AppendTarHeader(out, e).ok()) << e.name;
    out += data;
    out.append(TarPadding(data.size()));
  }
  out.append(TarTrailer());
  return out;
}

}  // namespace sbx::archive

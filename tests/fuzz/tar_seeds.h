// Tar seeds for the mutation driver (mutation_main.cc), shared by the fuzz targets that read
// archives: the driver takes seeds as C strings, so NUL bytes travel as '~' and each target
// turns them back.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "archive/tar.h"

namespace sbx::fuzz {

inline std::string TarSeed(
    std::initializer_list<std::pair<sbx::archive::TarEntry, std::string>> entries) {
  std::string out;
  for (const auto& [e, data] : entries) {
    (void)sbx::archive::AppendTarHeader(out, e);
    out += data;
    out.append(sbx::archive::TarPadding(data.size()));
  }
  out.append(sbx::archive::TarTrailer());
  for (char& c : out) {
    if (c == '\0') c = '~';
  }
  return out;
}

}  // namespace sbx::fuzz

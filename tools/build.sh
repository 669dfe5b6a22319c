#!/usr/bin/env bash
# Configures and builds sbx with Ninja.
# Usage: bash tools/build.sh [BUILD_DIR] [extra cmake args...]
#   BUILD_DIR defaults to build/ (relative to the repository root); the build type defaults
#   to RelWithDebInfo; ccache is picked up by CMakeLists.txt when installed.
# Example: bash tools/build.sh build-asan -DSBX_SANITIZE=ON
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${1:-build}
shift || true
[[ "$BUILD_DIR" = /* ]] || BUILD_DIR="$ROOT/$BUILD_DIR"

for tool in cmake ninja; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build: ERROR: $tool not found; run: bash tools/install-deps.sh" >&2; exit 1; }
done

# ccache keys on paths relative to the repository and ignores the working directory, so a
# fresh clone elsewhere (as CI makes) reuses what an earlier build of the same sources cached.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

build_type=RelWithDebInfo
for a in "$@"; do
  [[ "$a" == -DCMAKE_BUILD_TYPE=* ]] && build_type=${a#-DCMAKE_BUILD_TYPE=}
done

echo "build: configuring $BUILD_DIR ($build_type)"
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "$@" >/dev/null
echo "build: building with $(nproc) jobs"
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "build: done: $BUILD_DIR/bin"

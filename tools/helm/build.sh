#!/usr/bin/env bash
# Builds the helm CLI the deploy tests use (tests/deploy), from the version go.mod/go.sum pin
# (helm.sh/helm/v4 v4.3.2), once per content: the binary is cached under a key of go.mod+go.sum,
# so a rerun costs nothing and a version bump rebuilds. Prints the binary's path (last line).
#
# Usage: bash tools/helm/build.sh
# Environment: SBX_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/sbx): the cache's root;
# the binary goes to $SBX_CACHE_DIR/helm-<hash>/helm. GO (default: go on PATH, else
# /usr/local/go/bin/go). Needs the Go module proxy (or a warm module cache) on a cold build.
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE="${SBX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sbx}"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x "$GO" ]] || { echo "helm/build.sh: ERROR: no go toolchain (set GO=)" >&2; exit 1; }

key=$(cat "$DIR/go.mod" "$DIR/go.sum" | sha256sum | cut -c1-16)
out="$CACHE/helm-$key"
if [[ ! -x "$out/helm" ]]; then
  echo "helm/build.sh: building helm into $out (cold: a few minutes)" >&2
  mkdir -p "$out"
  ver=$(cd "$DIR" && "$GO" list -mod=readonly -m -f '{{.Version}}' helm.sh/helm/v4)
  # -mod=readonly: go.sum is the lock; a build that would change it fails instead. The version
  # stamp is what helm's own Makefile sets (`helm version` says v4.3 without it).
  (cd "$DIR" && CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath \
     -ldflags "-X helm.sh/helm/v4/internal/version.version=$ver" -o "$out/helm.tmp" \
     helm.sh/helm/v4/cmd/helm)
  mv "$out/helm.tmp" "$out/helm"  # atomically: an interrupted build leaves no binary behind
fi
echo "$out/helm"

#!/usr/bin/env bash
# Installs every Debian 12 package sbx needs to build, run and test. Idempotent: when all
# packages are present it does nothing; `apt-get update` runs only when the package lists are
# older than a day (or empty) or a missing package has no install candidate.
# Usage (as root): bash tools/install-deps.sh
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake ninja-build ccache pkg-config
  libboost1.81-dev nlohmann-json3-dev libabsl-dev libseccomp-dev libcap-dev
  libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
  libsqlite3-dev libssl-dev libtomlplusplus-dev libmnl-dev libnftables-dev libarchive-dev
  zlib1g-dev
  python3 python3-pytest python3-yaml python3-jsonschema python3-requests
  python3-prometheus-client
  bubblewrap procps iproute2 util-linux e2fsprogs
  # openssl: test_egress_proxy.py makes its test CA and certificates at test time;
  # python3-cryptography: test_tls.py makes sbxd's test CA with it
  openssl python3-cryptography
  gnuplot-nox runc
  # perf: sbx-load's CPU time and syscalls per operation, and tools/profile.sh's flame graphs
  linux-perf curl
  # Templates (docs/templates.md): libcurl for registry pulls; the tests build images from
  # busybox-static, write archives and push to a loopback docker-registry with skopeo (htpasswd
  # for its basic auth); bench/template_import.sh compares against skopeo + umoci; tinyproxy
  # (its binary only, no service) is the configured proxy of test_registry_token.py.
  libcurl4-openssl-dev busybox-static skopeo docker-registry apache2-utils umoci tinyproxy-bin
  # The E2B code-interpreter template (tools/e2b/code-interpreter.py): mmdebstrap makes its
  # Debian parent, pip downloads its wheels on the host
  mmdebstrap python3-pip
  # The microvm runtime (docs/microvm.md): QEMU's microvm machine and Debian's guest kernel,
  # whose bzImage and /lib/modules sbxd turns into a guest's vmlinux and initramfs
  qemu-system-x86 linux-image-amd64
  # The PostgreSQL store (docs/store.md): libpqxx to build it, the server for its tests
  # (tools/pg_test_server.sh starts a throwaway one)
  libpqxx-dev postgresql
)

die() { echo "install-deps: ERROR: $*" >&2; exit 1; }

command -v apt-get >/dev/null 2>&1 || die "apt-get not found: sbx targets Debian 12"

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing: ${missing[*]}" >&2
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    exec sudo -n -- bash "$0" "$@"
  fi
  die "installing packages needs root: run as root: bash $0"
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp /tmp/sbx-install-deps.XXXXXX.log)
trap 'rm -f "$log"' EXIT

run_logged() {
  # Quiet on success; on failure print what apt said and stop.
  if ! "$@" >>"$log" 2>&1; then
    echo "install-deps: ERROR: '$*' failed; its output:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
}

lists_stale() {
  local lists=/var/lib/apt/lists
  # No downloaded index at all (fresh container) or none newer than ~1 day.
  [[ -z $(find "$lists" -maxdepth 1 -type f -name '*_Packages*' -print -quit 2>/dev/null) ]] && return 0
  [[ -z $(find "$lists" -maxdepth 1 -type f -name '*_Packages*' -mmin -1440 -print -quit 2>/dev/null) ]]
}

no_candidate() {
  local p cand
  for p in "${missing[@]}"; do
    cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [[ -z "$cand" || "$cand" == "(none)" ]] && return 0
  done
  return 1
}

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
updated=0
if lists_stale || no_candidate; then
  run_logged apt-get update -qq
  updated=1
fi

apt_install() {
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}" >>"$log" 2>&1
}

if ! apt_install; then
  if [[ $updated -eq 0 ]]; then
    # Lists looked fresh but a mirror may have moved on (404 on a .deb): refresh once, retry.
    run_logged apt-get update -qq
    apt_install || { echo "install-deps: ERROR: apt-get install failed; its output:" >&2; tail -n 60 "$log" >&2; exit 1; }
  else
    echo "install-deps: ERROR: apt-get install failed; its output:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
fi

still=()
for p in "${missing[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || still+=("$p")
done
[[ ${#still[@]} -eq 0 ]] || die "still not installed after apt-get install: ${still[*]}"
echo "install-deps: done"

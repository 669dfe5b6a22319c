#!/usr/bin/env bash
# The deploy suite (tests/deploy, issue 21): the Helm chart deploy/helm/sbx lints, renders,
# validates against the Kubernetes schemas (kubernetes-validate, strict), matches the committed
# deploy/k8s/sbx.yaml, and its sbxd config passes sbxd's own checker; tests/deploy/test_pods.py
# starts the rendered api and node pods the way a kubelet would (root, a throwaway PostgreSQL
# from tools/pg_test_server.sh, the sbxd of SBX_BUILD_DIR) and runs a sandbox through them.
#   1. helm: tools/helm/build.sh (helm.sh/helm/v4, pinned by tools/helm/go.sum; cached by hash)
#   2. venv: tests/deploy/requirements.lock (--require-hashes) in
#      $SBX_CACHE_DIR/deploy/py-<hash of python version + lock>, made once
#   3. pytest tests/deploy -v --junitxml=JUNIT, with that venv's python
# Prints how long each step took.
#
# Usage: bash tools/test_deploy.sh JUNIT_XML
#        bash tools/test_deploy.sh --relock   (regenerates requirements.lock from requirements.in)
# Environment: SBX_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/sbx), SBX_BUILD_DIR (sbxd
# for the config test; default <repo>/build), SBX_TESTS_MUST_RUN=1 (nothing may skip).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQ="$ROOT/tests/deploy"
CACHE="${SBX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sbx}"
export SBX_CACHE_DIR="$CACHE"

# shellcheck source=tools/pylock.sh
source "$ROOT/tools/pylock.sh"
if [[ ${1:-} == --relock ]]; then
  pylock_relock "$REQ"
  exit
fi
[[ $# -eq 1 ]] || { echo "usage: $0 JUNIT_XML | --relock" >&2; exit 2; }
junit=$(realpath -m "$1")

step_start=0
step() { step_start=$EPOCHREALTIME; echo "test_deploy: $1" >&2; }
took() { awk -v a="$step_start" -v b="$EPOCHREALTIME" -v n="$1" \
           'BEGIN { printf "test_deploy: %-6s took %6.1f s\n", n, b - a }' >&2; }

step "building helm (tools/helm/build.sh)"
helm=$(bash "$ROOT/tools/helm/build.sh" | tail -n1)
took helm

step "preparing the venv (tests/deploy/requirements.lock)"
venv=$(pylock_venv "$REQ/requirements.lock" "$CACHE/deploy")
took venv

step "pytest tests/deploy"
rc=0
(cd "$ROOT" && SBX_HELM="$helm" "$venv/bin/python" -m pytest tests/deploy -v -p no:cacheprovider \
   --junitxml="$junit") || rc=$?
took pytest
exit $rc

#!/usr/bin/env bash
# Networked create vs `none` (issue 16, Performance: "create -> running with an allow-list
# profile, cold: <= 1.2x the same with none"). Starts its own sbxd with egress on inside a
# network namespace this script makes, whose only route out is a veth to a second namespace
# (the stand-in internet, 198.18.0.0/30, exempted), exactly like tests/e2e/test_egress.py: no
# packet leaves the machine and the host's own namespace, routes and sysctls are never touched.
# Then alternates `sbx-load --scenarios create_cold` blocks with `none` and with the allow-list
# profile `lab`, each metered (--sbxd-pid: CPU ms and syscalls per create of sbxd and
# everything it starts), and prints p50 wall, CPU ms and syscalls per create per block.
# Removes everything it made (sbxd by PID, its state dir, both namespaces), also on failure.
# Usage: bash bench/networked_create.sh [creates per block (30)] [blocks (3)]   (root)
#   SBXD=/path/to/sbxd   another sbxd binary (an A/B against an older build)
#   SBXD_ARGS="..."      extra sbxd flags (e.g. "--netns-pool 0")
#   JSON=/path           also write every block's numbers there
#   KEEP_LOG=/path       keep sbxd's log there
#   WARM=N               sbxd keeps a warm pool of N `base` sandboxes (and, where sbxd has
#                        --egress-warm-pool, N network-ready ones for the `lab` blocks) and
#                        the blocks run create_warm instead (p50 and warm-pool hits; not metered)
#   WARM_NET=N           network-ready members instead of WARM (0: networked creates cold, as
#                        before they existed)
#   BURST=N              the blocks run concurrent_create instead: N creates at once, 3 rounds
#                        (p50 and p99 of the burst; errors are printed)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:-30}
BLOCKS=${2:-3}
BIN=${SBX_BUILD_DIR:-$ROOT/build}/bin
SBXD=${SBXD:-$BIN/sbxd}
LOAD=$BIN/sbx-load
TAG=$(head -c 3 /dev/urandom | od -An -tx1 | tr -d ' \n')
DNS="sbxb-d-$TAG"   # sbxd's namespace
INS="sbxb-i-$TAG"   # the stand-in internet
WORK=$(mktemp -d /tmp/sbxnc.XXXXXX)
TOKEN="nc-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
SBXD_PID=""
cleanup() {
  if [[ -n "$SBXD_PID" ]]; then kill "$SBXD_PID" 2>/dev/null || true; wait "$SBXD_PID" 2>/dev/null || true; fi
  ip netns del "$DNS" 2>/dev/null || true
  ip netns del "$INS" 2>/dev/null || true
  if [[ -n "${KEEP_LOG:-}" ]]; then cp "$WORK/sbxd.log" "$KEEP_LOG"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

ip netns add "$DNS"
ip netns add "$INS"
ip -n "$DNS" link set lo up
ip -n "$INS" link set lo up
ip -n "$DNS" link add uplink0 type veth peer name inet0 netns "$INS"
ip -n "$DNS" addr add 198.18.0.1/30 dev uplink0
ip -n "$INS" addr add 198.18.0.2/30 dev inet0
ip -n "$DNS" link set uplink0 up
ip -n "$INS" link set inet0 up
ip -n "$DNS" route add default via 198.18.0.2

WARM_ARGS=(--warm-pool "base=${WARM:-0}")
# An sbxd before network-ready warm pools has no such flag (an A/B against an older build).
if [[ -n "${WARM:-}" ]] && "$SBXD" --help 2>&1 | grep -q -- --egress-warm-pool; then
  WARM_ARGS+=(--egress-warm-pool "${WARM_NET:-$WARM}")
fi
cat > "$WORK/sbxd.toml" <<'EOF'
[egress.profiles.lab]
description = "the stand-in internet's web server only"
allow = [{cidr = "198.18.0.2/32", ports = "8080", protocol = "tcp"}]
EOF
# shellcheck disable=SC2086
setsid nsenter --net="/run/netns/$DNS" "$SBXD" --config "$WORK/sbxd.toml" \
  --state-dir "$WORK/state" --listen 127.0.0.1:0 --admin-token "$TOKEN" "${WARM_ARGS[@]}" \
  --egress true --egress-pool-v4 10.241.0.0/22 --egress-pool-v6 fd5b:5bd0:0:2::/64 \
  --egress-exempt 198.18.0.0/15 --egress-uplink uplink0 ${SBXD_ARGS:-} > "$WORK/sbxd.log" 2>&1 &
SBXD_PID=$!
URL=""
for _ in $(seq 300); do
  URL=$(sed -n 's/^sbxd listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/sbxd.log" | head -n1)
  [[ -n "$URL" ]] && nsenter --net="/run/netns/$DNS" curl -sf "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$SBXD_PID" 2>/dev/null || { cat "$WORK/sbxd.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$URL" ]] || { echo "networked_create: sbxd did not start" >&2; tail -n 20 "$WORK/sbxd.log" >&2; exit 1; }

echo "networked create, $N creates per block, $BLOCKS blocks, $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1 /proc/loadavg)"
echo "sbxd: $SBXD ${SBXD_ARGS:-}"
printf '%-6s %-5s %8s %8s %10s %10s\n' block egress p50_ms p90_ms cpu_ms/op sysc/op
for b in $(seq "$BLOCKS"); do
  for profile in none lab; do
    if [[ -n "${BURST:-}" ]]; then
      args=(--url "$URL" --token "$TOKEN" --scenarios concurrent_create --concurrency "$BURST")
    elif [[ -n "${WARM:-}" ]]; then
      args=(--url "$URL" --token "$TOKEN" --scenarios create_warm --warm-url "$URL" --warm-n "$N")
    else
      args=(--url "$URL" --token "$TOKEN" --scenarios create_cold --create-n "$N" --sbxd-pid "$SBXD_PID")
    fi
    args+=(--out "$WORK/$profile-$b.json")
    [[ "$profile" == none ]] || args+=(--egress-profile "$profile")
    nsenter --net="/run/netns/$DNS" "$LOAD" "${args[@]}" > "$WORK/$profile-$b.out" 2>&1 ||
      { cat "$WORK/$profile-$b.out" >&2; exit 1; }
    python3 - "$WORK/$profile-$b.json" "$b" "$profile" <<'EOF'
import json, sys
sc = json.load(open(sys.argv[1]))["scenarios"]
r = sc.get("create_cold") or sc.get("concurrent_create") or sc["create_warm"]
s, x = r, r.get("extra", {})
def f(v): return "-" if v is None else f"{v:.2f}" if isinstance(v, (int, float)) else str(v)
print(f"{sys.argv[2]:<6} {sys.argv[3]:<5} {f(s.get('p50_ms')):>8} {f(s.get('p90_ms')):>8} "
      f"{f(x.get('cpu_ms_per_op')):>10} {f(x.get('syscalls_per_op')):>10}"
      + (f"  warm-pool hits {x['warm_pool_hits']}" if "warm_pool_hits" in x else "")
      + (f"  burst p99 {f(s.get('p99_ms'))} ms" if "concurrent_create" in sc else "")
      + (f"  errors {r['errors']}: {r.get('error_messages', [''])[0][:200]}" if r.get("errors") else ""))
EOF
  done
done
if [[ -n "${JSON:-}" ]]; then
  python3 - "$WORK" "$JSON" <<'EOF'
import glob, json, os, sys
out = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*-*.json"))):
    sc = json.load(open(p))["scenarios"]
    out[os.path.basename(p)[:-5]] = sc.get("create_cold") or sc.get("concurrent_create") or sc["create_warm"]
json.dump(out, open(sys.argv[2], "w"), indent=1)
EOF
fi

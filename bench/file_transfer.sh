#!/usr/bin/env bash
# File transfer through the files API against a peer doing the same work in the same run:
#   sbx      PUT then GET of N MiB to/from a running sandbox (curl, streamed both ways)
#   bwrap    the same bytes piped into, then out of, a bubblewrap sandbox (`cat`), on the host fs
#   cp       a plain host copy of the file (the disk's floor)
# Prints seconds and MiB/s per step and the sbx/bwrap ratios, and writes them to a JSON file
# that bench/report.py reads into docs/benchmarks.md and SPECIFICATION.md. With perf installed,
# each sbx step also gets its repeatable form: CPU ms and syscalls per MiB of sbxd and every
# process under it (the sandbox's agent included; kernel threads such as the loop device's
# workers are not), from `perf stat -e task-clock,raw_syscalls:sys_enter -p` around the step.
# Starts its own sbxd (loopback, a free port, a temporary state dir) and removes everything it
# made, also on failure.
# Usage: bash bench/file_transfer.sh [MiB (default 512)] [--json PATH]   (root; after tools/build.sh)
#   --json defaults to bench/results/file_transfer.json ("" for none)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MIB=512
JSON=$ROOT/bench/results/file_transfer.json
while [[ $# -gt 0 ]]; do
  case "$1" in
    --json) JSON=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) MIB=$1; shift ;;
  esac
done
BIN=${SBX_BUILD_DIR:-$ROOT/build}/bin
WORK=$(mktemp -d /var/tmp/sbx-ft.XXXXXX)
STATE=$(mktemp -d /tmp/sbxft.XXXX)
TOKEN="ft-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
URL=""
SBXD_PID=""
PERF_PID=""
SID=""
cleanup() {
  if [[ -n "$PERF_PID" ]]; then kill -INT "$PERF_PID" 2>/dev/null || true; wait "$PERF_PID" 2>/dev/null || true; fi
  if [[ -n "$SID" ]]; then
    # sbxd leaves sandboxes running when it stops (they outlive restarts): delete first.
    curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $TOKEN" "$URL/v1/sandboxes/$SID" || true
    for _ in $(seq 300); do
      curl -s -H "Authorization: Bearer $TOKEN" "$URL/v1/sandboxes/$SID" | grep -q '"state":"deleted"' && break
      sleep 0.1
    done
  fi
  if [[ -n "$SBXD_PID" ]]; then kill "$SBXD_PID" 2>/dev/null || true; wait "$SBXD_PID" 2>/dev/null || true; fi
  rm -rf "$WORK" "$STATE"
}
trap cleanup EXIT

now() { date +%s.%N; }
rate() { awk -v s="$1" -v m="$MIB" 'BEGIN { printf "%.2f s  %6.0f MiB/s", s, m / s }'; }

# sbxd and every process below it, comma-separated (for perf stat -p).
tree_pids() {
  ps -e -o pid=,ppid= | awk -v root="$SBXD_PID" '
    { kids[$2] = kids[$2] " " $1 }
    END { out = root; n = split(kids[root], q, " ");
          for (i = 1; i <= n; i++) { out = out "," q[i]; m = split(kids[q[i]], r, " ");
            for (j = 1; j <= m; j++) q[++n] = r[j] }
          print out }'
}
# perf_start NAME / perf_stop NAME: counters of the tree over one step ("" when perf is missing
# or refuses); perf_field NAME task-clock|syscalls prints the total.
perf_start() {
  PERF_PID=""
  command -v perf >/dev/null 2>&1 || return 0
  perf stat -x, -e task-clock,raw_syscalls:sys_enter -p "$(tree_pids)" -o "$WORK/$1.perf" \
    >/dev/null 2>&1 &
  PERF_PID=$!
  sleep 0.5  # attached before the step starts
}
perf_stop() {
  [[ -n "$PERF_PID" ]] || return 0
  kill -INT "$PERF_PID" 2>/dev/null || true
  wait "$PERF_PID" 2>/dev/null || true
  PERF_PID=""
}
perf_field() {  # $1 = name, $2 = task-clock (ms) | syscalls
  [[ -s "$WORK/$1.perf" ]] || { echo null; return; }
  awk -F, -v want="$2" '
    $3 == "task-clock" && want == "task-clock" && $1 ~ /^[0-9.]+$/ { print $1; found = 1 }
    $3 ~ /^raw_syscalls:sys_enter/ && want == "syscalls" && $1 ~ /^[0-9.]+$/ { print $1; found = 1 }
    END { if (!found) print "null" }' "$WORK/$1.perf"
}

head -c $((MIB << 20)) /dev/urandom > "$WORK/src"
want=$(sha256sum < "$WORK/src" | cut -d' ' -f1)

setsid "$BIN/sbxd" --state-dir "$STATE" --listen 127.0.0.1:0 --admin-token "$TOKEN" \
  --warm-pool base=0 > "$WORK/sbxd.log" 2>&1 &
SBXD_PID=$!
for _ in $(seq 300); do
  URL=$(sed -n 's/^sbxd listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/sbxd.log" | head -n1)
  [[ -n "$URL" ]] && curl -sf "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$SBXD_PID" 2>/dev/null || { cat "$WORK/sbxd.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$URL" ]] || { echo "file_transfer: sbxd did not start" >&2; tail -n 20 "$WORK/sbxd.log" >&2; exit 1; }
auth=(-H "Authorization: Bearer $TOKEN")
SID=$(curl -sf "${auth[@]}" -H 'Content-Type: application/json' \
        -d "{\"resources\":{\"disk_mib\":$((MIB * 2 + 256))}}" "$URL/v1/sandboxes" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["sandbox"]["id"])')
for _ in $(seq 200); do
  st=$(curl -sf "${auth[@]}" "$URL/v1/sandboxes/$SID" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [[ "$st" == running ]] && break; sleep 0.05
done

perf_start up
t0=$(now)
curl -sf "${auth[@]}" -T "$WORK/src" "$URL/v1/sandboxes/$SID/files?path=/root/big.bin" >/dev/null
t1=$(now)
perf_stop
perf_start down
t1b=$(now)
got=$(curl -sf "${auth[@]}" "$URL/v1/sandboxes/$SID/files?path=/root/big.bin" | sha256sum | cut -d' ' -f1)
t2=$(now)
perf_stop
[[ "$got" == "$want" ]] || { echo "sbx: checksum mismatch" >&2; exit 1; }
hwm=$(awk '/VmHWM/ {print $2}' /proc/$SBXD_PID/status)

mkdir -p "$WORK/peer"
t3=$(now)
bwrap --ro-bind / / --bind "$WORK/peer" /mnt --dev /dev --proc /proc --unshare-all --die-with-parent \
  sh -c 'cat > /mnt/big.bin && sync /mnt/big.bin' < "$WORK/src"
t4=$(now)
pgot=$(bwrap --ro-bind / / --bind "$WORK/peer" /mnt --dev /dev --proc /proc --unshare-all --die-with-parent \
  cat /mnt/big.bin | sha256sum | cut -d' ' -f1)
t5=$(now)
[[ "$pgot" == "$want" ]] || { echo "bwrap: checksum mismatch" >&2; exit 1; }
t6=$(now)
cp "$WORK/src" "$WORK/copy" && sync "$WORK/copy"
t7=$(now)

up=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}'); down=$(awk -v a="$t1b" -v b="$t2" 'BEGIN{print b-a}')
pup=$(awk -v a="$t3" -v b="$t4" 'BEGIN{print b-a}'); pdown=$(awk -v a="$t4" -v b="$t5" 'BEGIN{print b-a}')
cpt=$(awk -v a="$t6" -v b="$t7" 'BEGIN{print b-a}')
echo "file transfer, $MIB MiB, $(nproc) CPUs, $(uname -r)"
echo "  sbx   upload (PUT, fsync+rename)   $(rate "$up")"
echo "  sbx   download (GET) + sha256      $(rate "$down")"
echo "  bwrap upload (cat > file, sync)    $(rate "$pup")"
echo "  bwrap download (cat) + sha256      $(rate "$pdown")"
echo "  cp    host copy + sync             $(rate "$cpt")"
awk -v a="$up" -v b="$pup" -v c="$down" -v d="$pdown" \
  'BEGIN { printf "  ratio sbx/bwrap: upload %.2fx, download %.2fx (time; lower is better)\n", a/b, c/d }'
echo "  sbxd VmHWM after the transfers: ${hwm} KiB"

if [[ -n "$JSON" ]]; then
  mkdir -p "$(dirname "$JSON")"
  commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "")
  MIB=$MIB UP=$up DOWN=$down PUP=$pup PDOWN=$pdown CPT=$cpt HWM=$hwm COMMIT=$commit \
  UP_MS=$(perf_field up task-clock) UP_SYS=$(perf_field up syscalls) \
  DOWN_MS=$(perf_field down task-clock) DOWN_SYS=$(perf_field down syscalls) \
  python3 - "$JSON" <<'EOF'
import json, os, platform, sys, time
e = os.environ
mib = int(e["MIB"])
def f(k):
    v = e.get(k, "null")
    return None if v in ("", "null") else float(v)
def per_mib(v):
    return None if v is None else round(v / mib, 3)
up, down, pup, pdown = f("UP"), f("DOWN"), f("PUP"), f("PDOWN")
res = {
    "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": e["COMMIT"],
             "cpus": os.cpu_count(), "kernel": platform.release(), "mib": mib,
             "tool": "bench/file_transfer.sh"},
    "sbx": {
        "upload": {"s": round(up, 3), "mib_per_s": round(mib / up, 1),
                   "cpu_ms_per_mib": per_mib(f("UP_MS")), "syscalls_per_mib": per_mib(f("UP_SYS")),
                   "steps": "curl -T: PUT, the agent writes, fsync + rename"},
        "download": {"s": round(down, 3), "mib_per_s": round(mib / down, 1),
                     "cpu_ms_per_mib": per_mib(f("DOWN_MS")),
                     "syscalls_per_mib": per_mib(f("DOWN_SYS")),
                     "steps": "curl GET | sha256sum"},
        "sbxd_vmhwm_kib": int(e["HWM"]) if e.get("HWM") else None,
    },
    "bwrap": {"upload": {"s": round(pup, 3), "mib_per_s": round(mib / pup, 1),
                         "steps": "bwrap sh -c 'cat > file && sync file'"},
              "download": {"s": round(pdown, 3), "mib_per_s": round(mib / pdown, 1),
                           "steps": "bwrap cat file | sha256sum"}},
    "cp": {"s": round(f("CPT"), 3), "steps": "cp + sync on the host"},
    "ratios": {"upload_vs_bwrap": round(up / pup, 3), "download_vs_bwrap": round(down / pdown, 3)},
    "repeatable_basis": "perf stat task-clock and raw_syscalls:sys_enter of sbxd and every process "
                        "under it during the step (agent included, kernel threads not), per MiB",
}
with open(sys.argv[1], "w") as out:
    json.dump(res, out, indent=1)
    out.write("\n")
print(f"  wrote {sys.argv[1]}")
EOF
fi

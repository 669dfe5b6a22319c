#!/usr/bin/env bash
# File transfer through the files API against a peer doing the same work in the same run:
#   sbx      PUT then GET of N MiB to/from a running sandbox (curl, streamed both ways)
#   bwrap    the same bytes piped into, then out of, a bubblewrap sandbox (`cat`), on the host fs
#   cp       a plain host copy of the file (the disk's floor)
# Prints seconds and MiB/s per step and the sbx/bwrap ratios. Starts its own sbxd (loopback,
# a temporary state dir) and removes everything it made, also on failure.
# Usage: bash bench/file_transfer.sh [MiB (default 512)]   (root; after tools/build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MIB=${1:-512}
BIN=${SBX_BUILD_DIR:-$ROOT/build}/bin
PORT=${SBX_BENCH_PORT:-7391}
URL=http://127.0.0.1:$PORT
WORK=$(mktemp -d /var/tmp/sbx-ft.XXXXXX)
STATE=$(mktemp -d /tmp/sbxft.XXXX)
SBXD_PID=""
SID=""
cleanup() {
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

head -c $((MIB << 20)) /dev/urandom > "$WORK/src"
want=$(sha256sum < "$WORK/src" | cut -d' ' -f1)

"$BIN/sbxd" --state-dir "$STATE" --listen "127.0.0.1:$PORT" --log-format json 2> "$WORK/sbxd.log" &
SBXD_PID=$!
for _ in $(seq 100); do curl -sf "$URL/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
TOKEN=$(cat "$STATE/admin-token")
auth=(-H "Authorization: Bearer $TOKEN")
SID=$(curl -sf "${auth[@]}" -H 'Content-Type: application/json' \
        -d "{\"resources\":{\"disk_mib\":$((MIB * 2 + 256))}}" "$URL/v1/sandboxes" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["sandbox"]["id"])')
for _ in $(seq 200); do
  st=$(curl -sf "${auth[@]}" "$URL/v1/sandboxes/$SID" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [[ "$st" == running ]] && break; sleep 0.05
done

t0=$(now)
curl -sf "${auth[@]}" -T "$WORK/src" "$URL/v1/sandboxes/$SID/files?path=/root/big.bin" >/dev/null
t1=$(now)
got=$(curl -sf "${auth[@]}" "$URL/v1/sandboxes/$SID/files?path=/root/big.bin" | sha256sum | cut -d' ' -f1)
t2=$(now)
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

up=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}'); down=$(awk -v a="$t1" -v b="$t2" 'BEGIN{print b-a}')
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

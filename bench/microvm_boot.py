"""microvm create -> running against a bare QEMU boot of the same kernel and initramfs (issue 20).

Same run, interleaved: (a) `POST /v1/sandboxes {"runtime":"microvm"}` until its operation
succeeded, then a delete; (b) the peer: the same QEMU command line, guest config and a fresh
copy of the same empty disk, started by hand with the bridge, timed from QEMU's spawn to the
agent's first answer (a protocol ping). Also the VMM's memory overhead: QEMU's RSS minus what
is resident of the guest's RAM mapping, after one command ran.

Usage: python3 bench/microvm_boot.py [--runs 10] [--memory-mib 256]   (root; build/bin/sbxd)
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from template_pool_bench import Sbxd  # noqa: E402


def vm_pids(state: Path, sid: str) -> dict[str, int]:
    needle = f"{state}/vm/{sid}/".encode()
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd:
            out["qemu" if b"qemu-system" in cmd else "bridge"] = int(p.name)
    return out


def overhead_kib(pid: int, guest_mib: int) -> tuple[int, int, int]:
    """(QEMU's RSS, its private memory outside the guest's RAM mapping, the part of that in
    TCG's code cache) in KiB. File pages (the kernel image, the initramfs, QEMU's own code) are
    the page cache every VM shares. The code cache is QEMU's only anonymous executable mapping
    (-accel tcg,tb-size): a KVM host has none, so the rest is the goal's figure there."""
    total, private, jit, size, file_backed, executable = 0, 0, 0, 0, False, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            file_backed = len(head) > 5 and head[5].startswith("/")
            executable = "x" in head[1]
        elif line.startswith("Size:"):
            size = int(head[1])
        elif line.startswith("Rss:"):
            total += int(head[1])
        elif line.startswith(("Private_Clean:", "Private_Dirty:")) and size != guest_mib * 1024 \
                and not file_backed:
            private += int(head[1])
            if executable:
                jit += int(head[1])
    return total, private, jit


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">IBBH", len(payload), 1, kind, 0) + payload


def ping(path: str) -> bool:
    """One protocol ping through the bridge: True once the agent answered."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(path)
            s.sendall(frame(1, b'{"version":1,"role":"host"}') + frame(2, b'{"op":"ping"}'))
            buf = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                buf += chunk
                while len(buf) >= 8:
                    n, _, kind, _ = struct.unpack(">IBBH", buf[:8])
                    if len(buf) < 8 + n:
                        break
                    if kind == 3:
                        return b'"ok":true' in buf[8:8 + n]
                    buf = buf[8 + n:]
    except OSError:
        return False


def start_bare(argv: list[str], sandbox_dir: str, cfg: bytes, work: Path, golden: Path, agent: Path,
               extra: list[str] = (), pass_fds=()) -> tuple[Path, subprocess.Popen, subprocess.Popen]:
    """The peer: sbxd's QEMU command line for a copy of the sandbox's files in a directory of
    its own, QEMU started by hand as root (no jail) with the bridge beside it."""
    d = Path(tempfile.mkdtemp(prefix="peer-", dir=work))
    (d / "vmm").mkdir()
    (d / "guest.cfg").write_bytes(cfg)
    subprocess.run(["cp", "--sparse=always", str(golden), str(d / "vmm/disk.img")], check=True)
    args = [a.replace(sandbox_dir, str(d)) for a in argv] + list(extra)
    qemu = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, pass_fds=pass_fds)
    bridge = subprocess.Popen([str(agent), "--vm-bridge", str(d / "vmm/serial.sock"), str(d / "agent.sock")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return d, qemu, bridge


def wait_agent(d: Path, qemu: subprocess.Popen, t0: float) -> float:
    deadline = t0 + 120
    while not ping(str(d / "agent.sock")):
        assert qemu.poll() is None, "the peer's QEMU exited"
        assert time.monotonic() < deadline, \
            "the peer's guest did not answer in 120 s: " + (d / "vmm/console.log").read_text()[-1500:]
        time.sleep(0.005)
    return time.monotonic() - t0


def stop_bare(d: Path, *procs: subprocess.Popen) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)
    shutil.rmtree(d, ignore_errors=True)


def bare_boot(argv: list[str], sandbox_dir: str, cfg: bytes, golden: Path, agent: Path, work: Path) -> float:
    t0 = time.monotonic()
    d, qemu, bridge = start_bare(argv, sandbox_dir, cfg, work, golden, agent)
    try:
        return wait_agent(d, qemu, t0)
    finally:
        stop_bare(d, bridge, qemu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--memory-mib", type=int, default=256)
    args = ap.parse_args()
    build = Path(os.environ.get("SBX_BUILD_DIR", ROOT / "build"))
    work = Path(tempfile.mkdtemp(prefix="sbx-microvm-bench-", dir="/var/tmp"))
    state = work / "state"
    state.mkdir()
    sbxd = None
    body = {"runtime": "microvm", "resources": {"memory_mib": args.memory_mib}}
    try:
        sbxd = Sbxd(build, state, secrets.token_hex(16), work / "sbxd.log", ["--warm-pool", "base=0"])
        mv = next(r for r in sbxd.call("GET", "/v1/runtimes")["runtimes"] if r["name"] == "microvm")
        if not mv["available"]:
            print(f"microvm not available here: {mv['reason']}")
            return 1
        # The first create makes the boot assets; it also gives the peer its command line.
        ans = sbxd.call("POST", "/v1/sandboxes", body)
        assert sbxd.wait(ans["operation"]["id"])["state"] == "succeeded"
        sid = ans["sandbox"]["id"]
        pids = vm_pids(state, sid)
        argv = [a.decode() for a in Path(f"/proc/{pids['qemu']}/cmdline").read_bytes().split(b"\0")[:-1]]
        sbxd.call("POST", f"/v1/sandboxes/{sid}/sessions", {"argv": ["true"]})
        rss, over, jit = overhead_kib(pids["qemu"], args.memory_mib)
        sandbox_dir = str(state / "vm" / sid)
        cfg = (Path(sandbox_dir) / "guest.cfg").read_bytes()
        sbxd.call("DELETE", f"/v1/sandboxes/{sid}")
        golden = state / "microvm-assets" / f"golden-{mv['defaults']['disk_mib']}m.img"
        agent = build / "bin/sbx-agent"

        ours, peer = [], []
        for _ in range(args.runs):
            t0 = time.monotonic()
            ans = sbxd.call("POST", "/v1/sandboxes", body)
            op = sbxd.wait(ans["operation"]["id"])
            ours.append(time.monotonic() - t0)
            assert op["state"] == "succeeded", op
            sbxd.wait(sbxd.call("DELETE", f"/v1/sandboxes/{ans['sandbox']['id']}")["operation"]["id"])
            peer.append(bare_boot(argv, sandbox_dir, cfg, golden, agent, work))

        def p(xs, q):
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(q * len(xs)))]
        print(f"accel: {mv['details'].get('accel')} ({mv['details'].get('accel_reason')})")
        print(f"{'':34} {'p50':>9} {'p90':>9}")
        print(f"{'sbx create -> running (microvm)':34} {p(ours, .5) * 1000:8.0f}ms {p(ours, .9) * 1000:8.0f}ms")
        print(f"{'bare QEMU boot -> agent answers':34} {p(peer, .5) * 1000:8.0f}ms {p(peer, .9) * 1000:8.0f}ms")
        print(f"ratio (p50): {statistics.median(ours) / statistics.median(peer):.2f}x   (goal <= 1.2x)")
        print(f"VMM memory: RSS {rss // 1024} MiB with a {args.memory_mib} MiB guest; "
              f"private memory outside guest RAM {over / 1024:.1f} MiB   (goal <= 10 MiB), of which TCG's "
              f"code cache {jit / 1024:.1f} MiB; without it {(over - jit) / 1024:.1f} MiB (what KVM would keep)")
        return 0
    finally:
        if sbxd is not None:
            sbxd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

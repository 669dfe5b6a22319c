"""microvm suspend and wake (issue 20): the VM's state to disk and QEMU gone, then back.

Per guest size, on a sandbox of a busybox image template (its trees are disks, so QEMU can
save it) whose /tmp (a tmpfs in guest memory) holds FILL MiB of random bytes: `POST .../suspend` until the operation
succeeded (QEMU stopped, its state in a file, QEMU exited), then `POST .../wake` until the agent
answers again. The peer, in the same run and on the same VM: what QEMU itself takes for the same
two steps without sbxd (QMP stop + migrate to a file + quit, timed from the socket; then QEMU
started by hand with -incoming and cont, timed to the agent's first answer through a bridge).
Also: the snapshot's size per MiB of guest memory, and the VMM's RSS before and after.

Usage: python3 bench/microvm_suspend.py [--runs 3] [--sizes 256:64,512:256]   (root; skopeo)
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
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests/e2e"))
from template_pool_bench import Sbxd  # noqa: E402
from microvm_boot import ping, vm_pids  # noqa: E402
import images  # noqa: E402


def run(sbxd: Sbxd, sid: str, argv: list[str]) -> None:
    """A session to its exit: created, then attached (which starts it) and read to the end."""
    s = sbxd.call("POST", f"/v1/sandboxes/{sid}/sessions", {"argv": argv})
    req = urllib.request.Request(f"{sbxd.url}/v1/sessions/{s['session_id']}/attach",
                                 headers={"Authorization": f"Bearer {sbxd.token}"})
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if line.startswith(b"event: process_exited"):
                return
    raise RuntimeError(f"{argv}: the attach ended without an exit")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Qmp:
    def __init__(self, path: str):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("r")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, name: str, args: dict | None = None, fd: int | None = None) -> dict:
        data = (json.dumps({"execute": name, **({"arguments": args} if args else {})}) + "\n").encode()
        if fd is None:
            self.s.sendall(data)
        else:
            socket.send_fds(self.s, [data], [fd])
        while True:
            m = json.loads(self.f.readline())
            if "event" not in m:
                return m


def peer_cycle(state: Path, sid: str, argv: list[str], agent: Path, work: Path) -> tuple[float, float, int]:
    """QEMU alone: stop + migrate to a file + quit, then -incoming + cont to the agent's answer."""
    vm = state / "vm" / sid
    snap = work / "peer-state"
    t0 = time.monotonic()
    q = Qmp(str(vm / "vmm/qmp.sock"))
    q.cmd("stop")
    fd = os.open(snap, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    q.cmd("getfd", {"fdname": "s"}, fd=fd)
    q.cmd("migrate", {"uri": "fd:s"})
    while q.cmd("query-migrate")["return"].get("status") not in ("completed", "failed"):
        time.sleep(0.001)
    os.fsync(fd)
    os.close(fd)
    q.cmd("quit")
    q.s.close()
    pid = vm_pids(state, sid).get("qemu")
    while pid and Path(f"/proc/{pid}").exists() and b"qemu" in Path(f"/proc/{pid}/cmdline").read_bytes():
        time.sleep(0.001)
    suspend = time.monotonic() - t0
    size = snap.stat().st_size
    for p in vm_pids(state, sid).values():  # the bridge: the peer brings its own
        os.kill(p, signal.SIGKILL)
    rfd = os.open(snap, os.O_RDONLY)
    t0 = time.monotonic()
    qemu = subprocess.Popen([*argv, "-incoming", f"fd:{rfd}"], pass_fds=[rfd], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(rfd)
    sock = vm / "peer-agent.sock"
    bridge = subprocess.Popen([str(agent), "--vm-bridge", str(vm / "vmm/serial.sock"), str(sock)],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:  # QEMU's QMP serves one client at a time: one connection, polled
            try:
                q = Qmp(str(vm / "vmm/qmp.sock"))
                break
            except OSError:
                time.sleep(0.002)
        while q.cmd("query-status")["return"]["status"] == "inmigrate":
            time.sleep(0.002)
        q.cmd("cont")
        while not ping(str(sock)):
            assert qemu.poll() is None and time.monotonic() - t0 < 120, "the peer's restore failed"
            time.sleep(0.002)
        wake = time.monotonic() - t0
    finally:
        for p in (bridge, qemu):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        snap.unlink(missing_ok=True)
    return suspend, wake, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="256:64,512:256", help="GUEST_MIB:FILL_MIB,...")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",")]
    build = Path(os.environ.get("SBX_BUILD_DIR", ROOT / "build"))
    agent = build / "bin/sbx-agent"
    work = Path(tempfile.mkdtemp(prefix="sbx-suspend-bench-", dir="/var/tmp"))
    state = work / "state"
    state.mkdir()
    sbxd = None
    try:
        sbxd = Sbxd(build, state, secrets.token_hex(16), work / "sbxd.log", ["--warm-pool", "base=0"])
        mv = next(r for r in sbxd.call("GET", "/v1/runtimes")["runtimes"] if r["name"] == "microvm")
        if not mv["available"]:
            print(f"microvm not available here: {mv['reason']}")
            return 1
        layout = work / "bb-layout"
        images.write_layout(layout, [images.busybox_layer().bytes()], env=["PATH=/bin"])
        archive = images.oci_archive(layout, work / "bb.tar")
        ans = sbxd.call("POST", "/v1/templates:import?name=bb&tag=latest", archive.read_bytes(), "application/x-tar")
        assert sbxd.wait(ans["operation"]["id"])["state"] == "succeeded"
        print(f"accel: {mv['details'].get('accel')}")
        print(f"{'guest/fill MiB':>14} {'suspend':>9} {'peer':>9} {'ratio':>6} {'wake':>9} {'peer':>9} {'ratio':>6} "
              f"{'state MiB':>9} {'per guest MiB':>13} {'RSS before':>10} {'after':>6}")
        for guest, fill in sizes:
            rows = []
            for _ in range(args.runs):
                body = {"runtime": "microvm", "template": "bb:latest",
                        "resources": {"memory_mib": guest}}
                ans = sbxd.call("POST", "/v1/sandboxes", body)
                op = sbxd.wait(ans["operation"]["id"])
                assert op["state"] == "succeeded", op
                sid = ans["sandbox"]["id"]
                run(sbxd, sid, ["sh", "-c", f"head -c {fill * 1048576} /dev/urandom > /tmp/fill"])
                pid = vm_pids(state, sid)["qemu"]
                argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
                before = rss_kib(pid)
                t0 = time.monotonic()
                op = sbxd.wait(sbxd.call("POST", f"/v1/sandboxes/{sid}/suspend")["operation"]["id"])
                suspend = time.monotonic() - t0
                assert op["state"] == "succeeded" and op["result"]["memory_released"], op
                assert "qemu" not in vm_pids(state, sid), "QEMU still runs while suspended"
                snapshot = op["result"]["snapshot_bytes"]
                t0 = time.monotonic()
                op = sbxd.wait(sbxd.call("POST", f"/v1/sandboxes/{sid}/wake")["operation"]["id"])
                wake = time.monotonic() - t0
                assert op["state"] == "succeeded", op
                after = rss_kib(vm_pids(state, sid)["qemu"])
                p_suspend, p_wake, _ = peer_cycle(state, sid, argv, agent, work)
                sbxd.wait(sbxd.call("DELETE", f"/v1/sandboxes/{sid}")["operation"]["id"])
                rows.append((suspend, p_suspend, wake, p_wake, snapshot, before, after))
            med = [statistics.median(r[i] for r in rows) for i in range(7)]
            print(f"{f'{guest}/{fill}':>14} {med[0] * 1000:7.0f}ms {med[1] * 1000:7.0f}ms {med[0] / med[1]:5.2f}x "
                  f"{med[2] * 1000:7.0f}ms {med[3] * 1000:7.0f}ms {med[2] / med[3]:5.2f}x "
                  f"{med[4] / 1048576:9.1f} {med[4] / 1048576 / guest:13.3f} {med[5] // 1024:8.0f}Mi {med[6] // 1024:4.0f}Mi")
        return 0
    finally:
        if sbxd is not None:
            sbxd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

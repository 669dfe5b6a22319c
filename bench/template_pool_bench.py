"""Warm pools of an image template (issue 17): create -> running from the pool of a busybox
image template beside `base`'s pool, in the same sbxd, interleaved. Each create waits until its
pool holds a sandbox, so every create is a take (the 202 answer must carry the finished
operation); the peer is `base`'s pool.

Usage: python3 bench/template_pool_bench.py [--creates 20]   (root; uses build/bin/sbxd)
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
sys.path.insert(0, str(ROOT / "tests/e2e"))
import images  # noqa: E402


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Sbxd:
    def __init__(self, build: Path, state: Path, token: str, log: Path, extra: list[str]):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.token = token
        self.proc = subprocess.Popen(
            [str(build / "bin/sbxd"), "--listen", f"127.0.0.1:{port}", "--state-dir", str(state),
             "--admin-token", token, *extra],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(self.url + "/readyz", timeout=2).status == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)

    def call(self, method: str, path: str, body=None, ctype="application/json"):
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")

    def wait(self, op_id: str) -> dict:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            o = self.call("GET", f"/v1/operations/{op_id}?wait_ms=5000")
            if o["state"] in ("succeeded", "failed"):
                return o
        raise TimeoutError(op_id)

    def ready(self, template: str) -> float:
        req = urllib.request.Request(self.url + "/metrics",
                                     headers={"Authorization": f"Bearer {self.token}"})
        text = urllib.request.urlopen(req, timeout=10).read().decode()
        key = f'sbx_warm_pool_ready{{runtime="ns",template="{template}",egress="none"}}'
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--creates", type=int, default=20)
    args = ap.parse_args()
    build = Path(os.environ.get("SBX_BUILD_DIR", ROOT / "build"))
    work = Path(tempfile.mkdtemp(prefix="sbx-pool-bench-", dir="/var/tmp"))
    state = work / "state"
    state.mkdir()
    token = secrets.token_hex(16)
    sbxd = None
    try:
        # The image template first; a pool of it is configured at the next start.
        sbxd = Sbxd(build, state, token, work / "sbxd.log", ["--warm-pool", "base=0"])
        layout = work / "bb"
        images.write_layout(layout, [images.busybox_layer().bytes()], env=["PATH=/bin"])
        ans = sbxd.call("POST", "/v1/templates:import?name=bb",
                        images.docker_archive(layout, work / "bb.tar").read_bytes(),
                        "application/x-tar")
        assert sbxd.wait(ans["operation"]["id"])["state"] == "succeeded"
        sbxd.stop()
        sbxd = Sbxd(build, state, token, work / "sbxd.log",
                    ["--warm-pool", "base=1", "--warm-pool", "bb=1"])
        times: dict[str, list[float]] = {"base": [], "bb": []}
        for _ in range(args.creates):
            for tpl in times:
                deadline = time.monotonic() + 30
                while sbxd.ready(tpl) < 1:
                    assert time.monotonic() < deadline, f"pool {tpl} never refilled"
                    time.sleep(0.02)
                t0 = time.monotonic()
                r = sbxd.call("POST", "/v1/sandboxes", {"template": tpl})
                dt = time.monotonic() - t0
                assert r["operation"]["state"] == "succeeded", ("not a take", r["operation"])
                times[tpl].append(dt)
                sbxd.wait(sbxd.call("DELETE", f"/v1/sandboxes/{r['sandbox']['id']}")
                          ["operation"]["id"])
        ours = statistics.median(times["bb"]) * 1000
        peer = statistics.median(times["base"]) * 1000
        print(f"{'figure':44} {'sbx':>8} {'peer':>8} {'ratio':>6}  peer")
        print(f"{'create->running from the warm pool, p50 (ms)':44} {ours:8.2f} {peer:8.2f} "
              f"{ours / peer:6.2f}  base's pool")
    finally:
        if sbxd is not None:
            sbxd.stop()
        subprocess.run(["umount", "-R", str(state)], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

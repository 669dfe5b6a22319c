"""Authorization in the exec path (issue 18): the exec round trip (create a session, attach,
read its exit) with a tenant's management token beside the operator's admin token, in the same
sbxd, alternating rounds of `sbx-load --scenarios exec`. A tenant token costs a store read of
its row and a SHA-256 per request; the admin token a SHA-256. The micro-benchmark of the check
alone is BM_TokenCheck (bench/micro/tenancy_bench.cc).

Usage: python3 bench/tenancy_bench.py [--rounds 3] [--exec-n 200]   (root; uses build/bin)
"""
from __future__ import annotations

import argparse
import json
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


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def call(url: str, token: str, method: str, path: str, body=None) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body else None,
                                 method=method,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def exec_p50(build: Path, url: str, token: str, n: int, out: Path) -> float:
    subprocess.run([str(build / "bin/sbx-load"), "--url", url, "--token", token,
                    "--scenarios", "exec", "--peers", "fork_exec_true", "--exec-n", str(n),
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL, timeout=600)
    return json.loads(out.read_text())["scenarios"]["exec"]["p50_ms"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--exec-n", type=int, default=200)
    ap.add_argument("--build", default=str(ROOT / "build"))
    args = ap.parse_args()
    build = Path(args.build)
    work = Path(tempfile.mkdtemp(prefix="sbx-tenancy-bench-"))
    admin = secrets.token_urlsafe(32)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / "sbxd.log", "wb")
    proc = subprocess.Popen([str(build / "bin/sbxd"), "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(work / "state"), "--admin-token", admin],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(url + "/readyz", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "sbxd did not start"
            time.sleep(0.05)
        ten = call(url, admin, "POST", "/v1/admin/tenants", {"name": "bench"})["tenant"]["id"]
        tok = call(url, admin, "POST", f"/v1/admin/tenants/{ten}/tokens",
                   {"name": "bench", "scopes": ["read", "sandboxes", "sessions"]})["token"]["token"]
        p50 = {"admin": [], "tenant": []}
        for r in range(args.rounds):
            for who, t in (("admin", admin), ("tenant", tok)):
                p50[who].append(exec_p50(build, url, t, args.exec_n, work / f"{who}-{r}.json"))
        a, t = statistics.median(p50["admin"]), statistics.median(p50["tenant"])
        print(f"exec round trip p50 over {args.rounds} rounds of {args.exec_n}: "
              f"admin token {a:.3f} ms, tenant token {t:.3f} ms, ratio {t / a:.3f}")
        print(json.dumps({"admin_p50_ms": p50["admin"], "tenant_p50_ms": p50["tenant"],
                          "ratio": round(t / a, 3)}))
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

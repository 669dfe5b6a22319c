#!/usr/bin/env python3
"""Port exposure (issue 16): a server in a sandbox reached through sbxd against the same server
run on the host and reached directly over loopback, in one run, alternating:

  rtt   GET /headers on one keep-alive connection: per-request round trip, p50/p90 (goal: through
        sbxd <= 1.5x direct)
  ws    WebSocket echo of 64 KiB binary messages, one in flight: MiB/s (goal: >= 0.5x direct)

The server is tests/e2e/port_server.py (Python's ThreadingHTTPServer) in both cases; sbxd runs
the ns runtime with the `none` profile. Loopback only; everything it starts it stops.

Usage: python3 bench/port_exposure.py [--build build] [--rounds 5] [--requests 500]
       [--ws-mib 64] [--out build/bench-ports/port_exposure.json]
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
os.environ.setdefault("SBX_E2E_RUNTIME", "ns")
SERVER = (REPO / "tests" / "e2e" / "port_server.py").read_text()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rtt(host: str, port: int, path: str, headers: dict, n: int, fresh: bool = False) -> list[float]:
    """Round trips on one keep-alive connection; `fresh`: a new connection for each request
    (what sbxd does toward the sandbox's server today)."""
    c = http.client.HTTPConnection(host, port, timeout=30)
    out = []
    try:
        for _ in range(n):
            if fresh:
                c.close()
                c = http.client.HTTPConnection(host, port, timeout=30)
            t = time.perf_counter()
            c.request("GET", path, headers=headers)
            r = c.getresponse()
            r.read()
            assert r.status == 200, r.status
            out.append(time.perf_counter() - t)
    finally:
        c.close()
    return out


def ws_connect(host: str, port: int, path: str, headers: dict) -> socket.socket:
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    assert buf.split(b" ")[1] == b"101", buf[:200]
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        part = s.recv(n - len(out))
        assert part, "closed"
        out += part
    return bytes(out)


def ws_throughput(host: str, port: int, path: str, headers: dict, mib: int) -> float:
    s = ws_connect(host, port, path, headers)
    payload = os.urandom(64 << 10)
    # A zero masking key is a valid key: the payload goes as it is, and the server's unmask is
    # the same work for both paths.
    frame = struct.pack("!BBQ", 0x82, 0x80 | 127, len(payload)) + b"\0\0\0\0" + payload
    count = (mib << 20) // len(payload)
    t = time.perf_counter()
    for _ in range(count):
        s.sendall(frame)
        head = recv_exact(s, 2)
        n = head[1] & 0x7F
        n = struct.unpack("!H", recv_exact(s, 2))[0] if n == 126 else \
            struct.unpack("!Q", recv_exact(s, 8))[0] if n == 127 else n
        recv_exact(s, n)
    dt = time.perf_counter() - t
    s.close()
    return count * len(payload) / dt / (1 << 20)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--ws-mib", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["SBX_BUILD_DIR"] = str(Path(args.build).resolve())
    import conftest  # noqa: E402
    from openapi_validator import OpenApiValidator
    from sbx_client import SbxClient
    from port_helpers import start_server

    d = conftest.Daemon([])
    d.start()
    api = SbxClient(d.url, d.token, OpenApiValidator(REPO / "docs/api/openapi.yaml"))
    direct = None
    try:
        sb = api.create_sandbox({})["sandbox"]
        start_server(api, sb["id"], 8000, "127.0.0.1")
        # The same server on the host, on a free loopback port.
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        hport = probe.getsockname()[1]
        probe.close()
        direct = subprocess.Popen([sys.executable, "-c", SERVER, str(hport), "127.0.0.1"],
                                  stdout=subprocess.PIPE)
        assert direct.stdout.readline().strip() == b"ready"
        sport = int(d.url.rsplit(":", 1)[1])
        tok = {"X-Sbx-Traffic-Token": sb["traffic_token"]}
        prefix = f"/v1/sandboxes/{sb['id']}/ports/8000"
        res = {"rtt_direct": [], "rtt_sbxd": [], "rtt_direct_fresh": [], "ws_direct": [], "ws_sbxd": []}
        rtt(sbxd_host := "127.0.0.1", sport, prefix + "/headers", tok, 50)  # warm-up
        res["sbxd_cpu_us_per_request"] = []
        for _ in range(args.rounds):
            res["rtt_direct"] += rtt("127.0.0.1", hport, "/headers", {}, args.requests)
            res["rtt_direct_fresh"] += rtt("127.0.0.1", hport, "/headers", {}, args.requests, True)
            before = cpu_seconds(d.proc.pid)
            res["rtt_sbxd"] += rtt(sbxd_host, sport, prefix + "/headers", tok, args.requests)
            res["sbxd_cpu_us_per_request"].append(
                (cpu_seconds(d.proc.pid) - before) / args.requests * 1e6)
            res["ws_direct"].append(ws_throughput("127.0.0.1", hport, "/ws", {}, args.ws_mib))
            res["ws_sbxd"].append(ws_throughput(sbxd_host, sport, prefix + "/ws", tok, args.ws_mib))
        q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1e6  # noqa: E731
        summary = {
            "rtt_direct_p50_us": q(res["rtt_direct"], 50), "rtt_sbxd_p50_us": q(res["rtt_sbxd"], 50),
            "rtt_direct_fresh_conn_p50_us": q(res["rtt_direct_fresh"], 50),
            "rtt_direct_p90_us": q(res["rtt_direct"], 90), "rtt_sbxd_p90_us": q(res["rtt_sbxd"], 90),
            "ws_direct_mib_s": statistics.median(res["ws_direct"]),
            "ws_sbxd_mib_s": statistics.median(res["ws_sbxd"]),
        }
        # CPU sbxd spent per proxied request (utime+stime of the whole process): what the
        # relay costs whatever the machine's load, unlike the wall-clock round trips.
        summary["sbxd_cpu_us_per_request"] = statistics.median(res["sbxd_cpu_us_per_request"])
        summary["rtt_ratio_p50"] = summary["rtt_sbxd_p50_us"] / summary["rtt_direct_p50_us"]
        summary["ws_ratio"] = summary["ws_sbxd_mib_s"] / summary["ws_direct_mib_s"]
        summary["rounds"], summary["requests_per_round"], summary["ws_mib"] = \
            args.rounds, args.requests, args.ws_mib
        print(json.dumps(summary, indent=2))
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        if direct is not None:
            direct.kill()
            direct.wait()
        for s in list(api.created_sandboxes):
            api.delete_sandbox(s, wait=True)
        api.close()
        d.stop()
        import shutil
        shutil.rmtree(d.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

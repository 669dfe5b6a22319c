#!/usr/bin/env python3
"""Quick latency check (Python standard library only) until the C++ load tool exists.

Measures, from a client over HTTP on loopback, N sequential runs of:
  create -> running            (POST /v1/sandboxes, then poll the operation until succeeded)
  create -> first stdout byte  (the above + session + attach of `echo hi`, first stdout event)
and, in the same run, the peer `bwrap --unshare-all ... echo hi` spawned N times.

Usage: SBX_URL=http://127.0.0.1:7070 SBX_TOKEN=... python3 bench/quick_latency.py [-n 50]
Prints medians and p90s; exits non-zero if any run fails. Nothing here is asserted on time.
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse


class Client:
    def __init__(self, url, token):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.token = token
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def call(self, method, path, body=None):
        headers = {"Authorization": "Bearer " + self.token}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        payload = r.read()
        if r.status >= 400:
            raise RuntimeError(f"{method} {path}: {r.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None

    def wait_op(self, op_id):
        while True:  # the server holds the request until the operation ends
            op = self.call("GET", f"/v1/operations/{op_id}?wait_ms=30000")
            if op["state"] == "succeeded":
                return op
            if op["state"] == "failed":
                raise RuntimeError(f"operation {op_id} failed: {op['error']}")

    def first_output(self, session):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.request("GET", session["attach"]["url"],
                     headers={"Authorization": "Bearer " + session["attach"]["token"]})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"attach: {r.status} {r.read()[:300]!r}")
        first = None
        event = None
        while True:
            line = r.fp.readline()
            if not line:
                raise RuntimeError("attach stream ended without process_exited")
            line = line.rstrip(b"\r\n")
            if line.startswith(b"event: "):
                event = line[7:].decode()
            elif line.startswith(b"data: "):
                if event == "stdout" and first is None:
                    first = time.perf_counter()
                if event == "process_exited":
                    conn.close()
                    return first, json.loads(line[6:])


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def report(name, ms):
    print(f"{name:34s} median {statistics.median(ms):7.2f} ms   p90 {pct(ms, 90):7.2f} ms   "
          f"(n={len(ms)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    args = ap.parse_args()
    url = os.environ.get("SBX_URL", "http://127.0.0.1:7070")
    token = os.environ.get("SBX_TOKEN")
    if not token and os.access("/var/lib/sbx/admin-token", os.R_OK):
        token = open("/var/lib/sbx/admin-token").read().strip()
    if not token:
        sys.exit("set SBX_TOKEN")
    c = Client(url, token)

    to_running, to_output = [], []
    for _ in range(args.n):
        t0 = time.perf_counter()
        created = c.call("POST", "/v1/sandboxes", {"template": "base"})
        c.wait_op(created["operation"]["id"])
        t1 = time.perf_counter()
        sid = created["sandbox"]["id"]
        ses = c.call("POST", f"/v1/sandboxes/{sid}/sessions", {"argv": ["echo", "hi"]})
        first, exited = c.first_output(ses)
        to_running.append((t1 - t0) * 1000)
        to_output.append((first - t0) * 1000)
        if exited.get("exit_code") != 0:
            raise RuntimeError(f"echo hi exited with {exited}")
        c.wait_op(c.call("DELETE", f"/v1/sandboxes/{sid}")["operation"]["id"])

    report("sbx create -> running", to_running)
    report("sbx create -> first output", to_output)

    bwrap = shutil.which("bwrap")
    if bwrap:
        cmd = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
               "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
               "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
               "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "echo", "hi"]
        peer = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, check=True)
            peer.append((time.perf_counter() - t0) * 1000)
            assert out.stdout == b"hi\n"
        report("bwrap --unshare-all echo hi", peer)
        print(f"ratio create->first output / bwrap: "
              f"{statistics.median(to_output) / statistics.median(peer):.2f}x")
    else:
        print("bwrap not installed: no peer measured (apt-get install bubblewrap)")


if __name__ == "__main__":
    main()

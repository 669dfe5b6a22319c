#!/usr/bin/env python3
"""Egress download (issue 16): an HTTP download from a stand-in server through a sandbox's
allow-list path, against the same download from the host namespace, in one run, alternating.

  host    the client runs in sbxd's own namespace (the "host"): uplink veth -> server
  cidr    in a sandbox of a CIDR allow-list: sandbox veth -> nftables -> uplink -> server
  name    in a sandbox of a domain rule: the name resolves through sbxd's resolver, the
          connection goes through sbxd's Host/SNI proxy (splice relay) -> uplink -> server

Goal: name (and cidr) >= 0.8x host. The lab is tests/e2e/netlab.py (sbxd in a test namespace
behind a stand-in internet; nothing leaves the machine). The server sends from a memfd with
sendfile; the client (the same Python code on all three paths) reads into one buffer and times
its own connect + request + body. `--rate-mbit R` puts a token bucket on the stand-in internet's
end of the uplink (a link of R Mbit/s, as a real uplink is), so the figure is the path's under a
link that is not the CPU; 0 (default) leaves the link unlimited, CPU-bound on this machine.

Usage: python3 bench/egress_download.py [--build build] [--mib 128] [--rounds 5]
       [--rate-mbit 0] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
os.environ.setdefault("SBX_E2E_RUNTIME", "ns")

DL_PORT = 8090
NAME = "dl.test"

DL_SERVER = r"""
import os, socket, threading
N = %d
fd = os.memfd_create("dl")
block = bytes(range(256)) * 4096
left = N
while left:
    left -= os.write(fd, block[:min(left, len(block))])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", %d)); s.listen(16)
def serve(c):
    try:
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = c.recv(4096)
            if not d:
                return
            buf += d
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %%d\r\nConnection: close\r\n\r\n" %% N)
        sent = 0
        while sent < N:
            sent += os.sendfile(c.fileno(), fd, sent, N - sent)
    except OSError:
        pass
    finally:
        c.close()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# argv: HOST PORT HOST_HEADER; prints "BYTES SECONDS" (headers included in BYTES).
CLIENT = r"""
import socket, sys, time
host, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
buf = bytearray(1 << 20); mv = memoryview(buf)
t = time.perf_counter()
ip = socket.getaddrinfo(host, port, socket.AF_INET)[0][4][0]
s = socket.create_connection((ip, port), timeout=60)
s.sendall(("GET /dl HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % name).encode())
got = 0
while True:
    k = s.recv_into(mv)
    if not k:
        break
    got += k
print(got, time.perf_counter() - t)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate-mbit", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["SBX_BUILD_DIR"] = str(Path(args.build).resolve())
    import netlab
    from netlab import INTERNET
    from openapi_validator import OpenApiValidator
    from test_egress_proxy import DNS_SERVER

    n = args.mib << 20
    profiles = f"""
[egress.profiles.dlname]
description = "the download server by name"
allow = [{{domain = "{NAME}", ports = "{DL_PORT}"}}]
[egress.profiles.dlcidr]
description = "the download server by address"
allow = [{{cidr = "{INTERNET}/32", ports = "{DL_PORT}", protocol = "tcp"}}]
"""
    servers = [DNS_SERVER % ({NAME: INTERNET},), DL_SERVER % (n, DL_PORT)]
    validator = OpenApiValidator(REPO / "docs/api/openapi.yaml")
    res: dict[str, list[float]] = {"host": [], "cidr": [], "name": []}
    with netlab.lab(validator, profiles, internet_servers=servers,
                    extra_args=["--egress-dns-upstream", f"{INTERNET}:53"]) as api:
        if args.rate_mbit:
            subprocess.run(["ip", "-n", api.netns.inet_ns, "link", "set", "inet0", "txqueuelen",
                            "1000"], check=True)
            subprocess.run(["tc", "-n", api.netns.inet_ns, "qdisc", "add", "dev", "inet0", "root",
                            "tbf", "rate", f"{args.rate_mbit}mbit", "burst", "256k",
                            "latency", "50ms"], check=True)
        by_name = netlab.create(api, {"egress_profile": "dlname"})["id"]
        by_cidr = netlab.create(api, {"egress_profile": "dlcidr"})["id"]

        def parse(out: str) -> float:
            got, secs = out.split()
            assert int(got) > n, f"short download: {out!r}"
            return n / float(secs) / (1 << 20)

        def in_sandbox(sid: str, host: str) -> float:
            r = api.run(sid, ["/usr/bin/python3", "-c", CLIENT, host, str(DL_PORT), NAME],
                        max_seconds=300)
            assert r.exit and r.exit.get("exit_code") == 0, (r.exit, r.stdout, r.stderr)
            return parse(r.stdout.decode())

        def on_host() -> float:
            r = subprocess.run(["ip", "netns", "exec", api.netns.sbxd_ns, "/usr/bin/python3",
                                "-c", CLIENT, INTERNET, str(DL_PORT), NAME],
                               capture_output=True, text=True, check=True, timeout=300)
            return parse(r.stdout)

        try:
            in_sandbox(by_name, NAME)  # warm-up: the first lookup, page cache, the proxy thread
            for _ in range(args.rounds):
                res["host"].append(on_host())
                res["cidr"].append(in_sandbox(by_cidr, INTERNET))
                res["name"].append(in_sandbox(by_name, NAME))
        except BaseException as e:  # the lab's cleanup would otherwise hide it
            print(f"egress_download: {e!r}", file=sys.stderr)
            raise
        finally:
            for sid in list(api.created_sandboxes):
                api.delete_sandbox(sid, wait=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    summary = {
        "mib": args.mib, "rounds": args.rounds, "rate_mbit": args.rate_mbit,
        "host_mib_s": med["host"], "cidr_mib_s": med["cidr"], "name_mib_s": med["name"],
        "cidr_ratio": med["cidr"] / med["host"], "name_ratio": med["name"] / med["host"],
        "all": res,
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

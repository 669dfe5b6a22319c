#!/usr/bin/env python3
"""sbxd's memory under guest-sized replies (issue 13, finding 6), with a peer measured in the
same run. Two batteries, each against a fresh sbxd of the given build:

  guest   (ns runtime, root): a guest starts 160 processes with 32,000 empty argv entries each
          (the finding's reproduction), then 4 concurrent GET /processes, 5 rounds. Peer: the
          host's `ps -eww -o pid,args` listing the same processes (its peak RSS).
  hostile (fake runtime): the agent is tests/e2e/hostile_agent.py sending the largest replies
          the bounds allow (~3.9 MiB); 96 GET /processes and /files:list over 4 sandboxes,
          32 at a time: the worst a compromised agent can make sbxd hold.

For each: sbxd's VmRSS before, its peak (VmHWM) and after, the HTTP codes. Writes JSON to --out
and prints a table. Loopback only; everything it starts it stops.

Usage: python3 bench/guest_replies.py [--build build] [--out build/bench-guest/guest_replies.json]
       [--battery guest,hostile] [--agent-memory-mib N]  (N: for measuring an old build whose
       agent would otherwise be OOM-killed before sbxd grows)
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
os.environ.setdefault("SBX_E2E_RUNTIME", "ns")

MIB = 1 << 20


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def daemon(build: Path, flags: list[str]):
    os.environ["SBX_BUILD_DIR"] = str(build)
    import conftest  # noqa: E402  (reads SBX_BUILD_DIR lazily through build_dir())
    from openapi_validator import OpenApiValidator
    from sbx_client import SbxClient
    d = conftest.Daemon(flags)
    d.start()
    api = SbxClient(d.url, d.token, OpenApiValidator(REPO / "docs/api/openapi.yaml"))
    return d, api


def stop(d, api) -> None:
    for s in list(api.created_sandboxes):
        api.call("DELETE", f"/v1/sandboxes/{s}", validate=False)
    api.close()
    d.stop()


def peer_ps() -> int:
    """Peak RSS of `ps -eww -o pid,args` (reads every process's whole cmdline)."""
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execvp("ps", ["ps", "-eww", "-o", "pid,args"])
    _, _, ru = os.wait4(pid, 0)
    return ru.ru_maxrss * 1024


def battery_guest(build: Path, agent_memory_mib: int | None) -> dict:
    flags = ["--warm-pool", "base=0"]
    if agent_memory_mib:
        flags += ["--agent-memory-mib", str(agent_memory_mib)]
    d, api = daemon(build, flags)
    out: dict = {"battery": "guest"}
    try:
        sid = api.create_sandbox({"resources": {"memory_mib": 2048}})["sandbox"]["id"]
        spawn = ("import subprocess,time\n"
                 "ps=[subprocess.Popen(['/bin/sh','-c','sleep 600']+['']*32000) for _ in range(160)]\n"
                 "print('up',flush=True)\n"
                 "time.sleep(600)\n")
        session = api.create_session(sid, ["python3", "-c", spawn])
        stream = api.attach(session)
        stream.__enter__()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            body = api.call("GET", f"/v1/sandboxes/{sid}/processes", validate=False, timeout=60)
            if body.status_code == 200 and sum(1 for p in body.json()["processes"]
                                               if p["comm"] == "sh") >= 160:
                break
            if body.status_code != 200:
                break
            time.sleep(0.5)
        pid = d.proc.pid
        out["rss_before"] = kib(pid, "VmRSS")
        codes: dict[str, int] = {}
        sizes = []
        clients = [api.clone() for _ in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for _ in range(5):
                for r in pool.map(lambda c: c.call("GET", f"/v1/sandboxes/{sid}/processes",
                                                   validate=False, timeout=120), clients):
                    codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
                    sizes.append(len(r.content))
        for c in clients:
            c.close()
        out["rss_peak"] = kib(pid, "VmHWM")
        out["rss_after"] = kib(pid, "VmRSS")
        out["codes"] = codes
        out["reply_bytes_max"] = max(sizes) if sizes else 0
        out["sandbox_state"] = api.get_sandbox(sid)["state"]
        out["peer_ps_peak"] = peer_ps()
        stream.__exit__(None, None, None)
    finally:
        stop(d, api)
    return out


def battery_hostile(build: Path) -> dict:
    flags = ["--runtime", "fake", "--agent-path", str(build / "tests" / "hostile-agent"),
             "--warm-pool", "base=0"]
    d, api = daemon(build, flags)
    mode = d.state_dir / "hostile-mode"
    mode.write_text("small")
    out: dict = {"battery": "hostile"}
    try:
        ids = [api.create_sandbox({})["sandbox"]["id"] for _ in range(4)]
        mode.write_text("at_limits")
        api.call("GET", f"/v1/sandboxes/{ids[0]}/processes", validate=False, timeout=60)
        pid = d.proc.pid
        out["rss_before"] = kib(pid, "VmRSS")
        clients = [api.clone() for _ in range(32)]

        def one(i: int):
            path = (f"/v1/sandboxes/{ids[i % 4]}/processes" if i % 2 else
                    f"/v1/sandboxes/{ids[i % 4]}/files:list")
            return clients[i % 32].call("GET", path, params=None if i % 2 else {"path": "/"},
                                        validate=False, timeout=120)
        codes: dict[str, int] = {}
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            for r in pool.map(one, range(96)):
                codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
        for c in clients:
            c.close()
        out["rss_peak"] = kib(pid, "VmHWM")
        out["rss_after"] = kib(pid, "VmRSS")
        out["codes"] = codes
    finally:
        stop(d, api)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--out", default=str(REPO / "build/bench-guest/guest_replies.json"))
    ap.add_argument("--battery", default="guest,hostile")
    ap.add_argument("--agent-memory-mib", type=int, default=None)
    args = ap.parse_args()
    build = Path(args.build).resolve()
    results = []
    for b in args.battery.split(","):
        results.append(battery_guest(build, args.agent_memory_mib) if b == "guest"
                       else battery_hostile(build))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"build": str(build), "results": results}, indent=2))
    print(f"{'battery':<8} {'sbxd before':>12} {'peak':>8} {'growth':>8} {'after':>8}  codes  peer")
    for r in results:
        peer = (f"ps -eww peak {r['peer_ps_peak'] / MIB:.1f} MiB" if "peer_ps_peak" in r else "")
        print(f"{r['battery']:<8} {r['rss_before'] / MIB:>10.1f}Mi {r['rss_peak'] / MIB:>6.1f}Mi "
              f"{(r['rss_peak'] - r['rss_before']) / MIB:>6.1f}Mi {r['rss_after'] / MIB:>6.1f}Mi  "
              f"{r['codes']}  {peer} {r.get('sandbox_state', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

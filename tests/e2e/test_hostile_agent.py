"""sbxd against an agent its guest has taken over (issue 13, finding 6): everything the agent
sends is bounded before sbxd holds it, a reply outside the bounds is 502 bad_agent_reply (and
sbxd keeps serving), and sbxd's memory under a burst of the largest replies the bounds allow
stays under the documented ceiling (docs/config.md, server.guest_replies_in_flight).

The agent here is tests/e2e/hostile_agent.py, started by the fake runtime in place of
sbx-agent; the same replies from a real guest are cut by the real agent (tests/security).
"""
from __future__ import annotations

import concurrent.futures
import os
import shutil
from pathlib import Path

import pytest

from conftest import RUNTIME, Daemon, build_dir
from sbx_client import SbxClient


HOSTILE = build_dir() / "tests" / "hostile-agent"
MIB = 1 << 20
IN_FLIGHT = 8        # server.guest_replies_in_flight (the default)
PER_REPLY = 8 * MIB  # the agent's 4 MiB payload and the body written from it
# Allocator and thread-stack noise around the burst: far below what one unbounded reply cost
# before the fix (673 MiB for one request).
SLACK = 48 * MIB

ENDPOINTS = {
    "processes": lambda sid: ("GET", f"/v1/sandboxes/{sid}/processes", None),
    "list": lambda sid: ("GET", f"/v1/sandboxes/{sid}/files:list", {"path": "/", "depth": "1"}),
}


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


class Hostile:
    def __init__(self, validator, sandboxes: int):
        flags = ["--agent-path", str(HOSTILE), "--warm-pool", "base=0"]
        if RUNTIME != "fake":
            flags = ["--runtime", "fake", *flags]
        self.daemon = Daemon(flags)
        self.daemon.start()
        self.api = SbxClient(self.daemon.url, self.daemon.token, validator)
        self.mode = self.daemon.state_dir / "hostile-mode"  # hostile_agent.py finds it there
        self.mode.write_text("small")
        self.ids = [self.api.create_sandbox({})["sandbox"]["id"] for _ in range(sandboxes)]

    def set_mode(self, mode: str) -> None:
        self.mode.write_text(mode)

    def get(self, what: str, sid: str, client: SbxClient | None = None, validate=True):
        method, path, params = ENDPOINTS[what](sid)
        return (client or self.api).call(method, path, params=params, validate=validate,
                                          timeout=60)

    def close(self) -> None:
        for sid in self.ids:
            self.api.call("DELETE", f"/v1/sandboxes/{sid}", validate=False)
        self.api.close()
        self.daemon.stop()
        # The fake runtime mounts nothing: its state directory is all there is left.
        shutil.rmtree(self.daemon.tmp, ignore_errors=True)


@pytest.fixture
def hostile(validator, tmp_path):
    h = Hostile(validator, sandboxes=1)
    try:
        yield h
    finally:
        h.close()


@pytest.mark.parametrize("what", sorted(ENDPOINTS))
@pytest.mark.parametrize("mode", ["huge_frame", "argv_flood", "deep", "long_field",
                                  "many_entries", "not_json"])
def test_a_reply_outside_the_bounds_is_502_and_sbxd_keeps_serving(hostile, what, mode):
    hostile.set_mode(mode)
    resp = hostile.get(what, hostile.ids[0])
    assert resp.status_code == 502, (resp.status_code, resp.text[:500])
    assert resp.body["error"]["code"] == "bad_agent_reply", resp.body
    # The same sandbox answers again once its agent behaves, and sbxd serves everyone else.
    hostile.set_mode("small")
    again = hostile.get(what, hostile.ids[0])
    assert again.status_code == 200, again.text[:500]
    assert again.body["truncated"] is False
    hostile.api.call("GET", "/healthz", expect=200, token=None)
    assert "agent reply refused" in hostile.daemon.log_tail(200)


@pytest.mark.parametrize("what", sorted(ENDPOINTS))
def test_a_reply_at_the_bounds_is_served_whole(hostile, what):
    hostile.set_mode("at_limits")
    resp = hostile.get(what, hostile.ids[0])
    assert resp.status_code == 200, resp.text[:500]
    if what == "processes":
        assert resp.body["sandbox_id"] == hostile.ids[0]
        assert len(resp.body["processes"]) == 120
        assert all(len(p["argv"]) == 256 for p in resp.body["processes"])
    else:
        assert len(resp.body["entries"]) > 1000
    assert len(resp.content) > 3 * MIB


def test_memory_stays_under_the_ceiling_under_a_burst_of_the_largest_replies(validator, tmp_path):
    h = Hostile(validator, sandboxes=4)
    try:
        pid = h.daemon.proc.pid
        h.set_mode("at_limits")
        h.get("processes", h.ids[0])  # warm: threads, allocator arenas, the first big reply
        base_rss = status_kib(pid, "VmRSS") * 1024
        clients = [h.api.clone() for _ in range(32)]
        codes: dict[int, int] = {}
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(h.get, "processes" if i % 2 else "list", h.ids[i % 4],
                                   clients[i % 32], False)
                       for i in range(96)]
            for f in futures:
                r = f.result()
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code in (429, 503):
                    assert r.headers.get("Retry-After") == "1", r.headers
                    assert r.json()["error"]["code"] in ("too_many_requests", "server_busy")
                else:
                    assert r.status_code == 200, r.text[:300]
        for c in clients:
            c.close()
        hwm = status_kib(pid, "VmHWM") * 1024
        end_rss = status_kib(pid, "VmRSS") * 1024
        ceiling = IN_FLIGHT * PER_REPLY + SLACK
        print(f"\nguest-sized burst: 96 requests over 4 sandboxes, codes {codes}; sbxd VmRSS "
              f"{base_rss / MIB:.1f} MiB before, peak {hwm / MIB:.1f} MiB "
              f"(+{(hwm - base_rss) / MIB:.1f}), after {end_rss / MIB:.1f} MiB; ceiling +"
              f"{ceiling / MIB:.0f} MiB")
        assert codes.get(200, 0) >= 8, codes
        assert hwm - base_rss <= ceiling, \
            f"sbxd grew by {(hwm - base_rss) / MIB:.1f} MiB, ceiling {ceiling / MIB:.0f} MiB"
        # Freed buffers go back to the system (mmap threshold fixed in sbxd's main).
        assert end_rss <= base_rss + 16 * MIB, (base_rss / MIB, end_rss / MIB)
    finally:
        h.close()

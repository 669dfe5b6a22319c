"""Helpers of the escape suite: running attack scripts in a sandbox, and reading host state that
an attack could have changed (so that a test can show it did not)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ATTACKS = HERE / "attacks"
RESULT_PREFIX = "SBXSEC-RESULT "
CLEAN_EXIT = {"exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False}


def attack(cls: str, tried: str):
    """Marks a test as one attack: `cls` is the attack class (for the report), `tried` says in
    a few words what the sandbox attempts."""
    return pytest.mark.attack(cls=cls, tried=tried)


def lab_unaffected(lab_fixture: str):
    """The `unaffected` check of an attack run in an egress lab (tests/e2e/netlab.py: its own
    sbxd in a test namespace, whose API the test thread reaches from inside it): after each
    attack that sbxd still answers /healthz; the lab's teardown then checks that it stops
    cleanly with nothing left behind. Assign it to `unaffected` in the module."""

    @pytest.fixture(autouse=True, name="unaffected")
    def unaffected(request):
        api = request.getfixturevalue(lab_fixture)
        yield
        health = api.call("GET", "/healthz", token=None, expect=200, timeout=10).body
        assert health == {"status": "ok"}, health

    return unaffected


def script(name: str) -> str:
    """The text of attacks/<name>.py with the common prelude in front."""
    return (ATTACKS / "_prelude.py").read_text() + "\n" + (ATTACKS / f"{name}.py").read_text()


def run_script(client, sandbox_id: str, name: str, *args, user: str | None = None,
               max_seconds: float = 60.0):
    """Runs attacks/<name>.py as `python3 -c` in the sandbox. Returns (RunResult, result dict);
    the script must have finished normally and printed exactly one result line."""
    fields = {"user": user} if user else {}
    res = client.run(sandbox_id, ["python3", "-c", script(name), *[str(a) for a in args]],
                     max_seconds=max_seconds, **fields)
    lines = [line for line in res.stdout.decode(errors="replace").splitlines()
             if line.startswith(RESULT_PREFIX)]
    assert res.exit == CLEAN_EXIT and len(lines) == 1, (
        f"attack script {name} did not run to its end: exit {res.exit}, stdout "
        f"{res.stdout[-1500:]!r}, stderr {res.stderr[-3000:].decode(errors='replace')}")
    return res, json.loads(lines[0][len(RESULT_PREFIX):])


def sh(client, sandbox_id: str, command: str, *, user: str | None = None, max_seconds: float = 60.0):
    fields = {"user": user} if user else {}
    return client.run(sandbox_id, ["sh", "-c", command], max_seconds=max_seconds, **fields)


# ---- host state -------------------------------------------------------------------------------

def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_text(path: str | Path) -> str:
    with open(path) as f:
        return f.read()


def clock_offset() -> float:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC: constant (to NTP slew) unless someone set the clock."""
    a = time.clock_gettime(time.CLOCK_MONOTONIC)
    r = time.clock_gettime(time.CLOCK_REALTIME)
    b = time.clock_gettime(time.CLOCK_MONOTONIC)
    return r - (a + b) / 2


def vm_rss_kib(pid: int) -> int:
    for line in read_text(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no VmRSS line")


def mountinfo_mentioning(needle: str, pids=("self",)) -> list[str]:
    out = []
    for pid in pids:
        try:
            text = read_text(f"/proc/{pid}/mountinfo")
        except OSError:
            continue
        out += [f"{pid}: {line}" for line in text.splitlines() if needle in line]
    return out


def sandbox_process(sandbox_id: str) -> int:
    """A host pid of some process of the sandbox (found through its cgroup, named after the id)."""
    import hostcheck  # tests/e2e, on sys.path through conftest

    procs = hostcheck.processes_mentioning(sandbox_id)
    assert procs, f"no host process in a cgroup named after {sandbox_id}"
    return procs[0]["pid"]


def uid_map_base(uid_map: list[list[str]]) -> int:
    """The host uid that sandbox uid 0 maps to, from a parsed uid_map ([[inside, outside, count]])."""
    for inside, outside, _count in uid_map:
        if inside == "0":
            return int(outside)
    raise AssertionError(f"uid_map maps no uid 0: {uid_map}")


def wait_until(predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def statvfs_free(path: str | Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def e2e_metric(line: str) -> None:
    """A measured number for the suite's summary (printed with the e2e suite's metrics)."""
    import sys
    sys.modules["sbx_e2e_conftest"].METRICS.append(line)

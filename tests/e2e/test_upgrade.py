"""Upgrading sbxd without killing sandboxes (docs/operations.md, "Upgrading"): a running
sandbox, its files and a running session survive a stop and a new sbxd on the same state dir,
also when the new sbxd puts sandbox cgroups under another runtime.ns.cgroup_parent, as moving
to the shipped systemd unit (SBX_RUNTIME_NS_CGROUP_PARENT=/sbx) does."""

from __future__ import annotations

import base64
import os
import re
import secrets
import time

import pytest

import hostcheck
from conftest import RUNTIME, skip_or_fail

TICKER = ["sh", "-c", "i=0; while [ $i -lt 900 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done"]


def read_ticks_until(api, sid, at_least: int, max_seconds: float = 60) -> int:
    """Attaches (replay from the start), reads until tick `at_least` has been printed, detaches.
    Returns the highest tick seen; checks that the ticks seen so far are 0, 1, 2, ... in order."""
    seen = b""
    deadline = time.monotonic() + max_seconds
    with api.attach(sid) as stream:
        for ev in stream.events():
            assert time.monotonic() < deadline, f"tick {at_least} never came: {seen[-300:]!r}"
            assert ev.event != "process_exited", f"the ticker ended: {ev.data}; output {seen[-300:]!r}"
            if ev.event != "stdout":
                continue
            seen += base64.b64decode(ev.data["data_b64"])
            ticks = [int(n) for n in re.findall(rb"tick (\d+)\n", seen)]
            if ticks and ticks[-1] >= at_least:
                assert ticks == list(range(len(ticks))), f"ticks lost or repeated: {ticks}"
                return ticks[-1]
    raise AssertionError(f"the stream ended before tick {at_least}: {seen[-300:]!r}")


def session_pid(api, sandbox_id: str, sid: str) -> int:
    procs = api.call("GET", f"/v1/sandboxes/{sandbox_id}/processes", expect=200).body["processes"]
    leaders = [p for p in procs if p.get("session_id") == sid and p["argv"][:1] == ["sh"]]
    assert len(leaders) == 1, procs
    return leaders[0]["pid"]


def _cgroup_mounts() -> list[str]:
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] and right.split()[0] in ("cgroup", "cgroup2"):
                mounts.append(hostcheck._unescape_mount(left.split()[4]))
    return mounts


@pytest.fixture
def cgroup_parent():
    """A cgroup parent path for the test's sbxd. Set up before `restartable`, so it is torn
    down after it: by then the sbxd is stopped and every sandbox it left removed, and the
    parent directory sbxd made in each hierarchy is empty and removed here."""
    parent = f"/sbx-e2e-upgrade-{secrets.token_hex(4)}"
    yield parent
    left = []
    for mount in _cgroup_mounts():
        path = mount + parent
        if os.path.isdir(path):
            try:
                os.rmdir(path)
            except OSError as e:
                left.append(f"{path}: {e}")
    assert not left, f"cgroup parent not removable: {left}"


def test_sandboxes_survive_an_upgrade_that_moves_the_cgroup_parent(cgroup_parent, restartable):
    if RUNTIME != "ns":
        skip_or_fail("cgroup parents belong to the ns runtime")
    parent = cgroup_parent
    api = restartable.start()
    restartable.track(api)
    old = api.create_sandbox({})["sandbox"]["id"]
    api.call("PUT", f"/v1/sandboxes/{old}/files", params={"path": "/srv/kept.txt", "mkdirs": "true"},
             data=b"written before the upgrade\n",
             headers={"Content-Type": "application/octet-stream"}, expect=200)
    session = api.create_session(old, TICKER)
    sid = session["session_id"]
    before = read_ticks_until(api, sid, 3)
    pid = session_pid(api, old, sid)
    old_cgroups = hostcheck.cgroup_dirs(old)
    assert old_cgroups and all(d.endswith(f"/sbx/{old}") for d in old_cgroups), old_cgroups
    created = api.created_sandboxes
    api.close()

    api = restartable.restart(["--cgroup-parent", parent])
    api.created_sandboxes = created
    restartable.track(api)

    # The old sandbox: same session process, still printing, files intact, cgroups where
    # they were.
    assert api.get_sandbox(old)["state"] == "running"
    assert api.get_session(sid)["state"] == "running"
    after = read_ticks_until(api, sid, before + 5)
    assert after >= before + 5
    assert session_pid(api, old, sid) == pid, "the session's process was restarted"
    got = api.call("GET", f"/v1/sandboxes/{old}/files", params={"path": "/srv/kept.txt"}, expect=200)
    assert got.content == b"written before the upgrade\n"
    assert api.run(old, ["echo", "exec after the upgrade"]).stdout == b"exec after the upgrade\n"
    assert hostcheck.cgroup_dirs(old) == old_cgroups

    # A new sandbox goes under the new parent, in every hierarchy.
    new = api.create_sandbox({})["sandbox"]["id"]
    assert api.run(new, ["echo", "new"]).stdout == b"new\n"
    new_cgroups = hostcheck.cgroup_dirs(new)
    assert new_cgroups and all(d.endswith(f"{parent}/{new}") for d in new_cgroups), new_cgroups

    api.call("POST", f"/v1/sessions/{sid}/signal", json_body={"signal": "TERM"}, expect=204)
    for sb in (old, new):
        api.delete_sandbox(sb)
    for d in old_cgroups + new_cgroups:
        assert not os.path.exists(d), f"cgroup left after delete: {d}"
    api.close()

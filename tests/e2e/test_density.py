"""Density limits (docs/doctor.md, "Density"; docs/config.md, `admission.max_sandboxes`): sbxd
raises its soft RLIMIT_NOFILE, caps the sandboxes it holds at what the host's limits hold,
refuses to start with a maximum they cannot hold, and answers one create past the maximum with
503 insufficient_capacity naming `sandboxes`. `sbx doctor --max-sandboxes N` warns per short
limit. Low limits come from a low RLIMIT_NOFILE given to the child and small maximums, never
from thousands of real sandboxes."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import RUNTIME, Daemon, build_dir, shutdown
from sbx_client import SbxClient

TIMEOUT_S = 60


def with_nofile(soft: int, hard: int):
    def set_limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limits


def run_sbxd(args: list[str], soft: int, hard: int, state: Path, wait_for_listen: bool):
    argv = [str(build_dir() / "bin" / "sbxd"), "--listen", "127.0.0.1:0", "--state-dir",
            str(state), "--log-format", "text", "--warm-pool", "base=0", *args]
    if RUNTIME == "fake":
        argv += ["--runtime", "fake"]
    env = {k: v for k, v in os.environ.items() if k not in ("SBX_ADMIN_TOKEN", "SBX_CONFIG")}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=with_nofile(soft, hard), start_new_session=True)
    if not wait_for_listen:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
        return proc.returncode, out
    lines = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for line in proc.stdout:
            lines.append(line)
            if "sbxd listening on" in line or time.monotonic() > deadline:
                break
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode, "".join(lines)


@pytest.fixture
def tmp():
    d = Path(tempfile.mkdtemp(prefix="sbx-density-e2e-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_maximum_the_descriptors_cannot_hold_stops_sbxd_naming_the_fix(tmp):
    state = tmp / "state"
    rc, out = run_sbxd(["--max-sandboxes", "5000"], 1024, 1024, state, wait_for_listen=False)
    assert rc == 1, out
    assert "--max-sandboxes" in out and "this host's limits hold" in out, out
    assert "sbxd's open files is 1024" in out, out
    assert "LimitNOFILE=" in out, out
    assert not state.exists(), "the state dir was made before the limits were checked"


def test_sbxd_raises_its_soft_limit_and_caps_at_what_the_host_holds(tmp):
    rc, out = run_sbxd([], 256, 4096, tmp / "state", wait_for_listen=True)
    assert "sbxd listening on" in out, out
    assert "raised the soft RLIMIT_NOFILE from 256 to the hard limit 4096" in out, out
    m = re.search(r"this host's limits hold (\d+) sandboxes \(set by ([^)]+)\)", out)
    assert m, out
    # 4096 - 256 of sbxd's own - the connections (1024 + 2 x 16 + 1), less the ns pools.
    assert int(m.group(1)) <= 4096 - 256 - 1057, out
    assert m.group(2) == "sbxd's open files", out


def test_one_create_past_the_maximum_is_503_naming_sandboxes(validator):
    d = Daemon(["--warm-pool", "base=0", "--max-sandboxes", "2", "--admission", "false"])
    d.start()
    api = SbxClient(d.url, d.token, validator)
    ids = []
    problems = []
    try:
        for _ in range(2):
            ids.append(api.create_sandbox({})["sandbox"]["id"])
        resp = api.call("POST", "/v1/sandboxes", json_body={}, expect=503)
        err = resp.body["error"]
        assert err["code"] == "insufficient_capacity", err
        assert err["details"] == {"resource": "sandboxes", "requested": 1, "available": 0,
                                  "capacity": 2}, err
        assert "admission.max_sandboxes" in err["message"], err
        assert resp.headers.get("Retry-After", "").isdigit(), resp.headers
        assert len([s for s in api.list_sandboxes() if s["state"] != "deleted"]) == 2
        # A delete makes room.
        api.delete_sandbox(ids.pop(0))
        ids.append(api.create_sandbox({})["sandbox"]["id"])
    finally:
        for sid in ids:
            r = api.call("DELETE", f"/v1/sandboxes/{sid}", validate=False)
            if r.status_code == 202 and api.wait_operation(
                    r.body["operation"]["id"], timeout=60)["state"] != "succeeded":
                problems.append(f"delete {sid} failed")
        api.close()
        problems += shutdown(d, validator, ids)
    assert not problems, problems


def test_doctor_warns_per_short_limit_with_its_fix(tmp):
    argv = [str(build_dir() / "bin" / "sbx"), "doctor", "--json", "--state-dir",
            str(tmp / "state"), "--runtime", RUNTIME, "--max-sandboxes", "1000000"]
    env = {k: v for k, v in os.environ.items() if k not in ("SBX_ADMIN_TOKEN", "SBX_TOKEN")}
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=TIMEOUT_S, env=env, preexec_fn=with_nofile(1024, 1024))
    rows = {c["id"]: c for c in json.loads(r.stdout)["checks"]}
    files = rows["limits.open_files"]
    assert files["result"] == "warn" and not files["required"], files
    assert "1024 holds" in files["detail"], files
    assert "LimitNOFILE=" in files["remedy"], files
    assert rows["limits.sandboxes"]["result"] == "warn", rows["limits.sandboxes"]
    if RUNTIME == "ns":
        # A million is more than the uid ranges of one host.
        assert rows["limits.uid_ranges"]["result"] == "warn", rows["limits.uid_ranges"]
        assert "kernel.pid_max" in rows["limits.pids"]["title"]
    # The same host and a small maximum: no warnings but kernel memory's.
    r = subprocess.run(argv[:-1] + ["10"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=TIMEOUT_S, env=env, preexec_fn=with_nofile(4096, 4096))
    rows = {c["id"]: c for c in json.loads(r.stdout)["checks"]}
    for rid, c in rows.items():
        if rid.startswith("limits.") and rid != "limits.kernel_memory":
            assert c["result"] == "ok", c

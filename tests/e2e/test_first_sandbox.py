"""The first-sandbox walkthrough: create -> poll op -> running -> session -> attach -> delete."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sbx_client import ID_RE, TIMESTAMP_RE

REPO = Path(__file__).resolve().parents[2]
GREETING = b"hello from sbx\n"


def check_timestamps(obj, *names):
    for n in names:
        v = obj.get(n)
        assert isinstance(v, str) and TIMESTAMP_RE.match(v), f"{n} must be RFC 3339 UTC with ms: {v!r} in {obj}"


def test_first_sandbox_flow(api, sbxd):
    created = api.create_sandbox({}, wait=False)
    sb, op = created["sandbox"], created["operation"]
    assert ID_RE["sbx"].match(sb["id"]), sb["id"]
    assert ID_RE["op"].match(op["id"]), op["id"]
    assert op["kind"] == "create" and op["sandbox_id"] == sb["id"], op
    assert op["state"] in ("pending", "running", "succeeded"), op
    assert sb["state"] in ("creating", "running"), sb
    if sb["state"] == "creating":
        assert sb["current_operation_id"] == op["id"], sb
    assert sb["tenant_id"], sb
    assert sb["template"] in ("base", "base:latest"), sb
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", sb["template_digest"]), sb["template_digest"]
    assert sb["runtime"] == sbxd.runtime, sb
    assert sb["resources"] == {"vcpu": None, "memory_mib": None, "disk_mib": None}, \
        f"omitted resources must be null: {sb['resources']}"
    eff = sb["effective_resources"]
    assert (eff["vcpu"], eff["memory_mib"], eff["disk_mib"]) == (1, 512, 1024), eff
    assert isinstance(eff["pids"], int) and eff["pids"] > 0, eff
    assert sb["egress_profile"] == "none" and sb["env"] == {} and sb["labels"] == {}, sb
    assert sb["timeout_s"] is None and sb["error"] is None, sb
    check_timestamps(sb, "created_at", "updated_at")
    check_timestamps(op, "created_at", "updated_at")

    op = api.wait_operation(op["id"], timeout=120)
    assert op["state"] == "succeeded" and op["error"] is None, op
    # A create served from the warm pool is already done in the 202 and says so.
    warm = created["operation"]["state"] == "succeeded"
    assert op["result"] == ({"warm_pool": True} if warm else None), op
    if warm:
        assert created["sandbox"]["state"] == "running", created["sandbox"]
        assert created["sandbox"]["current_operation_id"] is None, created["sandbox"]
    check_timestamps(op, "completed_at")
    sb = api.get_sandbox(sb["id"])
    assert sb["state"] == "running" and sb["current_operation_id"] is None, sb
    assert sb["id"] in [s["id"] for s in api.list_sandboxes()], "running sandbox missing from the list"

    session = api.create_session(sb["id"], ["python3", "-c", "print('hello from sbx')"])
    sid = session["session_id"]
    assert ID_RE["ses"].match(sid), session
    assert session["sandbox_id"] == sb["id"] and session["state"] == "created", session
    assert session["attach"]["url"] == f"/v1/sessions/{sid}/attach", session
    assert isinstance(session["attach"]["token"], str) and len(session["attach"]["token"]) >= 16, session
    assert session["attach"]["token"] != api.token
    check_timestamps(session["attach"], "expires_at")

    with api.attach(session) as stream:
        result = api.collect(stream)
    assert result.stdout == GREETING, result.stdout
    assert result.stderr == b"", result.stderr
    assert result.exit == {"exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False}, result.exit
    assert result.events[-1].event == "process_exited"

    info = api.get_session(sid)
    assert info["state"] == "exited" and info["exit_code"] == 0 and info["signal"] is None, info
    assert info["argv"] == ["python3", "-c", "print('hello from sbx')"], info
    check_timestamps(info, "created_at", "started_at", "exited_at")

    del_op = api.delete_sandbox(sb["id"], wait=False)
    assert ID_RE["op"].match(del_op["id"]) and del_op["kind"] == "delete" and del_op["sandbox_id"] == sb["id"], del_op
    del_op = api.wait_operation(del_op["id"])
    assert del_op["state"] == "succeeded" and del_op["error"] is None, del_op
    sb = api.get_sandbox(sb["id"])
    assert sb["state"] == "deleted", sb
    assert sb["id"] not in [s["id"] for s in api.list_sandboxes()], "deleted sandbox still in the default list"
    assert sb["id"] in [s["id"] for s in api.list_sandboxes(state="deleted")], "deleted sandbox not in ?state=deleted"
    # Deleting again returns the same delete operation.
    again = api.delete_sandbox(sb["id"], wait=False)
    assert again["id"] == del_op["id"], \
        f"deleting a deleted sandbox must return its delete operation again: got {again}, first {del_op}"


def _strings(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


def _keys(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}".lstrip("."), k, v
            yield from _keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _keys(v, f"{path}[{i}]")


def test_first_sandbox_example(api, sbxd, tmp_path):
    script = REPO / "examples" / "first_sandbox.py"
    assert script.is_file(), f"{script} is missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(SBX_URL=sbxd.url, SBX_TOKEN=sbxd.token, TMPDIR=str(tmp_path), HOME=str(tmp_path),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=180)
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    report = f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"

    # The run directory the example printed holds state.json. Its sandbox is handed to the
    # api fixture's cleanup before anything is asserted, so a failed run leaves nothing behind.
    candidates = [Path(m) for m in re.findall(r"(/[^\s'\"]+)", out + "\n" + err)]
    run_dirs = [p for p in candidates if (p / "state.json").is_file()]
    run_dirs += [p.parent for p in candidates if p.name == "state.json" and p.is_file()]
    run_dirs += [p.parent for p in tmp_path.rglob("state.json")]
    state, sandbox_ids, strings = {}, [], []
    if run_dirs:
        run_dir = run_dirs[0]
        state = json.loads((run_dir / "state.json").read_text())
        strings = list(_strings(state))
        sandbox_ids = sorted({s for s in strings if ID_RE["sbx"].match(s)})
        for sid in sandbox_ids:
            if sid not in api.created_sandboxes:
                api.created_sandboxes.append(sid)

    assert proc.returncode == 0, report
    assert "hello from sbx" in out, report
    assert sbxd.token not in out and sbxd.token not in err, "the example printed the bearer token"
    assert run_dirs, f"no run directory with state.json found in the example's output\n{report}"
    assert sandbox_ids, f"state.json keeps no sandbox id: {state}"
    assert any(ID_RE["op"].match(s) for s in strings), f"state.json keeps no operation id: {state}"
    assert any(ID_RE["ses"].match(s) for s in strings), f"state.json keeps no session id: {state}"
    idem = [(p, v) for p, k, v in _keys(state) if "idempotency" in k.lower()]
    assert idem and any(isinstance(v, (str, dict)) and v for _, v in idem), \
        f"state.json keeps no idempotency keys: {state}"
    for p, k, v in _keys(state):
        assert not (k.lower() in ("token", "authorization", "admin_token", "api_token") and isinstance(v, str) and v), \
            f"state.json stores a token at {p}"
    for f in run_dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert sbxd.token.encode() not in data, f"{f} contains the bearer token"

    # What the example recorded matches what the server says.
    assert state.get("outcome") == "succeeded", state
    assert sandbox_ids == [state["sandbox_id"]], (sandbox_ids, state)
    keys = [state[k]["idempotency_key"] for k in ("create", "session", "delete")]
    assert all(isinstance(k, str) and k for k in keys) and len(set(keys)) == 3, \
        f"each mutation needs its own idempotency key: {keys}"
    assert state["create"]["request"] == {"template": "base",
                                          "resources": {"vcpu": 1, "memory_mib": 512, "disk_mib": 1024}}, state
    sb = api.get_sandbox(state["sandbox_id"])
    assert sb["state"] == "deleted", f"the example must delete its sandbox: {sb}"
    assert sb["resources"] == {"vcpu": 1, "memory_mib": 512, "disk_mib": 1024}, sb
    create_op = api.get_operation(state["create"]["operation_id"])
    delete_op = api.get_operation(state["delete"]["operation_id"])
    assert (create_op["kind"], create_op["state"]) == ("create", "succeeded"), create_op
    assert (delete_op["kind"], delete_op["state"]) == ("delete", "succeeded"), delete_op
    session = api.get_session(state["session"]["session_id"])
    assert session["state"] == "exited" and session["exit_code"] == 0, session
    assert session["argv"] == ["python3", "-c", "print('hello from sbx')"], session
    assert (run_dir / "stdout.txt").read_bytes() == GREETING

    # `inspect RUN_DIR` reports the same objects, again without the token.
    proc = subprocess.run([sys.executable, str(script), "inspect", str(run_dir)], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    report = json.loads(proc.stdout)
    assert report["sandbox"]["id"] == state["sandbox_id"] and report["sandbox"]["state"] == "deleted", report
    assert sbxd.token not in proc.stdout.decode() + proc.stderr.decode()

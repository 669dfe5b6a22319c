"""When a sandbox's agent dies anyway (a kernel bug, the host's OOM killer: nothing the guest
does can end it, tests/security/test_agent.py), sbxd notices within a tick of its timers, not
only when a client asks: the sandbox becomes `failed` with the reason, its sessions end with a
clear error, and it deletes cleanly. The agent is killed here from the host, as the host's OOM
killer would."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import hostcheck
from conftest import not_applicable_on_fake_runtime
from sbx_client import check_error_body


def agent_pid(sandbox_id: str) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"sbx-agent") and b"--sandbox-id" in argv:
            i = argv.index(b"--sandbox-id")
            if i + 1 < len(argv) and argv[i + 1] == sandbox_id.encode():
                return int(entry)
    raise AssertionError(f"no sbx-agent process for {sandbox_id}")


def wait_for_log(sbxd, needle: str, timeout: float) -> bool:
    """Whether sbxd logged `needle` within `timeout` (polled; the log is sbxd's own stdout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in sbxd.log_path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


def test_dead_agent_fails_the_sandbox_without_a_client_asking(api, sbxd):
    not_applicable_on_fake_runtime("its agent is an ordinary host process that sbxd does not watch")
    sb = api.create_sandbox({"labels": {"e2e": "agent-lost"}})["sandbox"]
    sid = sb["id"]
    session = api.create_session(sid, ["sh", "-c", "echo up; exec sleep 300"])
    idle = api.create_session(sid, ["true"])  # created, never attached
    events = []
    stream = api.attach(session)
    it = stream.events()
    first = next(it)
    assert first.event == "stdout", first

    def reader():
        for ev in it:
            events.append(ev)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    before = hostcheck.leftovers(sid, sbxd.state_dir)
    assert before.get("processes"), before
    os.kill(agent_pid(sid), signal.SIGKILL)

    # No request about this sandbox until sbxd has said it on its own (timers: 1 s ticks).
    assert wait_for_log(sbxd, f"sandbox {sid}: agent lost", timeout=15), sbxd.log_tail(40)
    got = api.get_sandbox(sid)
    assert got["state"] == "failed", got
    assert got["error"]["code"] == "agent_lost", got["error"]
    assert "killed by SIGKILL" in got["error"]["message"], got["error"]

    # The attached client got a clear error, not a silent end.
    t.join(15)
    assert not t.is_alive(), "the attach stream stayed open after the agent died"
    stream.close()
    errors = [e for e in events if e.event == "error"]
    assert errors and errors[-1].data["code"] == "sandbox_failed", [(e.event, e.data) for e in events]

    for s, signal_name in ((session, "SIGKILL"), (idle, None)):
        view = api.call("GET", f"/v1/sessions/{s['session_id']}", expect=200).body
        assert view["state"] == "exited" and view["signal"] == signal_name, view
        assert view["error"]["code"] == "sandbox_failed", view

    resp = api.call("POST", f"/v1/sandboxes/{sid}/sessions", json_body={"argv": ["true"]}, expect=None)
    assert resp.status_code == 409, resp.body
    check_error_body(resp, resp.body, "sandbox_not_running")
    resp = api.call("GET", f"/v1/sessions/{session['session_id']}/attach", expect=None)
    assert resp.status_code == 409, resp.body
    check_error_body(resp, resp.body, "sandbox_not_running")
    assert "failed" in resp.body["error"]["message"], resp.body

    op = api.delete_sandbox(sid, timeout=60)
    assert op["state"] == "succeeded", op
    gone = hostcheck.leftovers_after_delete(sid, sbxd.state_dir)
    assert not gone, f"left on the host after deleting a sandbox whose agent died: {gone}"


def test_dead_agent_of_a_paused_sandbox(api, sbxd):
    not_applicable_on_fake_runtime("its agent is an ordinary host process that sbxd does not watch")
    sb = api.create_sandbox({"labels": {"e2e": "agent-lost-paused"}})["sandbox"]
    sid = sb["id"]
    op = api.call("POST", f"/v1/sandboxes/{sid}/pause", expect=202).body["operation"]
    assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded"
    os.kill(agent_pid(sid), signal.SIGKILL)
    assert wait_for_log(sbxd, f"sandbox {sid}: agent lost", timeout=15), sbxd.log_tail(40)
    got = api.get_sandbox(sid)
    assert got["state"] == "failed" and got["error"]["code"] == "agent_lost", got
    resp = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=None)
    assert resp.status_code == 409, resp.body
    op = api.delete_sandbox(sid, timeout=60)
    assert op["state"] == "succeeded", op
    assert not hostcheck.leftovers_after_delete(sid, sbxd.state_dir)

"""Server-side timers: a sandbox's TTL (timeout_s) deletes it, idle_suspend_s suspends it.

Both run in sbxd whether or not a client is connected. The idle test watches the sandbox through
the list endpoint only, because a GET on the sandbox itself counts as activity."""
import time
import uuid

import pytest


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def test_ttl_deletes_the_sandbox_and_says_so(api):
    # Not waiting for "running": on a loaded machine the create alone can outlast a short TTL.
    created = api.create_sandbox({"timeout_s": 3}, wait=False)
    sb = created["sandbox"]
    assert sb["timeout_s"] == 3
    assert sb["expires_at"] is not None and sb["expires_at"] > sb["created_at"], sb
    _wait(lambda: api.get_sandbox(sb["id"])["state"] == "deleted", 20, "the TTL delete")
    # DELETE of a deleted sandbox answers with the operation that deleted it.
    op = api.call("DELETE", f"/v1/sandboxes/{sb['id']}", expect=202).body["operation"]
    assert op["kind"] == "delete" and op["state"] == "succeeded", op
    assert op["initiator"] == "ttl", op


def test_no_ttl_by_default(api, sandbox):
    assert sandbox["timeout_s"] is None and sandbox["expires_at"] is None, sandbox
    assert sandbox["idle_suspend_s"] == 6 * 3600, sandbox


def test_idle_sandbox_is_suspended_and_wakes(api):
    tag = uuid.uuid4().hex[:12]
    sb = api.create_sandbox({"idle_suspend_s": 2, "labels": {"idle_test": tag}})["sandbox"]
    sid = sb["id"]

    def listed_state():
        items = api.list_sandboxes(label=f"idle_test={tag}")
        return items[0]["state"] if items else None

    _wait(lambda: listed_state() == "suspended", 30, "the idle suspension")
    api.call("POST", f"/v1/sandboxes/{sid}/wake", json_body={}, expect=202)
    _wait(lambda: listed_state() == "running", 30, "the wake")
    result = api.run(sid, ["sh", "-c", "echo awake"])
    assert result.stdout == b"awake\n", result


def test_running_session_keeps_the_sandbox_awake(api):
    tag = uuid.uuid4().hex[:12]
    sb = api.create_sandbox({"idle_suspend_s": 1, "labels": {"idle_test": tag}})["sandbox"]
    # A session that runs for 4 s with nobody attached after the start.
    ses = api.create_session(sb["id"], ["sleep", "4"])
    stream = api.attach(ses)
    stream.close()
    seen = set()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        items = api.list_sandboxes(label=f"idle_test={tag}")
        seen.add(items[0]["state"])
        time.sleep(0.2)
    assert seen == {"running"}, f"suspended while a session process was running: {seen}"

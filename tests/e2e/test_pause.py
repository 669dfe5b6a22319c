"""Pause, suspend and wake: POST /v1/sandboxes/{id}/pause|suspend|wake."""

import base64
import secrets
import threading
import time

import pytest

import hostcheck
from sbx_client import check_error_body


def lifecycle(api, sandbox_id: str, kind: str, *, key: str | None = None, expect=202):
    headers = {"Idempotency-Key": key} if key else None
    return api.call("POST", f"/v1/sandboxes/{sandbox_id}/{kind}", headers=headers, expect=expect)


def do(api, sandbox_id: str, kind: str) -> dict:
    """Starts the operation, waits for it, checks it succeeded; returns it."""
    op = lifecycle(api, sandbox_id, kind).body["operation"]
    assert op["kind"] == kind and op["sandbox_id"] == sandbox_id, op
    assert op["state"] in ("pending", "running", "succeeded"), op
    op = api.wait_operation(op["id"], timeout=60)
    assert op["state"] == "succeeded", op
    assert op["error"] is None, op
    if kind == "suspend":
        # What happened to the memory (docs/api.md): the ns runtime freezes in place.
        res = op["result"]
        assert res["memory_preserved"] is True and isinstance(res["memory_released"], bool), op
        assert res["memory"], op
        if res["memory_released"]:
            assert res["snapshot_bytes"] > 0, op
        else:
            assert "snapshot_bytes" not in res, op
    else:
        assert op["result"] is None, op
    return op


def expect_error(resp, status: int, code: str):
    assert resp.status_code == status, f"expected {status} {code}, got {resp.status_code}: {resp.body}"
    check_error_body(resp, resp.body, code)


def test_pause_blocks_new_sessions_until_wake(api, sandbox, metrics):
    sid = sandbox["id"]
    t0 = time.monotonic()
    do(api, sid, "pause")
    t1 = time.monotonic()
    assert api.get_sandbox(sid)["state"] == "paused"
    assert api.get_sandbox(sid)["current_operation_id"] is None

    resp = api.call("POST", f"/v1/sandboxes/{sid}/sessions", json_body={"argv": ["true"]})
    expect_error(resp, 409, "sandbox_not_running")
    assert "paused" in resp.body["error"]["message"], resp.body

    t2 = time.monotonic()
    do(api, sid, "wake")
    t3 = time.monotonic()
    assert api.get_sandbox(sid)["state"] == "running"
    r = api.run(sid, ["sh", "-c", "echo awake"])
    assert r.stdout == b"awake\n" and r.exit["exit_code"] == 0, r
    metrics.append(f"pause: {1000 * (t1 - t0):.1f} ms, wake: {1000 * (t3 - t2):.1f} ms "
                   "(API request to operation succeeded, polled; informational)")


def test_suspend_then_wake(api, sandbox):
    sid = sandbox["id"]
    do(api, sid, "suspend")
    assert api.get_sandbox(sid)["state"] == "suspended"
    listed = {s["id"]: s["state"] for s in api.list_sandboxes(state="suspended")}
    assert listed.get(sid) == "suspended", listed
    expect_error(api.call("POST", f"/v1/sandboxes/{sid}/sessions", json_body={"argv": ["true"]}),
                 409, "sandbox_not_running")
    do(api, sid, "wake")
    assert api.get_sandbox(sid)["state"] == "running"
    assert api.run(sid, ["echo", "back"]).stdout == b"back\n"


def test_attach_stream_survives_pause(api, sandbox):
    sid = sandbox["id"]
    session = api.create_session(sid, ["sh", "-c", "for i in $(seq 1 30); do echo $i; sleep 0.1; done"])
    stream = api.attach(session, timeout=120)
    arrivals: list[tuple[float, str, object]] = []  # (time, event, data)
    failure: list[BaseException] = []

    def reader():
        try:
            for ev in stream.events():
                arrivals.append((time.monotonic(), ev.event, ev.data))
                if ev.event == "process_exited":
                    return
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failure.append(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not any(e == "stdout" for _, e, _ in arrivals):
        assert time.monotonic() < deadline and t.is_alive(), f"no output: {arrivals} {failure}"
        time.sleep(0.02)

    do(api, sid, "pause")
    paused_at = time.monotonic()
    time.sleep(1.5)
    during = [a for a in arrivals if paused_at + 0.3 < a[0]]
    woke_at = time.monotonic()
    do(api, sid, "wake")
    t.join(60)
    stream.close()
    assert not failure, failure
    assert not t.is_alive(), "the attach stream did not end after wake"
    assert not during, f"output arrived while the sandbox was paused: {during}"

    out = b"".join(base64.b64decode(d["data_b64"]) for _, e, d in arrivals if e == "stdout")
    assert out == b"".join(f"{i}\n".encode() for i in range(1, 31)), out
    exits = [d for _, e, d in arrivals if e == "process_exited"]
    assert exits and exits[0]["exit_code"] == 0, arrivals[-3:]
    assert not [a for a in arrivals if a[1] in ("error", "resync_required")], arrivals
    assert any(a[0] > woke_at for a in arrivals if a[1] == "stdout"), "nothing arrived after wake"


def test_invalid_state_transitions(api, sandbox):
    sid = sandbox["id"]
    resp = lifecycle(api, sid, "wake", expect=None)
    expect_error(resp, 409, "invalid_state")
    assert "running" in resp.body["error"]["message"], resp.body

    do(api, sid, "pause")
    for kind in ("pause", "suspend"):
        resp = lifecycle(api, sid, kind, expect=None)
        expect_error(resp, 409, "invalid_state")
        assert "paused" in resp.body["error"]["message"], resp.body
    do(api, sid, "wake")
    assert api.get_sandbox(sid)["state"] == "running"


def test_lifecycle_on_sandbox_being_created(api):
    created = api.create_sandbox({}, wait=False)
    sid, create_op = created["sandbox"]["id"], created["operation"]
    resp = lifecycle(api, sid, "pause", expect=None)
    if resp.status_code == 409:
        # The create was still in flight (the usual case).
        check_error_body(resp, resp.body, resp.body["error"]["code"])
        assert resp.body["error"]["code"] in ("operation_in_progress", "invalid_state"), resp.body
        if resp.body["error"]["code"] == "operation_in_progress":
            assert resp.body["error"]["details"]["operation_id"] == create_op["id"], resp.body
    else:
        assert resp.status_code == 202, resp.body  # the create had finished already
        assert api.wait_operation(resp.body["operation"]["id"])["state"] == "succeeded"
    assert api.wait_operation(create_op["id"])["state"] == "succeeded"


def test_delete_while_paused_leaves_nothing(api, sbxd):
    sb = api.create_sandbox({"labels": {"e2e": "pause-delete"}})["sandbox"]
    sid = sb["id"]
    session = api.create_session(sid, ["sh", "-c", "sleep 1000 & echo started; while :; do :; done"])
    stream = api.attach(session)
    first = next(stream.events())
    assert first.event == "stdout", first
    stream.close()
    before = hostcheck.leftovers(sid, sbxd.state_dir) if sbxd.runtime != "fake" else {}
    do(api, sid, "pause")
    assert api.get_sandbox(sid)["state"] == "paused"

    op = api.delete_sandbox(sid, timeout=60)
    assert op["state"] == "succeeded", op
    assert api.get_sandbox(sid)["state"] == "deleted"
    if sbxd.runtime == "fake":
        return
    assert before.get("processes"), f"no host process found for {sid} before the delete: {before}"
    after = hostcheck.leftovers_after_delete(sid, sbxd.state_dir)
    assert not after, f"left on the host after deleting a paused sandbox: {after}"


def test_delete_wins_over_pause(api, sandbox):
    sid = sandbox["id"]
    pause = lifecycle(api, sid, "pause").body["operation"]
    delete = api.delete_sandbox(sid, wait=False)
    # Another lifecycle call now conflicts with the delete.
    resp = lifecycle(api, sid, "wake", expect=None)
    assert resp.status_code == 409, resp.body
    assert resp.body["error"]["code"] in ("operation_in_progress", "invalid_state"), resp.body
    assert api.wait_operation(delete["id"])["state"] == "succeeded"
    assert api.wait_operation(pause["id"])["state"] in ("succeeded", "failed")
    assert api.get_sandbox(sid)["state"] == "deleted"


def test_idempotency_key_replay(api, sandbox):
    sid = sandbox["id"]
    k = "e2e-" + secrets.token_hex(12)
    first = lifecycle(api, sid, "pause", key=k)
    second = lifecycle(api, sid, "pause", key=k)
    assert second.headers.get("Idempotent-Replayed") == "true", dict(second.headers)
    assert second.body["operation"]["id"] == first.body["operation"]["id"]
    assert api.wait_operation(first.body["operation"]["id"])["state"] == "succeeded"
    # After completion the key still replays (not a second pause, which would be 409).
    third = lifecycle(api, sid, "pause", key=k)
    assert third.body["operation"]["id"] == first.body["operation"]["id"]
    # The same key on another route is another scope.
    wake = lifecycle(api, sid, "wake", key=k)
    assert wake.body["operation"]["id"] != first.body["operation"]["id"]
    assert api.wait_operation(wake.body["operation"]["id"])["state"] == "succeeded"
    assert api.get_sandbox(sid)["state"] == "running"


def test_unknown_and_malformed(api):
    unknown = "sbx_" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz234567") for _ in range(20))
    for kind in ("pause", "suspend", "wake"):
        resp = api.call("POST", f"/v1/sandboxes/{unknown}/{kind}")
        expect_error(resp, 404, "not_found")
        resp = api.call("POST", f"/v1/sandboxes/not-an-id/{kind}")
        expect_error(resp, 400, "invalid_argument")
        resp = api.call("GET", f"/v1/sandboxes/{unknown}/{kind}", validate=False)
        expect_error(resp, 405, "method_not_allowed")
        resp = api.call("POST", f"/v1/sandboxes/{unknown}/{kind}", json_body={"force": True})
        expect_error(resp, 400, "invalid_argument")
        assert resp.body["error"]["details"]["field"] == "force", resp.body


def test_body_may_be_empty_object(api, sandbox):
    sid = sandbox["id"]
    op = api.call("POST", f"/v1/sandboxes/{sid}/pause", json_body={}, expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", json_body={}, expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"

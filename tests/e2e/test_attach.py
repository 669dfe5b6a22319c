"""Attach streams: re-attach, replay, tokens, session lifecycle."""

import base64
import threading
import time

from sbx_client import SseStream, check_error_body

COUNTER = (
    "import os, time\n"
    "print('pid', os.getpid(), flush=True)\n"
    "for i in range(40):\n"
    "    print('line', i, flush=True)\n"
    "    time.sleep(0.05)\n"
)


def test_reattach_after_disconnect(api, sandbox):
    session = api.create_session(sandbox["id"], ["python3", "-c", COUNTER])
    sid = session["session_id"]
    stream = api.attach(session)
    seen, stdout = [], bytearray()
    for ev in stream.events():
        seen.append(ev)
        assert ev.event == "stdout", f"unexpected early event {ev}"
        assert ev.data["offset"] == len(stdout), ev
        stdout += base64.b64decode(ev.data["data_b64"])
        if stdout.count(b"\n") >= 4:
            break
    stream.close()  # disconnect mid-stream
    assert stdout.count(b"\n") >= 4, f"stream ended early: {seen}"
    ids = [e.id for e in seen]
    assert ids == list(range(ids[0], ids[0] + len(ids))), f"ids not consecutive: {ids}"
    last_id = ids[-1]

    time.sleep(0.3)
    info = api.get_session(sid)
    assert info["state"] == "running", f"a disconnect must not stop the process: {info}"

    with api.attach(session, last_event_id=last_id) as s2:
        rest = api.collect(s2, first_id=last_id + 1, stdout_offset=len(stdout))
    assert rest.events and rest.events[0].id == last_id + 1, [e.id for e in rest.events][:3]
    assert rest.exit == {"exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False}, rest.exit
    full = bytes(stdout) + rest.stdout
    lines = full.decode().splitlines()
    assert lines[0].startswith("pid "), lines[:2]
    assert sum(1 for l in lines if l.startswith("pid ")) == 1, f"process restarted: {lines}"
    assert lines[1:] == [f"line {i}" for i in range(40)], f"gap or duplicate in the continuation: {lines}"

    # Without Last-Event-ID: a replay from the start, same ids, same bytes, same pid.
    with api.attach(session) as s3:
        replay = api.collect(s3, first_id=ids[0])
    assert replay.stdout == full, "replay differs from what was streamed live"
    assert [(e.id, e.event, e.data) for e in replay.events[:len(seen)]] == \
        [(e.id, e.event, e.data) for e in seen], "replayed events differ from the live ones"
    assert replay.exit == rest.exit

    # Last-Event-ID as a query parameter and the attach token in ?token= work the same.
    with api.attach(session, last_event_id=last_id, query_last_event_id=True, query_token=True) as s4:
        r4 = api.collect(s4, first_id=last_id + 1, stdout_offset=len(stdout))
    assert r4.stdout == rest.stdout and r4.exit == rest.exit

    info = api.get_session(sid)
    assert info["state"] == "exited" and info["exit_code"] == 0, info


def test_attach_after_exit_replays(api, sandbox):
    first = api.run(sandbox["id"], ["sh", "-c", "echo one; echo two >&2; exit 5"])
    assert first.exit["exit_code"] == 5
    with api.attach(first.session) as stream:
        again = api.collect(stream, first_id=first.events[0].id)
    assert (again.stdout, again.stderr, again.exit) == (first.stdout, first.stderr, first.exit)
    assert [e.id for e in again.events] == [e.id for e in first.events]


def test_attach_with_management_token(api, sandbox):
    session = api.create_session(sandbox["id"], ["echo", "mgmt"])
    with api.attach(session["session_id"]) as stream:  # by id, admin token
        result = api.collect(stream)
    assert result.stdout == b"mgmt\n" and result.exit["exit_code"] == 0


def test_attach_token_scope(api, sandbox):
    a = api.create_session(sandbox["id"], ["echo", "a"])
    b = api.create_session(sandbox["id"], ["echo", "b"])
    token_a = a["attach"]["token"]
    # Another session's attach token, a garbage token, no token: 401, and nothing starts.
    for tok in (token_a, "garbage-token", None):
        resp = api.call("GET", f"/v1/sessions/{b['session_id']}/attach", token=tok,
                        headers={"Accept": "text/event-stream"})
        assert resp.status_code == 401, f"token {tok!r} on another session: {resp.status_code}"
        check_error_body(resp, resp.body, "unauthenticated")
    # An attach token is not a management token.
    for method, path in (("GET", "/v1/sandboxes"), ("GET", f"/v1/sessions/{a['session_id']}"),
                         ("GET", f"/v1/sandboxes/{sandbox['id']}")):
        resp = api.call(method, path, token=token_a)
        assert resp.status_code == 401, f"attach token accepted on {method} {path}"
    assert api.get_session(b["session_id"])["state"] == "created", "a rejected attach started the process"
    with api.attach(a) as stream:
        assert api.collect(stream).stdout == b"a\n"
    with api.attach(b) as stream:
        assert api.collect(stream).stdout == b"b\n"


def test_session_lifecycle(api, sandbox):
    session = api.create_session(sandbox["id"], ["sh", "-c", "sleep 0.3; exit 3"])
    sid = session["session_id"]
    info = api.get_session(sid)
    assert info["id"] == sid and info["sandbox_id"] == sandbox["id"], info
    assert info["state"] == "created", f"creating a session must not start it: {info}"
    assert info["exit_code"] is None and info["signal"] is None and info["started_at"] is None \
        and info["exited_at"] is None, info
    assert info["timed_out"] is False and info["oom_killed"] is False, info
    assert info["argv"] == ["sh", "-c", "sleep 0.3; exit 3"] and info["cwd"] == "/" and info["user"] == "root", info
    time.sleep(0.5)
    assert api.get_session(sid)["state"] == "created", "the process started without an attach"

    stream = api.attach(session)
    # The first attach starts the process: the session turns running before it exits.
    running_seen = False
    for _ in range(20):
        st = api.get_session(sid)["state"]
        if st == "running":
            running_seen = True
            break
        if st == "exited":
            break
        time.sleep(0.01)
    assert running_seen, "session never reported running while its process slept"
    result = api.collect(stream)
    assert result.exit["exit_code"] == 3, result.exit
    info = api.get_session(sid)
    assert info["state"] == "exited" and info["exit_code"] == 3 and info["signal"] is None, info
    assert info["started_at"] and info["exited_at"] and info["started_at"] <= info["exited_at"], info


def test_session_on_deleted_sandbox(api):
    sb = api.create_sandbox({"labels": {"e2e": "deleted-session"}})["sandbox"]
    pending = api.create_session(sb["id"], ["echo", "never"])
    op = api.delete_sandbox(sb["id"])
    assert op["state"] == "succeeded", op
    resp = api.call("POST", f"/v1/sandboxes/{sb['id']}/sessions", json_body={"argv": ["true"]}, expect=409)
    check_error_body(resp, resp.body, "sandbox_not_running")
    # Attaching to a never-started session of a deleted sandbox must not run it: either an
    # HTTP error or a stream that reports `error` and ends.
    resp = api.call("GET", pending["attach"]["url"], token=pending["attach"]["token"],
                    headers={"Accept": "text/event-stream"}, stream=True, timeout=30)
    if resp.status_code == 200:
        result = api.collect(SseStream(resp, api.validator), max_seconds=30)
        kinds = [e.event for e in result.events]
        assert result.stdout == b"", f"a session ran in a deleted sandbox: {kinds}"
        assert kinds and kinds[-1] == "error", f"expected a final error event, got {kinds}"
    else:
        assert resp.status_code in (404, 409, 410), resp.status_code
        check_error_body(resp, resp.body)


def test_delete_while_attached(api):
    sb = api.create_sandbox({"labels": {"e2e": "delete-attached"}})["sandbox"]
    session = api.create_session(sb["id"], ["sh", "-c", "echo started; sleep 300"])
    stream = api.attach(session)
    events = stream.events()
    first = next(events)
    assert first.event == "stdout" and base64.b64decode(first.data["data_b64"]) == b"started\n", first
    rest, errors = [], []

    def reader():
        try:
            for ev in events:
                rest.append(ev)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    op = api.delete_sandbox(sb["id"], wait=False)
    t.join(30)
    ended = not t.is_alive()
    stream.close()
    assert ended, f"attach stream still open 30s after DELETE (events: {[e.event for e in rest]})"
    op = api.wait_operation(op["id"])
    assert op["state"] == "succeeded", op
    assert not errors, f"attach stream broke instead of ending cleanly: {errors}"
    kinds = [e.event for e in rest]
    assert kinds and kinds[-1] in ("error", "process_exited"), f"stream ended without error/process_exited: {kinds}"
    if kinds[-1] == "process_exited":
        assert rest[-1].data["signal"] == "SIGKILL", rest[-1].data

"""Deeply nested JSON (issue 13, finding 1): one WebSocket control message of 400,000 '[' used
to end sbxd (a recursive dump() of the parsed message overflowed the stack). Every route that
takes JSON, and both kinds of WebSocket control message that carry values, must refuse such a
text up front (400, or an error message and a policy-violation close) and leave sbxd serving."""

from __future__ import annotations

import json
import struct

import pytest

from sbx_client import check_error_body
from ws_client import OP_CLOSE, OP_TEXT, WsClient

LEVELS = 400_000  # 781 KiB with the prefix: under the 1 MiB message and body limits
CLOSE_POLICY_VIOLATION = 1008


def deep(levels: int = LEVELS) -> str:
    return "[" * levels + "]" * levels


def deep_objects(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def assert_serving(api, sbxd, sandbox_id: str) -> None:
    assert sbxd.proc.poll() is None, f"sbxd exited with {sbxd.proc.returncode}:\n{sbxd.log_tail()}"
    api.call("GET", "/healthz", token=None, expect=200)
    result = api.run(sandbox_id, ["sh", "-c", "echo still-serving"])
    assert result.stdout == b"still-serving\n", result
    assert result.exit["exit_code"] == 0, result.exit


def ws_refuses(api, sid: str, text: str) -> None:
    """Sends `text` as one text frame; expects an error message, then a 1008 close."""
    ws = WsClient(api.base_url, f"/v1/sessions/{sid}/ws", api.token, timeout=60)
    try:
        ws.send_frame(OP_TEXT, text.encode())
        errors = []
        while True:
            op, payload = ws.recv()  # ConnectionError here: sbxd went away without a close
            if op == OP_TEXT:
                msg = json.loads(payload)
                if msg["type"] == "error":
                    errors.append(msg)
            elif op == OP_CLOSE:
                break
        assert len(payload) >= 2, f"close without a code: {payload!r}"
        code = struct.unpack("!H", payload[:2])[0]
        assert code == CLOSE_POLICY_VIOLATION, (code, payload)
        assert len(errors) == 1, errors
        assert errors[0]["code"] == "invalid_argument", errors
        assert "deeper than 64" in errors[0]["message"], errors
    finally:
        ws.close()


@pytest.mark.parametrize("kind", ["resize", "signal"])
def test_websocket_deep_control_message_is_refused(api, sbxd, sandbox, kind):
    session = api.create_session(sandbox["id"], ["sleep", "100"], tty=kind == "resize")
    sid = session["session_id"]
    if kind == "resize":
        text = '{"type":"resize","cols":10,"rows":' + deep() + "}"
    else:
        text = '{"type":"signal","signal":' + deep() + "}"
    assert len(text) < 1 << 20
    ws_refuses(api, sid, text)
    # Objects nest the same way; and the session itself is unharmed by the refused message.
    ws_refuses(api, sid, '{"type":"' + kind + '","x":' + deep_objects(100_000) + "}")
    assert api.get_session(sid)["state"] == "running"
    api.call("POST", f"/v1/sessions/{sid}/signal", json_body={"signal": "KILL"}, expect=204)
    assert_serving(api, sbxd, sandbox["id"])


def test_websocket_shallow_bad_message_is_still_ignored(api, sbxd, sandbox):
    # The documented behaviour for a message that is merely wrong (an unknown type, a value of
    # the wrong type) stays: ignored, the connection stays up.
    session = api.create_session(sandbox["id"], ["sleep", "100"])
    ws = WsClient(api.base_url, f"/v1/sessions/{session['session_id']}/ws", api.token)
    try:
        ws.send_json({"type": "signal", "signal": [[[[1]]]]})
        ws.send_json({"type": "signal", "signal": "TERM"})
        while True:
            op, payload = ws.recv()
            if op == OP_TEXT and json.loads(payload)["type"] == "exit":
                assert json.loads(payload)["signal"] == "SIGTERM", payload
                break
            assert op != OP_CLOSE, payload
    finally:
        ws.close()


def _routes(sandbox_id: str, session_id: str):
    """(method, path, body text, content type) for every route that reads a JSON body."""
    d = deep()
    return [
        ("POST", "/v1/sandboxes", d, "application/json"),
        ("POST", "/v1/sandboxes", '{"template":' + d + "}", "application/json"),
        ("POST", "/v1/sandboxes", '{"labels":{"a":' + d + "}}", "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/pause", '{"x":' + d + "}", "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/suspend", d, "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/wake", d, "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/sessions", '{"argv":' + d + "}", "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/sessions", '{"argv":["true"],"tty":' + d + "}",
         "application/json"),
        ("POST", f"/v1/sessions/{session_id}/stdin", '{"data":' + d + "}", "application/json"),
        ("POST", f"/v1/sessions/{session_id}/stdin:close", d, "application/json"),
        ("POST", f"/v1/sessions/{session_id}/signal", '{"signal":' + d + "}", "application/json"),
        ("POST", f"/v1/sessions/{session_id}/resize", '{"rows":' + d + ',"cols":1}',
         "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/files:mkdir", '{"path":' + d + "}", "application/json"),
        ("POST", f"/v1/sandboxes/{sandbox_id}/files:move", '{"from":"/a","to":' + d + "}",
         "application/json"),
        # As objects, on two of them.
        ("POST", "/v1/sandboxes", deep_objects(150_000), "application/json"),
        ("POST", f"/v1/sessions/{session_id}/signal", deep_objects(150_000), "application/json"),
    ]


def test_every_json_route_refuses_deep_bodies(api, sbxd, sandbox):
    session = api.create_session(sandbox["id"], ["sleep", "100"], stdin=True, tty=True)
    sid = session["session_id"]
    api.attach(session).close()  # the first attach starts it
    failures = []
    for method, path, body, ctype in _routes(sandbox["id"], sid):
        assert len(body) < 1 << 20
        resp = api.call(method, path, data=body.encode(), headers={"Content-Type": ctype})
        if resp.status_code != 400:
            failures.append(f"{method} {path}: {resp.status_code} {str(resp.body)[:300]}")
            continue
        err = check_error_body(resp, resp.body, "invalid_argument")
        if "deeper than 64" not in err["message"]:
            failures.append(f"{method} {path}: not refused for its depth: {err['message']}")
        assert sbxd.proc.poll() is None, f"sbxd died on {method} {path}:\n{sbxd.log_tail()}"
    assert not failures, "\n".join(failures)
    # The sandbox was neither paused nor suspended by the refused calls, and the session runs.
    assert api.get_sandbox(sandbox["id"])["state"] == "running"
    assert api.get_session(sid)["state"] == "running"
    api.call("POST", f"/v1/sessions/{sid}/signal", json_body={"signal": "KILL"}, expect=204)
    assert_serving(api, sbxd, sandbox["id"])


def test_json_at_the_depth_limit_is_accepted(api, sandbox):
    # 64 levels is within the limit: refused for its content (argv must hold strings), not its
    # depth, so the limit is where the docs say.
    body = '{"argv":' + "[" * 63 + "]" * 63 + "}"
    resp = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", data=body.encode(),
                    headers={"Content-Type": "application/json"}, expect=400)
    err = check_error_body(resp, resp.body, "invalid_argument", "argv*")
    assert "deeper" not in err["message"], err
    body = '{"argv":' + "[" * 64 + "]" * 64 + "}"
    resp = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", data=body.encode(),
                    headers={"Content-Type": "application/json"}, expect=400)
    err = check_error_body(resp, resp.body, "invalid_argument")
    assert "deeper than 64" in err["message"], err

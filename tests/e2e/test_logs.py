"""sbxd's log (the session's sbxd runs with --log-format json, see conftest.py) and agent.log:
one JSON object per line, the context ids on the lines they belong to, and no secret in either.

Secrets that pass through sbxd here: the admin token (Authorization on every call), an attach
token (once in the query string, once as a bearer token), a wrong bearer token, a sandbox env
value, a session env value (both printed by the session, so they also travel as output), and a
value in the query string of an ordinary route.
"""

from __future__ import annotations

import json
import re
import secrets
import time

LISTEN_LINE = re.compile(r"^sbxd listening on http://\S+$")  # stdout, the only non-log line
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
LEVELS = {"trace", "debug", "info", "warn", "error", "critical"}
CONTEXT_KEYS = ("request_id", "tenant", "sandbox", "operation", "session")


def parse_log(path) -> list[dict]:
    """Every line of the file as JSON; fails on the first line that is not a log record."""
    records = []
    for n, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        if not raw:
            continue
        line = raw.decode("utf-8")  # the JSON format never writes invalid UTF-8
        if LISTEN_LINE.match(line):
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise AssertionError(f"{path}:{n} is not JSON ({e}): {line[:300]!r}") from None
        assert isinstance(rec, dict), f"{path}:{n}: not an object: {line[:300]!r}"
        assert TS.match(rec.get("ts", "")), f"{path}:{n}: bad ts: {line[:300]!r}"
        assert rec.get("level") in LEVELS, f"{path}:{n}: bad level: {line[:300]!r}"
        assert isinstance(rec.get("msg"), str), f"{path}:{n}: no msg: {line[:300]!r}"
        for k in CONTEXT_KEYS:
            # Context fields are left out when unknown, never written empty.
            assert k not in rec or (isinstance(rec[k], str) and rec[k]), f"{path}:{n}: {k}: {line[:300]!r}"
        records.append(rec)
    return records


def wait_for_record(path, pred, timeout=15.0) -> list[dict]:
    """The access line is written after the response is sent, and conftest copies the daemon's
    output into the file from a pipe: poll until the awaited record is there."""
    deadline = time.monotonic() + timeout
    while True:
        records = parse_log(path)
        if any(pred(r) for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"no matching record in {path} after {timeout}s; tail: {records[-10:]}")
        time.sleep(0.1)


def test_log_lines_are_json_with_context_and_no_secrets(api, sbxd):
    tag = secrets.token_hex(6)
    env_secret = "sbxenv-" + secrets.token_hex(16)
    session_secret = "sbxses-" + secrets.token_hex(16)
    query_secret = "sbxqry-" + secrets.token_hex(16)
    wrong_token = "sbxbad-" + secrets.token_hex(16)
    rid_create = f"e2e-logs-create-{tag}"
    rid_last = f"e2e-logs-last-{tag}"

    # Non-default resources: a create the warm pool cannot serve, so the operation runs.
    resp = api.call("POST", "/v1/sandboxes", expect=202, headers={"X-Request-Id": rid_create},
                    json_body={"env": {"LOG_SECRET": env_secret}, "labels": {"e2e": "logs"},
                               "resources": {"memory_mib": 256}})
    sb_id, op_id = resp.body["sandbox"]["id"], resp.body["operation"]["id"]
    with api._lock:
        api.created_sandboxes.append(sb_id)
    op = api.wait_operation(op_id)
    assert op["state"] == "succeeded", op

    session = api.create_session(sb_id, ["sh", "-c", 'echo "$LOG_SECRET $SESSION_SECRET"'],
                                 env={"SESSION_SECRET": session_secret})
    ses_id, attach_token = session["session_id"], session["attach"]["token"]
    with api.attach(session, query_token=True) as stream:  # GET ...attach?token=sat1...
        result = api.collect(stream)
    # The secrets did go through sbxd (as env, and back as output): their absence below means
    # something.
    assert result.stdout.decode() == f"{env_secret} {session_secret}\n", result.stdout
    with api.attach(session) as stream:  # Authorization: Bearer <attach token>
        api.collect(stream)
    api.call("GET", "/v1/sandboxes", params={"token": query_secret}, expect=200)
    api.call("GET", "/v1/sandboxes", token=wrong_token, expect=401)

    agent_log = sbxd.state_dir / "sandboxes" / sb_id / "agent.log"
    agent_raw = agent_log.read_bytes()  # before the delete removes it
    agent_records = parse_log(agent_log)

    api.delete_sandbox(sb_id)
    api.call("GET", "/healthz", token=None, headers={"X-Request-Id": rid_last}, expect=200)
    records = wait_for_record(sbxd.log_path, lambda r: r.get("request_id") == rid_last)

    # No secret anywhere, in any form the log could hold it.
    raw = sbxd.log_path.read_bytes() + b"\n" + agent_raw
    for name, value in (("admin token", sbxd.token), ("attach token", attach_token),
                        ("wrong bearer token", wrong_token), ("sandbox env value", env_secret),
                        ("session env value", session_secret), ("query string value", query_secret)):
        assert value.encode() not in raw, f"the {name} is in sbxd's log or agent.log"

    # One access line per request, with its request id and tenant, and never a query string.
    access = [r for r in records if "status" in r and "method" in r and "path" in r]
    assert access, "no access-log lines"
    for r in access:
        assert r.get("request_id"), f"access line without request_id: {r}"
        assert "?" not in r["path"] and "?" not in r["msg"], f"query string logged: {r}"
        assert isinstance(r["status"], int) and isinstance(r["duration_ms"], (int, float)), r
    created = [r for r in access if r["request_id"] == rid_create]
    assert len(created) == 1, created
    assert created[0]["method"] == "POST" and created[0]["path"] == "/v1/sandboxes"
    assert created[0]["status"] == 202 and created[0]["tenant"] == "default", created[0]
    attaches = [r for r in access if r["path"] == f"/v1/sessions/{ses_id}/attach"]
    assert len(attaches) == 2, attaches
    for r in attaches:
        assert r["status"] == 200 and r["session"] == ses_id and r["sandbox"] == sb_id, r
        assert r["tenant"] == "default", r
    unauthenticated = [r for r in access if r["status"] == 401 and r["path"] == "/v1/sandboxes"]
    assert unauthenticated and all("tenant" not in r for r in unauthenticated), unauthenticated

    # The create operation's lines, logged on a worker thread: operation, sandbox, tenant and the
    # request that asked for it, on every one of them. (Access lines of GET /v1/operations/{id}
    # name the operation too, with their own request ids.)
    op_lines = [r for r in records if r.get("operation") == op_id and "method" not in r]
    msgs = [r["msg"] for r in op_lines]
    assert any(m == "operation create started" for m in msgs), msgs
    finished = [r for r in op_lines if r["msg"].startswith("operation create succeeded in ")]
    assert len(finished) == 1, msgs
    assert finished[0]["result"] == "succeeded" and finished[0]["duration_ms"] >= 0, finished[0]
    assert any(r.get("from") == "creating" and r.get("to") == "running" for r in op_lines), msgs
    for r in op_lines:
        assert r.get("sandbox") == sb_id and r.get("tenant") == "default", r
        assert r.get("request_id") == rid_create, r
    # ... and the delete's.
    assert any(r.get("sandbox") == sb_id and r.get("msg", "").startswith("operation delete succeeded")
               and r.get("operation") for r in records), "no delete operation line"
    assert any(r.get("sandbox") == sb_id and r.get("to") == "deleted" for r in records)

    # agent.log: the same format, every line names the sandbox, a session's lines the session.
    assert agent_records, f"{agent_log} is empty"
    for r in agent_records:
        assert r["sandbox"] == sb_id, r
    started = [r for r in agent_records if r["msg"].startswith(f"session {ses_id} started")]
    assert len(started) == 1 and started[0].get("session") == ses_id, agent_records

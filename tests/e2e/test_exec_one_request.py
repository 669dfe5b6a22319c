"""A session created and streamed by one request: POST /v1/sandboxes/{id}/sessions?attach=true
(docs/api.md, "Create and attach in one request"). It must be what a create followed by its
first attach is (same events, same exit, same resume), make nothing when the request is bad,
and with an Idempotency-Key never start the process twice."""

import base64
import datetime
import json
import secrets
import socket
import subprocess
import urllib.parse

from sbx_client import SseStream, check_error_body
from test_attach_binary import BINARY, collect as collect_binary
from test_bad_input import fake_id
from test_pause import do
from test_sessions_io import _cli_env, _sbx_binary


def open_run(api, sandbox_id, argv, *, key=None, params=None, headers=None, expect=200, **fields):
    hdrs = dict(headers or {})
    if key:
        hdrs["Idempotency-Key"] = key
    p = {"attach": "true", **(params or {})}
    return api.call("POST", f"/v1/sandboxes/{sandbox_id}/sessions", json_body={"argv": argv, **fields},
                    params=p, headers=hdrs, stream=True, timeout=60, expect=expect)


def session_of(resp) -> str:
    sid = resp.headers.get("Sbx-Session-Id", "")
    assert sid.startswith("ses_"), resp.headers
    assert resp.headers.get("Location") == f"/v1/sessions/{sid}", resp.headers
    return sid


def test_one_request_runs_the_command_and_names_its_session(api, sandbox):
    resp = open_run(api, sandbox["id"], ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert resp.headers["Content-Type"].split(";")[0] == "text/event-stream", resp.headers
    assert "Idempotent-Replayed" not in resp.headers, resp.headers
    sid = session_of(resp)
    r = api.collect(SseStream(resp, api.validator), first_id=1)
    assert r.stdout == b"out\n" and r.stderr == b"err\n", r
    assert r.exit == {"exit_code": 3, "signal": None, "timed_out": False, "oom_killed": False}, r.exit
    info = api.get_session(sid)
    assert info["state"] == "exited" and info["exit_code"] == 3, info
    assert info["sandbox_id"] == sandbox["id"], info
    # The session is an ordinary one: a later attach replays the same events.
    with api.attach(sid) as again:
        replay = api.collect(again, first_id=1)
    assert (replay.stdout, replay.stderr, replay.exit) == (r.stdout, r.stderr, r.exit)


def test_one_request_takes_the_same_body_fields_as_a_create(api, sandbox):
    resp = open_run(api, sandbox["id"], ["sh", "-c", 'echo "$GREETING $(pwd)"'],
                    env={"GREETING": "hello"}, cwd="/tmp")
    r = api.collect(SseStream(resp, api.validator))
    assert r.stdout == b"hello /tmp\n" and r.exit["exit_code"] == 0, r
    # A server-side timeout counts from the start, which this request made.
    resp = open_run(api, sandbox["id"], ["sleep", "30"], timeout_s=1)
    r = api.collect(SseStream(resp, api.validator), max_seconds=30)
    assert r.exit["timed_out"] is True, r.exit


def test_one_request_binary_form_by_query_and_by_accept(api, sandbox):
    argv = ["sh", "-c", "printf 'a\\0b'; printf e >&2; exit 5"]
    for params, headers in (({"format": "binary"}, None), (None, {"Accept": BINARY})):
        resp = open_run(api, sandbox["id"], argv, params=params, headers=headers)
        assert resp.headers["Content-Type"] == BINARY, resp.headers
        session_of(resp)
        stdout, stderr, _, exit_frame = collect_binary(resp, first_id=1)
        assert stdout == b"a\0b" and stderr == b"e", (stdout, stderr)
        assert exit_frame is not None and exit_frame.data["exit_code"] == 5, exit_frame


def test_a_retried_one_request_run_attaches_to_the_first_process(api, sandbox):
    """The same Idempotency-Key twice: one process (its pid and its side effect once), the
    second answer replays its stream, also after Last-Event-ID."""
    key = secrets.token_hex(8)
    marker = f"/tmp/oneshot-{key}"
    argv = ["sh", "-c", f"echo x >> {marker}; echo pid $$; echo lines $(wc -l < {marker})"]
    first = open_run(api, sandbox["id"], argv, key=key)
    sid = session_of(first)
    r1 = api.collect(SseStream(first, api.validator), first_id=1)
    assert r1.exit["exit_code"] == 0 and b"lines 1\n" in r1.stdout, r1

    second = open_run(api, sandbox["id"], argv, key=key)
    assert session_of(second) == sid
    assert second.headers.get("Idempotent-Replayed") == "true", second.headers
    r2 = api.collect(SseStream(second, api.validator), first_id=1)
    assert (r2.stdout, r2.exit) == (r1.stdout, r1.exit), "a replay must not run the command again"

    last = r1.events[0].id
    third = open_run(api, sandbox["id"], argv, key=key, headers={"Last-Event-ID": str(last)})
    assert session_of(third) == sid
    r3 = api.collect(SseStream(third, api.validator), first_id=last + 1,
                     stdout_offset=len(base64.b64decode(r1.events[0].data["data_b64"])))
    assert r3.exit == r1.exit, r3

    # A new key with a Last-Event-ID: a new session, whose first events are not skipped.
    fresh = open_run(api, sandbox["id"], ["echo", "fresh"], key=secrets.token_hex(8),
                     headers={"Last-Event-ID": "5"})
    assert "Idempotent-Replayed" not in fresh.headers and session_of(fresh) != sid
    r4 = api.collect(SseStream(fresh, api.validator), first_id=1)
    assert r4.stdout == b"fresh\n" and r4.exit["exit_code"] == 0, r4

    check = api.run(sandbox["id"], ["wc", "-l", marker])
    assert check.stdout.split()[0] == b"1", f"the command ran more than once: {check.stdout!r}"
    # The same key with another body is a conflict, not a stream.
    resp = open_run(api, sandbox["id"], ["true"], key=key, expect=409)
    check_error_body(resp, resp.body, "idempotency_key_reused")


def test_a_dropped_one_request_stream_resumes_on_the_attach_route(api, sandbox):
    resp = open_run(api, sandbox["id"], ["sh", "-c", "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.1; done"])
    sid = session_of(resp)
    stream = SseStream(resp, api.validator)
    seen, out = [], bytearray()
    for ev in stream.events():
        assert ev.event == "stdout", ev
        seen.append(ev.id)
        out += base64.b64decode(ev.data["data_b64"])
        if out.count(b"\n") >= 2:
            break
    stream.close()  # the client goes away; the process does not
    with api.attach(sid, last_event_id=seen[-1]) as rest_stream:
        rest = api.collect(rest_stream, first_id=seen[-1] + 1, stdout_offset=len(out))
    full = (bytes(out) + rest.stdout).decode().splitlines()
    assert full == [f"line {i}" for i in range(1, 7)], full
    assert rest.exit["exit_code"] == 0, rest.exit


def test_a_bad_one_request_run_creates_nothing(api, sandbox):
    """Each refusal is a 4xx naming the field, and makes no session: the same Idempotency-Key
    afterwards with a good request is a fresh create, not a replay of anything."""
    sid = sandbox["id"]
    cases = [
        ({"attach": "yes"}, None, {"argv": ["true"]}, 400, "attach"),
        ({"attach": "true", "format": "xml"}, None, {"argv": ["true"]}, 400, "format"),
        ({"attach": "true"}, None, {"argv": []}, 400, "argv"),
        ({"attach": "true"}, None, {"argv": ["true"], "bogus": 1}, 400, "bogus"),
    ]
    for params, headers, body, status, field in cases:
        key = secrets.token_hex(8)
        hdrs = {"Idempotency-Key": key, **(headers or {})}
        resp = api.call("POST", f"/v1/sandboxes/{sid}/sessions", json_body=body, params=params,
                        headers=hdrs, stream=True, timeout=30)
        assert resp.status_code == status, (params, body, resp.status_code, resp.body)
        check_error_body(resp, resp.body, "invalid_argument")
        assert field in resp.body["error"]["message"], (field, resp.body)
        good = open_run(api, sid, ["true"], key=key)
        assert "Idempotent-Replayed" not in good.headers, (params, body, good.headers)
        assert api.collect(SseStream(good, api.validator)).exit["exit_code"] == 0
    # A sandbox that does not exist (404), and one that is not running (409).
    for target, status, code in ((fake_id("sbx"), 404, "not_found"), (sid, 409, "sandbox_not_running")):
        if target == sid:
            do(api, sid, "pause")
        resp = api.call("POST", f"/v1/sandboxes/{target}/sessions", json_body={"argv": ["true"]},
                        params={"attach": "true"}, stream=True, timeout=30)
        assert resp.status_code == status, resp.body
        check_error_body(resp, resp.body, code)
    # attach=false is the plain create.
    do(api, sid, "wake")
    plain = api.call("POST", f"/v1/sandboxes/{sid}/sessions", json_body={"argv": ["true"]},
                     params={"attach": "false"}, expect=201)
    assert plain.body["session_id"].startswith("ses_"), plain.body


def test_cli_exec_and_run_use_one_request(api, sbxd, sandbox):
    proc = subprocess.run([_sbx_binary(), "exec", sandbox["id"], "--", "sh", "-c",
                           "echo out; echo err >&2; exit 7"],
                          capture_output=True, env=_cli_env(sbxd), timeout=120)
    assert proc.returncode == 7, proc
    assert proc.stdout == b"out\n" and proc.stderr == b"err\n", proc
    # A refused create is reported as such, with sbxd's reason.
    proc = subprocess.run([_sbx_binary(), "exec", fake_id("sbx"), "--", "true"],
                          capture_output=True, env=_cli_env(sbxd), timeout=120)
    assert proc.returncode != 0, proc
    assert b"exec:" in proc.stderr and b"not_found" in proc.stderr, proc.stderr


def _raw_run(sock, api, sandbox_id, argv) -> None:
    """Sends a one-request run on a plain socket (the response is the caller's to read)."""
    body = json.dumps({"argv": argv}).encode()
    host = urllib.parse.urlsplit(api.base_url).netloc
    sock.sendall((f"POST /v1/sandboxes/{sandbox_id}/sessions?attach=true HTTP/1.1\r\n"
                  f"Host: {host}\r\nAuthorization: Bearer {api.token}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                  ).encode() + body)


def _raw_socket(api):
    """A connection to sbxd for hand-written HTTP/1.1 (through TLS when sbxd speaks it)."""
    parts = urllib.parse.urlsplit(api.base_url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    if parts.scheme == "https":
        sock = api.ssl_context().wrap_socket(sock, server_hostname=parts.hostname)
    return sock


def test_a_finished_session_is_answered_in_one_piece_and_the_connection_stays_open(api, sandbox):
    """A process that is over has all of its answer at hand: the header, its events and the
    chunked body's end go out in one write, so the client's first read holds the whole answer
    (an attach of an ended session here: a one-request run of a short command is the same
    when the process ends within the first 10 ms, which a test cannot promise). The
    connection then serves the next request: keep-alive after the fused end."""
    runs = []
    for code in (0, 4):
        resp = open_run(api, sandbox["id"], ["sh", "-c", f"echo one; exit {code}"])
        sid = session_of(resp)
        assert api.collect(SseStream(resp, api.validator)).exit["exit_code"] == code
        runs.append((sid, code))
    host = urllib.parse.urlsplit(api.base_url).netloc
    with _raw_socket(api) as s:
        for sid, code in runs * 2:
            s.sendall((f"GET /v1/sessions/{sid}/attach HTTP/1.1\r\nHost: {host}\r\n"
                       f"Authorization: Bearer {api.token}\r\n\r\n").encode())
            first = s.recv(1 << 16)
            assert first.startswith(b"HTTP/1.1 200 "), first[:200]
            assert first.endswith(b"\r\n0\r\n\r\n"), first[-200:]
            head, _, body = first.partition(b"\r\n\r\n")
            assert b"transfer-encoding: chunked" in head.lower(), head
            assert b"event: stdout" in body and b"event: process_exited" in body, body
            assert f'"exit_code":{code}'.encode() in body, body


def test_a_running_command_sends_its_header_before_it_ends(api, sandbox):
    """Only a finished process's header waits for its events: a running one's goes at once,
    since the client learns the session from it. The process waits for a file that only a
    second request writes, after this test has read the header."""
    gate = f"/tmp/gate-{secrets.token_hex(6)}"
    with _raw_socket(api) as s:
        _raw_run(s, api, sandbox["id"],
                 ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; echo through"])
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(1 << 16)  # the socket's timeout fails the test if the header waits
            assert chunk, got
            got += chunk
        head = got.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        assert head.startswith("HTTP/1.1 200 ") and "Sbx-Session-Id: ses_" in head, head
        assert b"through" not in got
        r = api.run(sandbox["id"], ["touch", gate])
        assert r.exit["exit_code"] == 0, r.exit
        while not got.endswith(b"\r\n0\r\n\r\n"):
            chunk = s.recv(1 << 16)
            assert chunk, got
            got += chunk
        assert b"process_exited" in got, got


def test_a_one_request_run_is_audited_with_the_status_it_streamed(api, sandbox):
    """The audit line of a streamed answer carries its status (200), not the 101 of a WebSocket
    upgrade, which every stream was recorded with before."""
    since = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5))
    resp = open_run(api, sandbox["id"], ["true"])
    rid = resp.headers["X-Request-Id"]
    api.collect(SseStream(resp, api.validator))
    params = {"since": since.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "limit": 500}
    rows = []
    for _ in range(100):  # pages of the last seconds' lines; bounded
        page = api.call("GET", "/v1/admin/audit", params=params, expect=200).body
        rows += page["audit"]
        if not page.get("next_page_token"):
            break
        params["page_token"] = page["next_page_token"]
    mine = [r for r in rows if r["request_id"] == rid]
    assert len(mine) == 1, rows[-5:]
    assert mine[0]["status"] == 200, mine
    assert mine[0]["action"] == f"POST /v1/sandboxes/{sandbox['id']}/sessions", mine

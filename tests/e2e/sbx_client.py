"""A small test client for the sbx HTTP API (docs/api.md).

Every response that passes through `SbxClient.call` is checked: it must carry X-Request-Id,
its status/content type must be documented in docs/api/openapi.yaml and a JSON body must
match the documented schema (see openapi_validator.py). Error bodies are additionally checked
for the documented shape.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import requests

from openapi_validator import OpenApiValidator

_DEFAULT = object()
TIMESTAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
ID_RE = {p: re.compile(rf"^{p}_[a-z2-7]{{20}}$") for p in ("sbx", "op", "ses")}


def check_error_body(resp: requests.Response, body: Any, expected_code: str | None = None,
                     field: str | None = None) -> dict:
    """The documented error shape: {"error": {code, message, request_id, details?}}."""
    where = f"{resp.request.method} {resp.request.path_url} -> {resp.status_code}"
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), \
        f"{where}: error body must be {{'error': {{...}}}}, got {body!r}"
    err = body["error"]
    assert isinstance(err.get("code"), str) and re.fullmatch(r"[a-z][a-z0-9_]*", err["code"]), \
        f"{where}: error.code must be snake_case, got {err!r}"
    assert isinstance(err.get("message"), str) and err["message"], f"{where}: empty error.message: {err!r}"
    assert err.get("request_id") == resp.headers.get("X-Request-Id"), \
        f"{where}: error.request_id {err.get('request_id')!r} != X-Request-Id {resp.headers.get('X-Request-Id')!r}"
    if expected_code is not None:
        assert err["code"] == expected_code, f"{where}: expected code {expected_code!r}, got {err!r}"
    if field is not None:
        details = err.get("details")
        assert isinstance(details, dict), f"{where}: error.details must name the field {field!r}: {err!r}"
        got = details.get("field")
        if field.endswith("*"):
            assert isinstance(got, str) and got.startswith(field[:-1]), \
                f"{where}: error.details.field should start with {field[:-1]!r}: {err!r}"
        else:
            assert got == field, f"{where}: error.details.field should be {field!r}: {err!r}"
    return err


class ApiError(AssertionError):
    def __init__(self, resp: requests.Response, body: Any, expected):
        self.status = resp.status_code
        self.body = body
        super().__init__(f"{resp.request.method} {resp.request.path_url}: expected HTTP {expected}, "
                         f"got {resp.status_code}: {str(body)[:2000]}")


@dataclass
class SseEvent:
    id: int | None
    event: str
    data: Any
    raw: str = ""


@dataclass
class RunResult:
    session: dict
    stdout: bytes
    stderr: bytes
    exit: dict | None
    events: list[SseEvent] = field(default_factory=list)
    seconds: float = 0.0


class SseStream:
    """A streamed text/event-stream response parsed into SseEvents.

    `events()` yields events as they arrive; `close()` drops the connection mid-stream.
    Data payloads are parsed as JSON. Ids are parsed as integers.
    """

    def __init__(self, resp: requests.Response, validator: OpenApiValidator | None = None):
        self.resp = resp
        self.validator = validator  # checks each event's data against the contract
        self._closed = False
        self.bytes_read = 0

    def _chunks(self, chunk_size: int = 1 << 16) -> Iterator[bytes]:
        if self.resp.headers.get("Transfer-Encoding", "").lower() == "chunked":
            # urllib3 yields each HTTP chunk as soon as it arrives.
            yield from self.resp.iter_content(chunk_size=chunk_size)
            return
        # Close-delimited or length-delimited body: http.client's read1 returns whatever has
        # arrived instead of blocking until chunk_size bytes are buffered.
        fp = self.resp.raw._fp  # http.client.HTTPResponse
        while True:
            data = fp.read1(chunk_size)
            if not data:
                return
            yield data

    def events(self) -> Iterator[SseEvent]:
        buf = b""
        ev_id: str | None = None
        ev_type = ""
        data_lines: list[str] = []
        raw_lines: list[str] = []
        try:
            for chunk in self._chunks():
                self.bytes_read += len(chunk)
                buf += chunk
                if b"\n" not in chunk and b"\r" not in chunk:
                    continue
                hold = b""
                if buf.endswith(b"\r"):  # may be the first half of a CRLF split across chunks
                    buf, hold = buf[:-1], b"\r"
                lines = re.split(rb"\r\n|\r|\n", buf)
                buf = lines.pop() + hold  # the incomplete tail (empty when buf ended with a newline)
                for line_b in lines:
                    line = line_b.decode("utf-8")  # SSE is UTF-8 text; a decode error is a bug
                    if line == "":
                        if data_lines or ev_type or ev_id is not None:
                            ev = self._make(ev_id, ev_type, data_lines, raw_lines)
                            if self.validator is not None:
                                self.validator.validate_sse_event(self.resp.request.path_url, ev.event, ev.data,
                                                                  self.resp.request.method)
                            yield ev
                        ev_id, ev_type, data_lines, raw_lines = None, "", [], []
                        continue
                    if line.startswith(":"):
                        continue  # comment / keepalive
                    raw_lines.append(line)
                    name, _, value = line.partition(":")
                    if value.startswith(" "):
                        value = value[1:]
                    if name == "data":
                        data_lines.append(value)
                    elif name == "event":
                        ev_type = value
                    elif name == "id":
                        ev_id = value
                    # `retry` and unknown fields are ignored, as the SSE spec says.
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError,
                AttributeError, ValueError, OSError):
            if self._closed:
                return
            raise
        if self._closed:
            return
        assert not data_lines and not ev_type, \
            f"SSE stream ended in the middle of an event: {raw_lines!r} {buf[:200]!r}"

    @staticmethod
    def _make(ev_id, ev_type, data_lines, raw_lines) -> SseEvent:
        text = "\n".join(data_lines)
        try:
            data = json.loads(text) if text else None
        except json.JSONDecodeError as e:
            raise AssertionError(f"SSE event data is not JSON: {raw_lines!r}: {e}") from e
        num = None
        if ev_id is not None:
            assert re.fullmatch(r"\d+", ev_id), f"SSE id must be an integer, got {ev_id!r}"
            num = int(ev_id)
        return SseEvent(num, ev_type or "message", data, "\n".join(raw_lines))

    def close(self) -> None:
        self._closed = True
        try:
            # Close the socket itself so the server sees the disconnect now.
            conn = getattr(self.resp.raw, "_connection", None)
            self.resp.close()
            if conn is not None:
                conn.close()
        except Exception:  # noqa: BLE001 - closing must never mask the test's own error
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SbxClient:
    """`base_url` may be https://: the server's certificate is then verified against `ca_file`
    (a PEM CA certificate; None: the system's CAs), also by clones and `ssl_context()`."""

    def __init__(self, base_url: str, token: str, validator: OpenApiValidator,
                 timeout: float = 30.0, ca_file: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.validator = validator
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # never route 127.0.0.1 traffic through a proxy
        self.ca_file: str | None = None
        self.use_ca(ca_file)
        self.created_sandboxes: list[str] = []
        self._lock = threading.Lock()

    @property
    def https(self) -> bool:
        return self.base_url.startswith("https://")

    def use_ca(self, ca_file: str | None) -> None:
        """Verifies the server against `ca_file` from the next connection on (a rotated
        certificate from another CA)."""
        self.ca_file = ca_file
        self.session.verify = ca_file if ca_file else True

    def ssl_context(self) -> ssl.SSLContext:
        """For a raw socket to the server (WebSocket, a hand-made request): verifies the
        certificate and the name as the session does."""
        return ssl.create_default_context(cafile=self.ca_file)

    def clone(self) -> "SbxClient":
        """A client with its own connection pool (requests.Session is not thread-safe)."""
        c = SbxClient(self.base_url, self.token, self.validator, self.timeout, self.ca_file)
        c.created_sandboxes = self.created_sandboxes
        c._lock = self._lock
        return c

    def close(self) -> None:
        self.session.close()

    # ---- raw calls -----------------------------------------------------------------------
    def call(self, method: str, path: str, *, json_body: Any = _DEFAULT, data: Any = None,
             headers: dict | None = None, token: Any = _DEFAULT, params: dict | None = None,
             expect: int | tuple | None = None, validate: bool = True, stream: bool = False,
             timeout: float | None = None) -> requests.Response:
        """Sends one request and checks the response against the contract.

        `token`: _DEFAULT uses the admin token, None sends no Authorization header, a string is
        sent as the bearer token. `expect`: a status (or tuple of statuses) that must match.
        The parsed JSON body (or None) is stored as `resp.body`.
        """
        hdrs = dict(headers or {})
        tok = self.token if token is _DEFAULT else token
        if tok is not None:
            hdrs.setdefault("Authorization", f"Bearer {tok}")
        kwargs: dict[str, Any] = {"headers": hdrs, "params": params, "stream": stream,
                                  "timeout": timeout or self.timeout, "allow_redirects": False}
        if json_body is not _DEFAULT:
            kwargs["data"] = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif data is not None:
            kwargs["data"] = data
        resp = self.session.request(method, self.base_url + path, **kwargs)
        resp.body = None
        assert resp.headers.get("X-Request-Id"), \
            f"{method} {path} -> {resp.status_code}: response has no X-Request-Id header"
        ctype = resp.headers.get("Content-Type", "")
        is_json = ctype.split(";")[0].strip().lower() == "application/json"
        if stream and resp.status_code >= 400:
            resp.content  # an error is a plain JSON response: read it whole
            stream = False
        if method.upper() == "HEAD":
            pass  # headers as a GET's would be, and never a body (RFC 9110 §9.3.2)
        elif not stream:
            if is_json:
                try:
                    resp.body = resp.json()
                except ValueError as e:
                    raise AssertionError(f"{method} {path} -> {resp.status_code}: Content-Type is "
                                         f"JSON but the body is not: {resp.content[:500]!r}") from e
            elif resp.status_code >= 400:
                raise AssertionError(f"{method} {path} -> {resp.status_code}: error response must be "
                                     f"application/json, got {ctype!r}: {resp.content[:300]!r}")
        if validate:
            self.validator.validate(method, resp.request.path_url, resp.status_code, ctype,
                                    resp.body, has_body=bool(ctype) and (stream or bool(resp.content)))
        if resp.status_code >= 400 and not stream and method.upper() != "HEAD":
            check_error_body(resp, resp.body)
        if expect is not None:
            ok = resp.status_code in expect if isinstance(expect, tuple) else resp.status_code == expect
            if not ok:
                if stream:
                    resp.close()
                raise ApiError(resp, resp.body, expect)
        return resp

    # ---- sandboxes -----------------------------------------------------------------------
    def create_sandbox(self, body: dict | None = None, *, wait: bool = True,
                       idempotency_key: str | None = None, timeout: float = 120.0) -> dict:
        """POST /v1/sandboxes. Returns {"sandbox", "operation", "response"}; with wait=True the
        operation has finished successfully and "sandbox" is the fresh running sandbox."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        resp = self.call("POST", "/v1/sandboxes", json_body=body if body is not None else {},
                         headers=headers, expect=202)
        sb, op = resp.body["sandbox"], resp.body["operation"]
        with self._lock:
            if sb["id"] not in self.created_sandboxes:
                self.created_sandboxes.append(sb["id"])
        out = {"sandbox": sb, "operation": op, "response": resp}
        if wait:
            op = self.wait_operation(op["id"], timeout=timeout)
            assert op["state"] == "succeeded", f"create operation failed: {op}"
            out["operation"] = op
            out["sandbox"] = self.get_sandbox(sb["id"])
            assert out["sandbox"]["state"] == "running", f"sandbox not running after create: {out['sandbox']}"
        return out

    def get_sandbox(self, sandbox_id: str) -> dict:
        return self.call("GET", f"/v1/sandboxes/{sandbox_id}", expect=200).body

    def list_sandboxes(self, **params) -> list[dict]:
        out: list[dict] = []
        page_token = None
        for _ in range(1000):
            p = dict(params)
            if page_token:
                p["page_token"] = page_token
            body = self.call("GET", "/v1/sandboxes", params=p, expect=200).body
            out.extend(body["sandboxes"])
            page_token = body.get("next_page_token")
            if not page_token:
                return out
        raise AssertionError("GET /v1/sandboxes: pagination did not end after 1000 pages")

    def get_operation(self, op_id: str, wait_ms: int | None = None) -> dict:
        params = {"wait_ms": str(wait_ms)} if wait_ms is not None else None
        return self.call("GET", f"/v1/operations/{op_id}", params=params, expect=200).body

    def wait_operation(self, op_id: str, timeout: float = 120.0) -> dict:
        """Long-polls (server-side wait_ms) until the operation is finished."""
        deadline = time.monotonic() + timeout
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            op = self.get_operation(op_id, wait_ms=max(0, min(left_ms, 10000)))
            if op["state"] in ("succeeded", "failed"):
                return op
            if time.monotonic() > deadline:
                raise AssertionError(f"operation {op_id} not finished after {timeout}s: {op}")

    def delete_sandbox(self, sandbox_id: str, *, wait: bool = True, idempotency_key: str | None = None,
                       timeout: float = 120.0) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        op = self.call("DELETE", f"/v1/sandboxes/{sandbox_id}", headers=headers, expect=202).body["operation"]
        if wait:
            op = self.wait_operation(op["id"], timeout=timeout)
        return op

    # ---- sessions ------------------------------------------------------------------------
    def create_session(self, sandbox_id: str, argv: list, *, idempotency_key: str | None = None,
                       **fields) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = {"argv": argv, **fields}
        return self.call("POST", f"/v1/sandboxes/{sandbox_id}/sessions", json_body=body,
                         headers=headers, expect=201).body

    def get_session(self, session_id: str) -> dict:
        return self.call("GET", f"/v1/sessions/{session_id}", expect=200).body

    def attach(self, session: dict | str, *, last_event_id: int | None = None, token: Any = None,
               query_token: bool = False, query_last_event_id: bool = False,
               timeout: float = 60.0) -> SseStream:
        """Opens the attach stream. By default it authenticates with the session's attach
        token (from the create response) or, given only an id, the admin token."""
        if isinstance(session, dict):
            sid = session["session_id"] if "session_id" in session else session["id"]
            url = session.get("attach", {}).get("url") or f"/v1/sessions/{sid}/attach"
            tok = token if token is not None else session.get("attach", {}).get("token", self.token)
        else:
            sid, url = session, f"/v1/sessions/{session}/attach"
            tok = token if token is not None else self.token
        headers = {"Accept": "text/event-stream"}
        params = {}
        if last_event_id is not None:
            if query_last_event_id:
                params["last_event_id"] = str(last_event_id)
            else:
                headers["Last-Event-ID"] = str(last_event_id)
        if query_token:
            params["token"] = tok
            tok = None
        resp = self.call("GET", url, headers=headers, token=tok, params=params or None,
                         stream=True, timeout=timeout, expect=200)
        ctype = resp.headers.get("Content-Type", "")
        assert ctype.split(";")[0].strip() == "text/event-stream", \
            f"attach: Content-Type must be text/event-stream, got {ctype!r}"
        return SseStream(resp, self.validator)

    def collect(self, stream: SseStream, *, first_id: int | None = None,
                stdout_offset: int = 0, stderr_offset: int = 0,
                max_seconds: float = 120.0, keep_events: bool = True) -> RunResult:
        """Reads a stream to its end, checking event ids and per-stream offsets."""
        out = {"stdout": bytearray(), "stderr": bytearray()}
        offsets = {"stdout": stdout_offset, "stderr": stderr_offset}
        events: list[SseEvent] = []
        exit_ev = None
        start = time.monotonic()
        prev_id = first_id - 1 if first_id is not None else None
        for ev in stream.events():
            assert time.monotonic() - start < max_seconds, f"attach stream still open after {max_seconds}s"
            assert exit_ev is None, f"event after process_exited: {ev}"
            if keep_events or ev.event not in ("stdout", "stderr"):
                events.append(ev)
            if ev.event in ("resync_required", "error") and ev.id is None:
                pass  # not part of the numbered output sequence
            else:
                assert ev.id is not None, f"SSE event without id: {ev}"
            if prev_id is not None and ev.id is not None:
                assert ev.id == prev_id + 1, f"event ids must increase by one: {prev_id} then {ev.id} ({ev.event})"
            if ev.id is not None:
                prev_id = ev.id
            if ev.event in ("stdout", "stderr"):
                check_output_event(ev)
                assert ev.data["offset"] == offsets[ev.event], \
                    f"{ev.event} offset {ev.data['offset']} != bytes received so far {offsets[ev.event]} (event {ev.id})"
                chunk = base64.b64decode(ev.data["data_b64"], validate=True)
                out[ev.event] += chunk
                offsets[ev.event] += len(chunk)
            elif ev.event == "process_exited":
                check_exit_event(ev)
                exit_ev = ev.data
            elif ev.event == "resync_required":
                d = ev.data
                assert isinstance(d, dict), ev
                offsets["stdout"] = d["stdout_offset"]
                offsets["stderr"] = d["stderr_offset"]
                prev_id = d["oldest_available_id"] - 1
            elif ev.event == "error":
                assert isinstance(ev.data, dict) and isinstance(ev.data.get("code"), str) \
                    and isinstance(ev.data.get("message"), str), f"bad error event: {ev}"
            else:
                raise AssertionError(f"undocumented SSE event type {ev.event!r}: {ev}")
        stream.close()
        return RunResult(session={}, stdout=bytes(out["stdout"]), stderr=bytes(out["stderr"]),
                         exit=exit_ev, events=events, seconds=time.monotonic() - start)

    def run(self, sandbox_id: str, argv: list, *, max_seconds: float = 120.0, keep_events: bool = True,
            **fields) -> RunResult:
        """Creates a session, attaches (which starts it) and reads to process_exited."""
        session = self.create_session(sandbox_id, argv, **fields)
        with self.attach(session) as stream:
            result = self.collect(stream, first_id=None, max_seconds=max_seconds, keep_events=keep_events)
        result.session = session
        assert result.exit is not None, \
            f"attach stream of {argv!r} ended without process_exited; events: {[e.event for e in result.events][-5:]}"
        assert not [e for e in result.events if e.event in ("error", "resync_required")], \
            f"unexpected error/resync events: {[e for e in result.events if e.event != 'stdout'][:5]}"
        return result


def check_output_event(ev: SseEvent) -> None:
    d = ev.data
    assert isinstance(d, dict) and isinstance(d.get("data_b64"), str) and isinstance(d.get("offset"), int) \
        and not isinstance(d.get("offset"), bool) and d["offset"] >= 0, f"bad {ev.event} event data: {ev}"


def check_exit_event(ev: SseEvent) -> None:
    d = ev.data
    assert isinstance(d, dict), ev
    for k in ("exit_code", "signal", "timed_out", "oom_killed"):
        assert k in d, f"process_exited lacks {k!r}: {d}"
    assert d["exit_code"] is None or (isinstance(d["exit_code"], int) and not isinstance(d["exit_code"], bool)), d
    assert d["signal"] is None or isinstance(d["signal"], str), d
    assert isinstance(d["timed_out"], bool) and isinstance(d["oom_killed"], bool), d
    assert (d["exit_code"] is None) != (d["signal"] is None), \
        f"exactly one of exit_code and signal must be set: {d}"

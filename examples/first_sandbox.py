#!/usr/bin/env python3
"""First sandbox: create a sandbox on sbxd, run a known greeting in it, record, clean up.

Python 3.8+ standard library only.

    python3 examples/first_sandbox.py                  # the walkthrough; prints RUN_DIR first
    python3 examples/first_sandbox.py inspect RUN_DIR  # show the sandbox/operations/session
    python3 examples/first_sandbox.py delete RUN_DIR [--yes]

Environment: SBX_URL (default http://127.0.0.1:7070) and SBX_TOKEN (default: the contents of
/var/lib/sbx/admin-token when readable).

Every transition is checked, never assumed: an accepted create is not a running sandbox (the
operation must succeed and the sandbox must read `running`), and a closed stream is not a
successful command (only `process_exited` with exit code 0, without `error` or
`resync_required` events, is). RUN_DIR/state.json keeps the request bodies, idempotency keys and
returned ids (never a token) and is written *before* each mutation is sent, so that a failed
or interrupted run can be inspected, retried with the same key, or deleted.
"""

import base64
import datetime
import http.client
import json
import os
import socket
import sys
import tempfile
import time
import urllib.parse
import uuid

DEFAULT_URL = "http://127.0.0.1:7070"
ADMIN_TOKEN_FILE = "/var/lib/sbx/admin-token"
TEMPLATE = "base"
RESOURCES = {"vcpu": 1, "memory_mib": 512, "disk_mib": 1024}
COMMAND = ["python3", "-c", "print('hello from sbx')"]
OPERATION_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
# sbxd sends a keepalive comment every 15 s; this much silence means the stream is dead.
STREAM_READ_TIMEOUT_S = 60.0
TRANSPORT_RETRIES = 3
STATE_FILE = "state.json"
RECORD_FILE = "record.json"
TRANSCRIPTS = {"stdout": "stdout.txt", "stderr": "stderr.txt"}


class Failure(Exception):
    """A check that did not hold; the message says which and what to do."""


class ApiError(Failure):
    def __init__(self, method, path, status, code, message, request_id, details=None):
        self.status = status
        self.code = code
        self.request_id = request_id
        text = "%s %s: HTTP %d %s: %s" % (method, path, status, code, message)
        if details:
            text += " (details: %s)" % json.dumps(details, sort_keys=True)
        if request_id:
            text += " (request %s)" % request_id
        super().__init__(text)


class TransportError(Failure):
    """The request may or may not have reached sbxd."""


def log(msg):
    sys.stderr.write("first_sandbox: %s\n" % msg)
    sys.stderr.flush()


def now_rfc3339():
    t = datetime.datetime.now(datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (t.microsecond // 1000)


# ---------------------------------------------------------------------------------------------
# configuration and HTTP


def load_config():
    url = os.environ.get("SBX_URL") or DEFAULT_URL
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise Failure("SBX_URL must be an http://HOST[:PORT] URL, got %r" % url)
    if parsed.username or parsed.password or parsed.query or parsed.fragment:
        raise Failure("SBX_URL must not carry credentials, a query or a fragment")
    token = os.environ.get("SBX_TOKEN", "").strip()
    if not token:
        try:
            with open(ADMIN_TOKEN_FILE) as f:
                token = f.read().strip()
        except OSError:
            token = ""
    if not token:
        raise Failure("no API token: export SBX_TOKEN (or make %s readable)" % ADMIN_TOKEN_FILE)
    return {
        "url": url.rstrip("/"),
        "host": parsed.hostname,
        "port": parsed.port or 80,
        "base_path": parsed.path.rstrip("/"),
        "token": token,
    }


class Api:
    def __init__(self, cfg):
        self.cfg = cfg

    def _connect(self, timeout):
        return http.client.HTTPConnection(self.cfg["host"], self.cfg["port"], timeout=timeout)

    def request(self, method, path, body=None, idempotency_key=None, ok=(200,)):
        """One JSON request; returns (status, json body, headers). Non-`ok` statuses raise."""
        headers = {
            "Authorization": "Bearer " + self.cfg["token"],
            "Accept": "application/json",
            "User-Agent": "sbx-first-sandbox/1",
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        conn = self._connect(REQUEST_TIMEOUT_S)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            # Nothing was sent: the outcome is known (no effect), unlike a failure mid-request.
            raise Failure("cannot reach sbxd at %s: %s" % (self.cfg["url"], e.strerror or e))
        try:
            conn.request(method, self.cfg["base_path"] + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            status = resp.status
            resp_headers = {k.lower(): v for k, v in resp.getheaders()}
        except (OSError, http.client.HTTPException) as e:
            raise TransportError("%s %s: cannot talk to sbxd at %s: %s"
                                 % (method, path, self.cfg["url"], e or type(e).__name__))
        finally:
            conn.close()
        payload = None
        if raw:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
        if status not in ok:
            err = (payload or {}).get("error") if isinstance(payload, dict) else None
            if isinstance(err, dict):
                raise ApiError(method, path, status, err.get("code", "?"), err.get("message", ""),
                               err.get("request_id") or resp_headers.get("x-request-id"),
                               err.get("details"))
            raise ApiError(method, path, status, "?", raw[:200].decode("utf-8", "replace"),
                           resp_headers.get("x-request-id"))
        if payload is None and raw:
            raise Failure("%s %s: sbxd returned a body that is not JSON" % (method, path))
        return status, payload, resp_headers

    def mutate(self, method, path, body, key, ok):
        """A mutation carrying an Idempotency-Key: safe to resend on a transport failure, since
        sbxd replays the first response for the same key and body."""
        for attempt in range(TRANSPORT_RETRIES):
            try:
                return self.request(method, path, body, key, ok)
            except TransportError as e:
                if attempt + 1 == TRANSPORT_RETRIES:
                    raise TransportError("%s; its outcome is unknown: the idempotency key is in "
                                         "state.json for a retry" % e)
                log("%s; retrying with the same idempotency key" % e)
                time.sleep(0.5 * (attempt + 1))

    def get(self, path):
        return self.request("GET", path)[1]

    def wait_operation(self, op, timeout=OPERATION_TIMEOUT_S):
        """Waits (server-side long poll) until the operation is done; returns it, raises if it
        failed or did not finish in time."""
        deadline = time.monotonic() + timeout
        while True:
            state = op.get("state")
            if state == "succeeded":
                return op
            if state == "failed":
                err = op.get("error") or {}
                raise Failure("%s operation %s failed: %s: %s"
                              % (op.get("kind"), op.get("id"), err.get("code"), err.get("message")))
            if time.monotonic() >= deadline:
                raise Failure("%s operation %s is still %s after %.0f s (a timeout does not mean "
                              "it failed: inspect it)" % (op.get("kind"), op.get("id"), state,
                                                          timeout))
            # The server holds this request until the operation ends (or wait_ms passes).
            wait_ms = int(max(0.0, min(deadline - time.monotonic(), 10.0)) * 1000)
            op = self.get("/v1/operations/%s?wait_ms=%d" % (op["id"], wait_ms))

    def attach(self, attach_url, attach_token, on_event):
        """Reads the SSE attach stream incrementally and calls on_event(id, type, data) as each
        event completes. Returns when the response ends (or on_event returns False)."""
        conn = self._connect(STREAM_READ_TIMEOUT_S)
        path = attach_url if attach_url.startswith("/") else "/" + attach_url
        try:
            conn.request("GET", self.cfg["base_path"] + path, headers={
                "Authorization": "Bearer " + attach_token,
                "Accept": "text/event-stream",
                "Cache-Control": "no-cache",
                "User-Agent": "sbx-first-sandbox/1",
            })
            resp = conn.getresponse()
            if resp.status != 200:
                raw = resp.read()
                try:
                    err = json.loads(raw)["error"]
                    raise ApiError("GET", path, resp.status, err.get("code"), err.get("message"),
                                   err.get("request_id"), err.get("details"))
                except (ValueError, KeyError, TypeError):
                    raise ApiError("GET", path, resp.status, "?", raw[:200].decode("utf-8", "replace"),
                                   resp.getheader("X-Request-Id"))
            ctype = resp.getheader("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise Failure("attach: expected text/event-stream, got %r" % ctype)
            parser = SseParser()
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    return parser.partial()
                for ev in parser.feed(chunk):
                    if on_event(*ev) is False:
                        return False
        except socket.timeout:
            raise Failure("attach: no data (not even a keepalive) for %.0f s; the process may "
                          "still be running" % STREAM_READ_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as e:
            raise Failure("attach: the stream broke: %s; the process may still be running, do not "
                          "infer success or rerun blindly" % (e or type(e).__name__))
        finally:
            conn.close()


class SseParser:
    """Incremental text/event-stream parser (LF, CRLF or CR line ends; chunks split anywhere)."""

    def __init__(self):
        self.buf = b""
        self.data = []
        self.type = ""
        self.last_id = ""
        self.started = False

    def feed(self, chunk):
        self.buf += chunk
        events = []
        while True:
            i = min((p for p in (self.buf.find(b"\n"), self.buf.find(b"\r")) if p >= 0),
                    default=-1)
            if i < 0:
                return events
            # A CR at the very end may be the first half of a CRLF: wait for the next byte.
            if self.buf[i:i + 1] == b"\r" and i + 1 == len(self.buf):
                return events
            line = self.buf[:i]
            skip = 2 if self.buf[i:i + 2] == b"\r\n" else 1
            self.buf = self.buf[i + skip:]
            ev = self._line(line.decode("utf-8", "replace"))
            if ev:
                events.append(ev)

    def _line(self, line):
        if line == "":
            self.started = False
            if not self.data:
                self.type = ""
                return None
            ev = (self.last_id, self.type or "message", "\n".join(self.data))
            self.data, self.type = [], ""
            return ev
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        self.started = True
        if field == "data":
            self.data.append(value)
        elif field == "event":
            self.type = value
        elif field == "id" and "\0" not in value:
            self.last_id = value
        return None

    def partial(self):
        """True when the stream ended inside an event."""
        return bool(self.buf) or self.started


# ---------------------------------------------------------------------------------------------
# run directory


def write_json(path, obj):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_state(run_dir):
    path = os.path.join(run_dir, STATE_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise Failure("cannot read %s: %s" % (path, e.strerror))
    except ValueError as e:
        raise Failure("%s is not valid JSON: %s" % (path, e))


class Run:
    def __init__(self, run_dir, state):
        self.dir = run_dir
        self.state = state

    def save(self):
        self.state["updated_at"] = now_rfc3339()
        write_json(os.path.join(self.dir, STATE_FILE), self.state)


# ---------------------------------------------------------------------------------------------
# commands


def cmd_run():
    cfg = load_config()
    api = Api(cfg)
    run_dir = tempfile.mkdtemp(prefix="sbx-first-sandbox-")
    os.chmod(run_dir, 0o700)
    print("run directory: %s" % run_dir, flush=True)
    run = Run(run_dir, {
        "version": 1,
        "sbx_url": cfg["url"],
        "started_at": now_rfc3339(),
        "outcome": "in_progress",
    })
    try:
        return _walkthrough(api, run)
    except (Failure, KeyboardInterrupt) as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        run.state["outcome"] = "interrupted" if interrupted else "failed"
        run.state["failure"] = "interrupted" if interrupted else str(e)
        run.save()
        log("INTERRUPTED: an interrupted wait proves neither success nor failure" if interrupted
            else "FAILED: %s" % e)
        log("the run's state is kept in %s; reconcile before starting again:" % run_dir)
        log("  python3 %s inspect %s" % (sys.argv[0], run_dir))
        if run.state.get("sandbox_id"):
            log("  python3 %s delete %s" % (sys.argv[0], run_dir))
        return 130 if interrupted else 1


def _walkthrough(api, run):
    st = run.state

    # 1. Creation: the request is recorded before it is sent, so a retry can reuse the key.
    create_body = {"template": TEMPLATE, "resources": dict(RESOURCES)}
    st["create"] = {"request": create_body, "idempotency_key": str(uuid.uuid4()), "sent_at": now_rfc3339()}
    run.save()
    _, created, headers = api.mutate("POST", "/v1/sandboxes", create_body,
                                     st["create"]["idempotency_key"], ok=(202,))
    try:
        sandbox_id = created["sandbox"]["id"]
        create_op = created["operation"]
    except (KeyError, TypeError):
        raise Failure("POST /v1/sandboxes: 202 without sandbox.id and operation")
    st["sandbox_id"] = sandbox_id
    st["create"]["operation_id"] = create_op.get("id")
    st["create"]["request_id"] = headers.get("x-request-id")
    st["create"]["replayed"] = headers.get("idempotent-replayed") == "true"
    run.save()
    log("create accepted: sandbox %s, operation %s (accepted is not running yet)"
        % (sandbox_id, create_op.get("id")))

    # 2. Readiness: the operation must succeed and the sandbox must read `running`.
    create_op = api.wait_operation(create_op)
    sandbox = api.get("/v1/sandboxes/" + sandbox_id)
    if sandbox.get("state") != "running":
        raise Failure("sandbox %s is %r after its create operation succeeded, not running"
                      % (sandbox_id, sandbox.get("state")))
    log("sandbox %s is running" % sandbox_id)

    # 3. Execution: a session, then the attach that starts the process.
    session_body = {"argv": list(COMMAND)}
    st["session"] = {"request": session_body, "idempotency_key": str(uuid.uuid4()), "sent_at": now_rfc3339()}
    run.save()
    _, session, _ = api.mutate("POST", "/v1/sandboxes/%s/sessions" % sandbox_id, session_body,
                               st["session"]["idempotency_key"], ok=(201,))
    try:
        session_id = session["session_id"]
        attach_url = session["attach"]["url"]
        attach_token = session["attach"]["token"]  # session-scoped; never written to disk
    except (KeyError, TypeError):
        raise Failure("POST sessions: 201 without session_id and attach {url, token}")
    st["session"]["session_id"] = session_id
    st["session"]["attach_url"] = attach_url
    st["transcripts"] = [TRANSCRIPTS["stdout"], TRANSCRIPTS["stderr"]]
    run.save()

    # 4. Result: output is decoded and saved as it arrives.
    out = {"stdout": bytearray(), "stderr": bytearray()}
    seen = {"exit": None, "problems": [], "last_id": None}
    files = {name: os.fdopen(os.open(os.path.join(run.dir, TRANSCRIPTS[name]),
                                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
             for name in out}
    try:
        def on_event(event_id, kind, data):
            if event_id:
                seen["last_id"] = event_id
            try:
                payload = json.loads(data)
            except ValueError:
                seen["problems"].append("event %s (%s) has invalid JSON" % (event_id, kind))
                return False
            if kind in ("stdout", "stderr"):
                try:
                    chunk = base64.b64decode(payload["data_b64"], validate=True)
                except (KeyError, TypeError, ValueError):
                    seen["problems"].append("event %s has invalid data_b64" % event_id)
                    return False
                out[kind] += chunk
                files[kind].write(chunk)
                files[kind].flush()
            elif kind == "resync_required":
                seen["problems"].append("resync_required (output was lost): %s" % data)
            elif kind == "error":
                seen["problems"].append("error event: %s: %s"
                                        % (payload.get("code"), payload.get("message")))
                return False
            elif kind == "process_exited":
                seen["exit"] = payload
                return False  # always the last event
            return True

        ended_mid_event = api.attach(attach_url, attach_token, on_event)
    finally:
        for f in files.values():
            f.close()
    stdout = out["stdout"].decode("utf-8", "replace")
    stderr = out["stderr"].decode("utf-8", "replace")
    st["session"]["last_event_id"] = seen["last_id"]
    run.save()
    if seen["problems"]:
        raise Failure("session %s: %s" % (session_id, "; ".join(seen["problems"])))
    if seen["exit"] is None:
        raise Failure("session %s: the stream ended without process_exited%s (last event id %s); "
                      "do not infer success; the process may still be running"
                      % (session_id, " in the middle of an event" if ended_mid_event else "",
                         seen["last_id"]))
    exit_code = seen["exit"].get("exit_code")
    if exit_code != 0:
        raise Failure("session %s: the command did not succeed: exit_code=%r signal=%r "
                      "timed_out=%r oom_killed=%r; stderr: %s"
                      % (session_id, exit_code, seen["exit"].get("signal"),
                         seen["exit"].get("timed_out"), seen["exit"].get("oom_killed"),
                         stderr.strip()[-500:]))
    sys.stdout.write(stdout)
    print("exit code: %d" % exit_code, flush=True)

    # 5. Cleanup: delete and wait for the delete operation to finish.
    st["delete"] = {"idempotency_key": str(uuid.uuid4()), "sent_at": now_rfc3339()}
    run.save()
    _, deleted, _ = api.mutate("DELETE", "/v1/sandboxes/" + sandbox_id, None,
                               st["delete"]["idempotency_key"], ok=(202,))
    delete_op = (deleted or {}).get("operation") or {}
    st["delete"]["operation_id"] = delete_op.get("id")
    run.save()
    if not delete_op.get("id"):
        raise Failure("DELETE /v1/sandboxes/%s: 202 without an operation" % sandbox_id)
    delete_op = api.wait_operation(delete_op)
    final = api.get("/v1/sandboxes/" + sandbox_id)
    if final.get("state") != "deleted":
        raise Failure("sandbox %s is %r after its delete operation succeeded"
                      % (sandbox_id, final.get("state")))

    record = {
        "sbx_url": run.state["sbx_url"],
        "sandbox_id": sandbox_id,
        "operations": {"create": create_op.get("id"), "delete": delete_op.get("id")},
        "session_id": session_id,
        "template": sandbox.get("template"),
        "template_digest": sandbox.get("template_digest"),
        "runtime": sandbox.get("runtime"),
        "requested_resources": sandbox.get("resources"),
        "effective_resources": sandbox.get("effective_resources"),
        "command": list(COMMAND),
        "command_deadline": None,  # no server-side timeout_s was requested
        "client_stream_read_timeout_s": STREAM_READ_TIMEOUT_S,
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": exit_code,
        "signal": seen["exit"].get("signal"),
        "artifacts": [os.path.join(run.dir, name) for name in (RECORD_FILE, STATE_FILE)]
                     + [os.path.join(run.dir, t) for t in st["transcripts"]],
        "cleanup": {
            "delete_operation_state": delete_op.get("state"),
            "sandbox_final_state": final.get("state"),
        },
    }
    write_json(os.path.join(run.dir, RECORD_FILE), record)
    st["outcome"] = "succeeded"
    run.save()
    print(json.dumps(record, indent=2, sort_keys=True), flush=True)
    return 0


def _fetch(api, path):
    try:
        return api.get(path)
    except ApiError as e:
        if e.status == 404:
            return {"not_found": True, "note": "404 is not proof of deletion", "request_id": e.request_id}
        return {"error": str(e)}


def cmd_inspect(run_dir):
    state = load_state(run_dir)
    api = Api(load_config())
    report = {"run_dir": run_dir, "outcome": state.get("outcome"), "failure": state.get("failure")}
    sandbox_id = state.get("sandbox_id")
    if not sandbox_id:
        report["note"] = ("no sandbox id was recorded: the create request may not have been "
                          "answered; a retry must reuse state.json's create.idempotency_key")
        report["create_request"] = state.get("create")
    else:
        report["sandbox"] = _fetch(api, "/v1/sandboxes/" + sandbox_id)
    ops = {}
    for kind in ("create", "delete"):
        op_id = (state.get(kind) or {}).get("operation_id")
        if op_id:
            ops[kind] = _fetch(api, "/v1/operations/" + op_id)
    report["operations"] = ops
    session_id = (state.get("session") or {}).get("session_id")
    if session_id:
        report["session"] = _fetch(api, "/v1/sessions/" + session_id)
        report["note_session"] = ("the session is not durable output storage: the transcripts in "
                                  "RUN_DIR hold what was received")
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def cmd_delete(run_dir, yes):
    state = load_state(run_dir)
    run = Run(run_dir, state)
    sandbox_id = state.get("sandbox_id")
    if not sandbox_id:
        raise Failure("state.json names no sandbox; if the create was sent but not answered, "
                      "inspect first (python3 %s inspect %s)" % (sys.argv[0], run_dir))
    api = Api(load_config())
    if not yes:
        if not sys.stdin.isatty():
            raise Failure("refusing to delete %s without --yes (stdin is not a terminal)"
                          % sandbox_id)
        answer = input("Delete sandbox %s and remove this run's transcripts? [y/N] " % sandbox_id)
        if answer.strip().lower() not in ("y", "yes"):
            print("not deleted")
            return 1
    delete = state.get("delete") or {}
    if not delete.get("idempotency_key"):
        delete = {"idempotency_key": str(uuid.uuid4()), "sent_at": now_rfc3339()}
        state["delete"] = delete
        run.save()
    try:
        _, body, headers = api.mutate("DELETE", "/v1/sandboxes/" + sandbox_id, None,
                                      delete["idempotency_key"], ok=(202,))
    except ApiError as e:
        if e.status == 404:
            raise Failure("sandbox %s: not found (not proof of deletion: check SBX_URL and the "
                          "token's tenant) (request %s)" % (sandbox_id, e.request_id))
        raise
    op = (body or {}).get("operation") or {}
    if not op.get("id"):
        raise Failure("DELETE /v1/sandboxes/%s: 202 without an operation" % sandbox_id)
    delete["operation_id"] = op["id"]
    run.save()
    op = api.wait_operation(op)
    final = api.get("/v1/sandboxes/" + sandbox_id)
    removed = []
    if final.get("state") == "deleted":
        for name in state.get("transcripts") or []:
            path = os.path.join(run_dir, os.path.basename(name))
            if os.path.exists(path):
                os.remove(path)
                removed.append(path)
        state["transcripts"] = []
    state["deleted"] = {"operation_state": op.get("state"), "sandbox_state": final.get("state"),
                        "at": now_rfc3339()}
    run.save()
    print(json.dumps({
        "sandbox_id": sandbox_id,
        "delete_operation": {"id": op.get("id"), "state": op.get("state"),
                             "completed_at": op.get("completed_at")},
        "sandbox_final_state": final.get("state"),
        "replayed": headers.get("idempotent-replayed") == "true",
        "removed_transcripts": removed,
        "kept": [os.path.join(run_dir, STATE_FILE)]
                + ([os.path.join(run_dir, RECORD_FILE)]
                   if os.path.exists(os.path.join(run_dir, RECORD_FILE)) else []),
    }, indent=2, sort_keys=True))
    if final.get("state") != "deleted":
        raise Failure("sandbox %s is %r after its delete operation succeeded"
                      % (sandbox_id, final.get("state")))
    return 0


USAGE = """usage: first_sandbox.py                   create a sandbox, run a greeting, delete it
       first_sandbox.py inspect RUN_DIR   show the sandbox, operations and session of a run
       first_sandbox.py delete RUN_DIR [--yes]"""


def main(argv):
    try:
        if not argv:
            return cmd_run()
        if argv[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        if argv[0] == "inspect" and len(argv) == 2:
            return cmd_inspect(argv[1])
        if argv[0] == "delete" and len(argv) in (2, 3):
            flags = argv[2:]
            if flags and flags != ["--yes"]:
                sys.stderr.write(USAGE + "\n")
                return 2
            return cmd_delete(argv[1], bool(flags))
        sys.stderr.write(USAGE + "\n")
        return 2
    except Failure as e:
        log("FAILED: %s" % e)
        return 1
    except KeyboardInterrupt:
        log("interrupted: an interrupted wait is not evidence of success or deletion; "
            "inspect the run directory's state before repeating anything")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

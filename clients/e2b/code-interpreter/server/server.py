#!/usr/bin/env python3
"""sbx's code interpreter: the HTTP API that the E2B code-interpreter SDKs call on port 49999
(Python `e2b-code-interpreter`, JavaScript `@e2b/code-interpreter`), over Jupyter kernels run
with jupyter_client and ipykernel.

  POST   /execute                {"code", "context_id"?, "language"?, "env_vars"?}
         -> 200, NDJSON lines: stdout, stderr, result, error, number_of_executions,
            keepalive (every KEEPALIVE_S while nothing else comes), end_of_execution
  POST   /contexts               {"language"?, "cwd"?} -> {"id", "language", "cwd"}
  GET    /contexts               -> [{"id", "language", "cwd"}, ...]
  DELETE /contexts/{id}          -> 204
  POST   /contexts/{id}/restart  -> 204
  GET    /health                 -> 200 "OK" once the default context is up, 503 before

Errors are JSON `{"code": status, "message"}`. There is no authentication here: sbxd's port
relay admits only the sandbox's owner or the holder of its traffic token.

Environment: SBX_CI_PORT (49999), SBX_CI_HOST (0.0.0.0), SBX_CI_MAX_CONTEXTS (16),
SBX_CI_KERNEL_START_S (60), SBX_CI_SANDBOX_ENV (/run/sbx/e2b/env.json: the sandbox's env as
sbxd writes it at the create, which kernels take as envd's would).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import pwd
import queue
import re
import select
import socket
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.manager import KernelManager

LOG = logging.getLogger("sbx-code-interpreter")

PORT = int(os.environ.get("SBX_CI_PORT", "49999"))
HOST = os.environ.get("SBX_CI_HOST", "0.0.0.0")
# Each kernel holds ~60-100 MiB; the sandbox's memory limit is the real bound, this one keeps a
# loop of create_code_context calls from ending in the OOM killer picking the server.
MAX_CONTEXTS = int(os.environ.get("SBX_CI_MAX_CONTEXTS", "16"))
KERNEL_START_S = float(os.environ.get("SBX_CI_KERNEL_START_S", "60"))
MAX_BODY = 16 << 20
MAX_CONNECTIONS = 64
# Without a write now and then, a client that went away is only noticed when the code ends:
# a keepalive line (ignored by both SDKs, as E2B's own server sends it) finds out sooner.
KEEPALIVE_S = 5.0
POLL_S = 0.25
# How long an interrupted or finished execution may take to report idle before it is left.
DRAIN_S = 10.0
SOCKET_TIMEOUT_S = 60.0
LANGUAGES = {"python": "python", "python3": "python", "py": "python"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# ipykernel options: plain tracebacks (the SDKs show them as text) and IPython's inline
# matplotlib backend, so a figure comes back as a display_data with image/png.
KERNEL_ARGS = ["--InteractiveShell.colors=nocolor", "--PlainTextFormatter.max_seq_length=0"]
MIME_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf",
    "text/latex": "latex", "application/json": "json", "application/javascript": "javascript",
    "e2b/data": "data", "e2b/chart": "chart",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    pass


class ContextGone(Exception):
    """The context was restarted or removed while a request waited for it or ran in it."""

    def __init__(self, name: str, value: str):
        super().__init__(value)
        self.name = name
        self.value = value


# jupyter_client's synchronous managers run coroutines on a per-thread loop; starting and
# stopping kernels from many request threads at once is not something it promises to support.
_MANAGE = threading.Lock()


# The env envd would have given this server (E2B_SANDBOX, E2B_SANDBOX_ID, ... and the create's
# envs): sbxd writes it at the create, which for a sandbox from the warm pool is after this
# server and its first kernel started. Read again whenever the file changes.
SANDBOX_ENV_FILE = os.environ.get("SBX_CI_SANDBOX_ENV", "/run/sbx/e2b/env.json")
MAX_SANDBOX_ENV_BYTES = 1 << 20
_sandbox_env_lock = threading.Lock()
_sandbox_env_seen: tuple = (None, {})


def sandbox_env() -> dict[str, str]:
    global _sandbox_env_seen
    try:
        st = os.stat(SANDBOX_ENV_FILE)
    except OSError:
        return {}
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _sandbox_env_lock:
        if _sandbox_env_seen[0] == key:
            return _sandbox_env_seen[1]
    env: dict[str, str] = {}
    try:
        with open(SANDBOX_ENV_FILE, encoding="utf-8") as f:
            data = json.loads(f.read(MAX_SANDBOX_ENV_BYTES))
        if isinstance(data, dict):
            env = {k: v for k, v in data.items() if isinstance(k, str) and k and "=" not in k
                   and "\0" not in k and isinstance(v, str) and "\0" not in v}
    except (OSError, ValueError) as e:
        LOG.warning("%s: %s", SANDBOX_ENV_FILE, e)
    with _sandbox_env_lock:
        _sandbox_env_seen = (key, env)
    return env


def kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(sandbox_env())
    for k in ("SBX_CI_PORT", "SBX_CI_HOST", "SBX_CI_MAX_CONTEXTS", "SBX_CI_KERNEL_START_S"):
        env.pop(k, None)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    # debugpy (an ipykernel dependency) warns on every kernel start about frozen modules.
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


class Context:
    def __init__(self, language: str, cwd: str):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()  # one execution (or restart) at a time
        self.generation = 0  # bumped by restart and remove: a running execution stops
        self.removed = False
        self.km: KernelManager | None = None
        self.kc = None
        self.sandbox_env: dict[str, str] = {}  # what of sandbox_env() the kernel has

    def describe(self) -> dict:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self) -> None:
        with _MANAGE:
            km = KernelManager(kernel_name="python3")
            self.sandbox_env = sandbox_env()
            km.start_kernel(cwd=self.cwd, env=kernel_env(), extra_arguments=KERNEL_ARGS)
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=KERNEL_START_S)
        except RuntimeError as e:
            kc.stop_channels()
            with _MANAGE:
                km.shutdown_kernel(now=True)
            raise HttpError(500, f"the kernel did not start: {e}") from e
        self.km, self.kc = km, kc

    def stop(self) -> None:
        kc, km, self.kc, self.km = self.kc, self.km, None, None
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            with _MANAGE:
                km.shutdown_kernel(now=True)

    def alive(self) -> bool:
        km = self.km
        return km is not None and km.is_alive()

    def interrupt(self) -> None:
        km = self.km
        if km is not None:
            with _MANAGE:
                km.interrupt_kernel()

    def acquire(self, gen: int, tick=None) -> None:
        """Takes the context's lock, calling tick() while it waits (a client may go away)."""
        last = time.monotonic()
        while not self.lock.acquire(timeout=POLL_S):
            if self.generation != gen:
                raise self.gone()
            if tick is not None and time.monotonic() - last >= KEEPALIVE_S:
                tick()
                last = time.monotonic()
        if self.generation != gen:
            self.lock.release()
            raise self.gone()

    def gone(self) -> ContextGone:
        if self.removed:
            return ContextGone("ContextRemoved", f"Context {self.id} was removed")
        return ContextGone("ContextRestarting", "Context was restarted")


class Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}  # language -> id of its default context
        self.default_lock = threading.Lock()
        self.ready = threading.Event()

    def get(self, cid: str) -> Context:
        with self.lock:
            ctx = self.contexts.get(cid)
        if ctx is None:
            raise HttpError(404, f"Context {cid} not found")
        return ctx

    def list(self) -> list[dict]:
        with self.lock:
            return [c.describe() for c in self.contexts.values()]

    def create(self, language: str, cwd: str) -> Context:
        with self.lock:
            if len(self.contexts) >= MAX_CONTEXTS:
                raise HttpError(429, f"at most {MAX_CONTEXTS} contexts: remove one first")
            ctx = Context(language, cwd)
            # Counted while it starts, so that parallel creates cannot pass the bound.
            self.contexts[ctx.id] = ctx
        try:
            ctx.start()
        except BaseException:
            with self.lock:
                self.contexts.pop(ctx.id, None)
            raise
        LOG.info("context %s (%s, %s) started", ctx.id, language, cwd)
        return ctx

    def default(self, language: str) -> Context:
        # Serialised so that two first requests do not both start a default kernel.
        with self.default_lock:
            with self.lock:
                cid = self.defaults.get(language)
                ctx = self.contexts.get(cid) if cid else None
            if ctx is None:
                ctx = self.create(language, default_cwd())
                with self.lock:
                    self.defaults[language] = ctx.id
            return ctx

    def remove(self, cid: str) -> None:
        ctx = self.get(cid)
        with self.lock:
            ctx.removed = True
            ctx.generation += 1
            self.contexts.pop(cid, None)
        # A running execution sees the new generation within POLL_S and lets go of the lock.
        with ctx.lock:
            ctx.stop()
        LOG.info("context %s removed", cid)

    def restart(self, cid: str) -> None:
        ctx = self.get(cid)
        with self.lock:
            ctx.generation += 1
        with ctx.lock:
            if ctx.removed:
                raise HttpError(404, f"Context {cid} not found")
            ctx.stop()
            ctx.start()
        LOG.info("context %s restarted", cid)


REGISTRY = Registry()


def default_cwd() -> str:
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return home if os.path.isdir(home) else "/"


def language_of(value) -> str:
    if value is None:
        return "python"
    if not isinstance(value, str):
        raise HttpError(400, "language must be a string")
    lang = LANGUAGES.get(value.strip().lower())
    if lang is None:
        raise HttpError(400, f"language {value!r} is not supported here: only python")
    return lang


def result_of(data: dict, is_main: bool) -> dict:
    out: dict = {"type": "result", "is_main_result": is_main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            out[field] = value
    text = out.get("text")
    # E2B's server shows a string result without its repr quotes ('abc' -> abc); SDK users
    # compare execution.text against that.
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    if extra:
        out["extra"] = extra
    return out


def stamp(header: dict) -> str:
    date = header.get("date")
    if isinstance(date, datetime.datetime):
        return date.isoformat()
    return str(date) if date else datetime.datetime.now(datetime.timezone.utc).isoformat()


def env_snippets(env: dict[str, str]) -> tuple[str, str]:
    """Code that sets `env` in the kernel for one execution, and code that puts back what was."""
    keys = sorted(env)
    before = (f"import os as _sbx_os\n_sbx_env_before = {{k: _sbx_os.environ.get(k) for k in {keys!r}}}\n"
              f"_sbx_os.environ.update({env!r})\n")
    after = ("for _sbx_k, _sbx_v in _sbx_env_before.items():\n"
             "    if _sbx_v is None: _sbx_os.environ.pop(_sbx_k, None)\n"
             "    else: _sbx_os.environ[_sbx_k] = _sbx_v\n"
             "del _sbx_env_before, _sbx_k, _sbx_v, _sbx_os\n")
    return before, after


class Execution:
    """One /execute in a context whose lock the caller holds."""

    def __init__(self, ctx: Context, gen: int, emit, keepalive, client_open):
        self.ctx, self.gen = ctx, gen
        self.emit, self.keepalive, self.client_open = emit, keepalive, client_open

    def run(self, code: str, env: dict[str, str] | None) -> None:
        senv = sandbox_env()
        if senv != self.ctx.sandbox_env:
            # For good, unlike a run's own env_vars: the kernel started before the create.
            self.silent(f"import os as _sbx_os\n_sbx_os.environ.update({senv!r})\ndel _sbx_os\n")
            self.ctx.sandbox_env = senv
        if env:
            before, after = env_snippets(env)
            self.silent(before)
            try:
                self.main(code)
            finally:
                if self.ctx.generation == self.gen and self.ctx.alive():
                    self.silent(after)
        else:
            self.main(code)

    def silent(self, code: str) -> None:
        msg_id = self.ctx.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        self.follow(msg_id, lambda msg: None)

    def main(self, code: str) -> None:
        msg_id = self.ctx.kc.execute(code, silent=False, store_history=True, allow_stdin=False,
                                     stop_on_error=True)
        errored = False

        def on(msg: dict) -> None:
            nonlocal errored
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                self.emit({"type": "stdout" if content.get("name") == "stdout" else "stderr",
                           "text": content.get("text", ""), "timestamp": stamp(msg["header"])})
            elif kind in ("display_data", "update_display_data"):
                self.emit(result_of(content.get("data", {}), False))
            elif kind == "execute_result":
                self.emit(result_of(content.get("data", {}), True))
            elif kind == "execute_input":
                self.emit({"type": "number_of_executions",
                           "execution_count": content.get("execution_count")})
            elif kind == "error" and not errored:
                errored = True
                self.emit({"type": "error", "name": content.get("ename", ""),
                           "value": content.get("evalue", ""),
                           "traceback": ANSI.sub("", "\n".join(content.get("traceback", [])))})

        self.follow(msg_id, on)

    def follow(self, msg_id: str, on) -> None:
        """Passes the kernel's messages for msg_id to `on` until the kernel is idle again."""
        kc, last_write = self.ctx.kc, time.monotonic()
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                if self.ctx.generation != self.gen:
                    raise self.ctx.gone()
                if not self.ctx.alive():
                    raise ContextGone("KernelDied", "The kernel of this context died: its state "
                                      "is lost, the next execution starts a new one")
                try:
                    if not self.client_open():
                        raise ClientGone()
                    if time.monotonic() - last_write >= KEEPALIVE_S:
                        self.keepalive()
                        last_write = time.monotonic()
                except ClientGone:
                    self.abandon(msg_id)
                    raise
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                if msg["content"].get("execution_state") == "idle":
                    self.reply(msg_id)
                    return
                continue
            try:
                on(msg)
            except ClientGone:
                self.abandon(msg_id)
                raise
            last_write = time.monotonic()

    def reply(self, msg_id: str) -> None:
        # The shell reply comes with (or just before) idle; reading it keeps the shell socket's
        # queue from growing with every execution.
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            try:
                msg = self.ctx.kc.get_shell_msg(timeout=POLL_S)
            except queue.Empty:
                if not self.ctx.alive():
                    return
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return

    def abandon(self, msg_id: str) -> None:
        """The client went away: stop the code, so the context is free for the next request."""
        LOG.info("client gone during execution in %s: interrupting the kernel", self.ctx.id)
        self.ctx.interrupt()
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and self.ctx.alive():
            try:
                msg = self.ctx.kc.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                continue
            if (msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"].get("execution_state") == "idle"):
                self.reply(msg_id)
                return


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sbx-code-interpreter/1"
    timeout = SOCKET_TIMEOUT_S

    def log_message(self, fmt, *args):
        LOG.debug("%s %s", self.address_string(), fmt % args)

    def handle(self):
        if not self.server.slots.acquire(blocking=False):
            # Past the bound a connection is answered and closed at once, never queued.
            body = b'{"code": 503, "message": "too many connections"}'
            try:
                self.wfile.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            return
        try:
            super().handle()
        finally:
            self.server.slots.release()

    # ---- plumbing ------------------------------------------------------------------------------

    def send_json(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_empty(self, status: int = 204) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def fail(self, status: int, message: str) -> None:
        self.send_json(status, {"code": status, "message": message})

    def read_body(self) -> bytes:
        te = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in te:
            return self.read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise HttpError(400, "bad Content-Length")
        if n < 0 or n > MAX_BODY:
            self.close_connection = True
            raise HttpError(413, f"the body is over {MAX_BODY} bytes")
        data = self.rfile.read(n)
        if len(data) != n:
            self.close_connection = True
            raise HttpError(400, "the body ended early")
        return data

    def read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise HttpError(400, "bad chunk size")
            if size == 0:
                while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(out)
            if len(out) + size > MAX_BODY:
                self.close_connection = True
                raise HttpError(413, f"the body is over {MAX_BODY} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                self.close_connection = True
                raise HttpError(400, "the body ended early")
            out += chunk
            self.rfile.readline(8)

    def json_body(self) -> dict:
        raw = self.read_body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, f"the body is not JSON: {e}")
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a JSON object")
        return body

    def route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        try:
            if parts == ["health"]:
                self.only(method, "GET")
                return self.health()
            if parts == ["execute"]:
                self.only(method, "POST")
                return self.execute()
            if parts == ["contexts"]:
                self.only(method, "GET", "POST")
                return self.list_contexts() if method == "GET" else self.create_context()
            if len(parts) == 2 and parts[0] == "contexts":
                self.only(method, "DELETE")
                self.read_body()
                REGISTRY.remove(parts[1])
                return self.send_empty()
            if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
                self.only(method, "POST")
                self.read_body()
                REGISTRY.restart(parts[1])
                return self.send_empty()
            raise HttpError(404, f"no route {method} {path}")
        except HttpError as e:
            self.fail(e.status, e.message)
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a request must end with an answer, not a hang
            LOG.exception("%s %s failed", method, path)
            self.close_connection = True
            self.fail(500, f"{type(e).__name__}: {e}")

    def only(self, method: str, *allowed: str) -> None:
        if method not in allowed:
            raise HttpError(405, f"{method} is not allowed here (only {', '.join(allowed)})")

    do_GET = lambda self: self.route("GET")  # noqa: E731
    do_POST = lambda self: self.route("POST")  # noqa: E731
    do_DELETE = lambda self: self.route("DELETE")  # noqa: E731
    do_PUT = lambda self: self.route("PUT")  # noqa: E731
    do_PATCH = lambda self: self.route("PATCH")  # noqa: E731

    # ---- routes --------------------------------------------------------------------------------

    def health(self) -> None:
        if REGISTRY.ready.is_set():
            self.send_json(200, "OK")
        else:
            self.fail(503, "the default context is starting")

    def list_contexts(self) -> None:
        self.send_json(200, REGISTRY.list())

    def create_context(self) -> None:
        body = self.json_body()
        language = language_of(body.get("language"))
        cwd = body.get("cwd") or default_cwd()
        if not isinstance(cwd, str):
            raise HttpError(400, "cwd must be a string")
        if not os.path.isdir(cwd):
            raise HttpError(400, f"cwd {cwd!r} is not a directory")
        self.send_json(200, REGISTRY.create(language, cwd).describe())

    def execute(self) -> None:
        body = self.json_body()
        code = body.get("code")
        if not isinstance(code, str):
            raise HttpError(400, "code must be a string")
        cid, lang, env = body.get("context_id"), body.get("language"), body.get("env_vars")
        if cid is not None and not isinstance(cid, str):
            raise HttpError(400, "context_id must be a string")
        if cid and lang:
            raise HttpError(400, "Only one of context_id or language can be provided")
        if env is not None and (not isinstance(env, dict) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in env.items())):
            raise HttpError(400, "env_vars must be an object of strings")
        ctx = REGISTRY.get(cid) if cid else REGISTRY.default(language_of(lang))
        gen = ctx.generation

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(obj) -> None:
            line = json.dumps(obj).encode() + b"\n"
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            except OSError as e:
                raise ClientGone() from e

        keepalive = lambda: write({"type": "keepalive"})  # noqa: E731
        try:
            ctx.acquire(gen, keepalive)
        except ContextGone as e:
            write({"type": "error", "name": e.name, "value": e.value, "traceback": ""})
            return self.end_stream(write)
        try:
            if not ctx.alive():
                # Its kernel died (os._exit, the OOM killer) during an earlier execution, which
                # reported KernelDied: this one gets a new kernel, as Jupyter's restarter does.
                LOG.warning("context %s: the kernel is gone, starting a new one", ctx.id)
                ctx.stop()
                ctx.start()
            Execution(ctx, gen, write, keepalive, self.client_open).run(code, env)
        except ContextGone as e:
            write({"type": "error", "name": e.name, "value": e.value, "traceback": ""})
        except (ClientGone, BrokenPipeError, ConnectionResetError):
            raise
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the failure goes in the stream
            LOG.exception("execution in %s failed", ctx.id)
            write({"type": "error", "name": type(e).__name__,
                   "value": e.message if isinstance(e, HttpError) else str(e), "traceback": ""})
        finally:
            ctx.lock.release()
        self.end_stream(write)

    def client_open(self) -> bool:
        """False once the client has closed its side: a closed socket reads as EOF at once,
        where a write into it may still succeed (found only by the next one)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return True
            return self.connection.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def end_stream(self, write) -> None:
        write({"type": "end_of_execution"})
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, addr):
        super().__init__(addr, Handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)


def main() -> int:
    logging.basicConfig(level=os.environ.get("SBX_CI_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    os.environ.setdefault("HOME", pwd.getpwuid(os.getuid()).pw_dir)
    server = Server((HOST, PORT))
    LOG.info("listening on %s:%d", HOST, PORT)

    def warm():
        # The default context is started before /health passes, so the template's readiness
        # check holds the sandbox in `creating` until the first run_code can run at once.
        try:
            REGISTRY.default("python")
        except Exception as e:  # noqa: BLE001
            LOG.error("the default python context did not start: %s", e)
            os._exit(1)
        REGISTRY.ready.set()
        LOG.info("default python context ready")

    threading.Thread(target=warm, name="warm", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

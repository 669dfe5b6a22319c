"""The soak's parts: bookkeeping, the sampler of sbxd's RSS and fds, the load workers, the abuse
cases and the end-of-run checks. test_soak.py puts them together.

Every loop here ends by itself: workers start no new cycle past the deadline, every request
has a timeout, and every abuse case has a bounded count per run.
"""

from __future__ import annotations

import base64
import json
import os
import random
import select
import socket
import threading
import time
import traceback
from pathlib import Path

import hostcheck
import secutil
from sbx_client import ApiError, SbxClient, check_error_body
from ws_client import OP_BINARY, OP_CLOSE, OP_TEXT, WsClient

# ---- bookkeeping ------------------------------------------------------------------------------

MAX_ERRORS_KEPT = 200
MAX_FAILURES_PER_CASE = 10


class Stats:
    """Counts per operation and abuse case, and the errors, shared by every thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops: dict[str, dict] = {}
        self.cases: dict[str, dict] = {}
        self.errors: list[str] = []
        self.errors_total = 0

    def ok(self, op: str, n: int = 1) -> None:
        with self.lock:
            self.ops.setdefault(op, {"ok": 0, "failed": 0})["ok"] += n

    def fail(self, op: str, message: str) -> None:
        with self.lock:
            self.ops.setdefault(op, {"ok": 0, "failed": 0})["failed"] += 1
            self.errors_total += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {op}: {message[:800]}")

    def case(self, name: str) -> dict:
        with self.lock:
            return self.cases.setdefault(name, {"runs": 0, "passed": 0, "failed": 0, "failures": [],
                                                "seconds": 0.0, "notes": []})

    def case_done(self, name: str, seconds: float, failure: str | None, note: str | None = None) -> None:
        c = self.case(name)
        with self.lock:
            c["runs"] += 1
            c["seconds"] = round(c["seconds"] + seconds, 2)
            if failure is None:
                c["passed"] += 1
            else:
                c["failed"] += 1
                if len(c["failures"]) < MAX_FAILURES_PER_CASE:
                    c["failures"].append(f"run {c['runs']}: {failure[:1200]}")
            if note and len(c["notes"]) < 5:
                c["notes"].append(note[:300])


def describe(e: BaseException) -> str:
    if isinstance(e, AssertionError):
        return str(e) or "".join(traceback.format_exception_only(type(e), e)).strip()
    return "".join(traceback.format_exception_only(type(e), e)).strip()


# ---- sbxd's RSS and fds -----------------------------------------------------------------------

def vm_rss_kib(pid: int) -> int:
    return secutil.vm_rss_kib(pid)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def netns_fds(pid: int) -> int:
    """sbxd's descriptors that hold a network namespace (its ready pool)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("net:["):
                n += 1
        except OSError:
            pass
    return n


class Sampler(threading.Thread):
    """VmRSS and the fd count of sbxd once a second, until stop()."""

    def __init__(self, pid: int, interval: float = 1.0):
        super().__init__(name="soak-sampler", daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []  # (seconds since start, rss KiB, fds)
        self.t0 = time.monotonic()
        self._halt = threading.Event()
        self.lock = threading.Lock()

    def sample(self) -> tuple[int, int]:
        rss, fds = vm_rss_kib(self.pid), fd_count(self.pid)
        with self.lock:
            self.samples.append((round(time.monotonic() - self.t0, 1), rss, fds))
        return rss, fds

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                self.sample()
            except (OSError, AssertionError):
                return  # sbxd is gone: the run notices on its own

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def since(self, t: float) -> list[tuple[float, int, int]]:
        with self.lock:
            return [s for s in self.samples if s[0] >= t]

    def peak(self) -> tuple[int, int]:
        with self.lock:
            return (max((s[1] for s in self.samples), default=0), max((s[2] for s in self.samples), default=0))

    def now(self) -> float:
        return time.monotonic() - self.t0


# ---- the soak's context -----------------------------------------------------------------------

class Soak:
    """What every worker and case shares: sbxd, a client factory, the deadline and the stats."""

    def __init__(self, daemon, validator, stats: Stats, deadline: float, per_ip_cap: int,
                 header_timeout_s: int):
        self.daemon = daemon
        self.validator = validator
        self.stats = stats
        self.deadline = deadline
        self.per_ip_cap = per_ip_cap
        self.header_timeout_s = header_timeout_s
        self.port = int(daemon.url.rsplit(":", 1)[1])
        self.pid = daemon.proc.pid
        self.created: list[str] = []  # every sandbox id the soak made (shared by all clients)
        self.created_lock = threading.Lock()
        self.stop = threading.Event()
        self.pause_supported: bool | None = None
        # The long-lived sandboxes are paused now and then; a case that uses one holds this so
        # that it never meets a paused sandbox (a 409 that would be the soak's own doing).
        self.long_lived_lock = threading.Lock()
        self.sampler: Sampler | None = None

    def client(self) -> SbxClient:
        c = SbxClient(self.daemon.url, self.daemon.token, self.validator, timeout=60.0)
        c.created_sandboxes = self.created
        c._lock = self.created_lock
        return c

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def sbxd_alive(self) -> bool:
        return self.daemon.proc.poll() is None


def healthz(client: SbxClient, timeout: float = 10.0) -> None:
    body = client.call("GET", "/healthz", token=None, expect=200, timeout=timeout).body
    assert body == {"status": "ok"}, body


def run_ok(client: SbxClient, sid: str, argv: list, max_seconds: float = 60.0, **fields):
    r = client.run(sid, argv, max_seconds=max_seconds, **fields)
    assert r.exit == secutil.CLEAN_EXIT, f"{argv!r} in {sid}: exit {r.exit}, stderr {r.stderr[-300:]!r}"
    return r


def delete(client: SbxClient, sid: str, timeout: float = 120.0) -> None:
    op = client.delete_sandbox(sid, timeout=timeout)
    assert op["state"] == "succeeded", f"delete {sid}: {op}"


# ---- mixed load -------------------------------------------------------------------------------

def files_url(sid: str, what: str = "files") -> str:
    return f"/v1/sandboxes/{sid}/{what}"


def step(soak: Soak, op: str, fn, *args, **kwargs):
    """Runs one operation of the load; counts it and records a failure (returns None then)."""
    try:
        out = fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - every failure is recorded (pytest.fail too), the worker goes on
        soak.stats.fail(op, describe(e))
        return None
    soak.stats.ok(op)
    return out if out is not None else True


def op_stream_output(client: SbxClient, sid: str) -> None:
    n = random.randint(500, 3000)
    r = run_ok(client, sid, ["sh", "-c", f"i=0; while [ $i -lt {n} ]; do echo line-$i; echo err-$i >&2; "
                                         f"i=$((i+1)); done; head -c 65536 /dev/zero | tr '\\0' z"],
               keep_events=False)
    lines = r.stdout.split(b"\n")
    assert len(lines) == n + 1 and lines[0] == b"line-0" and lines[n - 1] == f"line-{n - 1}".encode(), \
        f"stdout: {len(lines)} lines, first {lines[:2]!r}"
    assert lines[n] == b"z" * 65536, f"tail of stdout: {len(lines[n])} bytes"
    err_lines = r.stderr.count(b"\n")
    assert err_lines == n, f"stderr: {err_lines} lines of {n}"


def op_stdin_sse(client: SbxClient, sid: str) -> None:
    data = os.urandom(random.randint(1, 200_000))
    session = client.create_session(sid, ["sh", "-c", "od -An -v -tx1 | tr -d ' \\n'"], stdin=True)
    ssid = session["session_id"]
    with client.attach(session) as stream:  # the attach starts the process
        for i in range(0, len(data), 64 << 10):
            client.call("POST", f"/v1/sessions/{ssid}/stdin", data=data[i:i + (64 << 10)],
                        headers={"Content-Type": "application/octet-stream"}, expect=204)
        client.call("POST", f"/v1/sessions/{ssid}/stdin:close", expect=204)
        r = client.collect(stream, max_seconds=60, keep_events=False)
    assert r.exit == secutil.CLEAN_EXIT, r.exit
    assert r.stdout == data.hex().encode(), f"stdin round trip: {len(r.stdout)} hex digits for {len(data)} bytes"


def op_stdin_ws(client: SbxClient, sid: str) -> None:
    data = os.urandom(random.randint(1, 100_000))
    session = client.create_session(sid, ["cat"], stdin=True)
    ws = WsClient(client.base_url, f"/v1/sessions/{session['session_id']}/ws", session["attach"]["token"], timeout=60)
    out = bytearray()
    exit_msg = None
    try:
        for i in range(0, len(data), 16 << 10):
            ws.send_binary(data[i:i + (16 << 10)])
        ws.send_json({"type": "stdin_close"})
        while exit_msg is None:
            op, payload = ws.recv()
            if op == OP_BINARY:
                out += payload
            elif op == OP_TEXT:
                msg = json.loads(payload)
                assert msg["type"] in ("exit", "stderr"), msg
                if msg["type"] == "exit":
                    exit_msg = msg
            elif op == OP_CLOSE:
                break
    finally:
        ws.close()
    assert exit_msg is not None and exit_msg["exit_code"] == 0, exit_msg
    assert bytes(out) == data, f"WebSocket cat: {len(out)} bytes back of {len(data)}"


def op_files(client: SbxClient, sid: str) -> None:
    d = f"/srv/soak-{random.randrange(1 << 30)}"
    blobs = {f"{d}/f{i}.bin": os.urandom(random.randint(0, 300_000)) for i in range(3)}
    for path, blob in blobs.items():
        client.call("PUT", files_url(sid), params={"path": path, "mkdirs": "true"}, data=blob,
                    headers={"Content-Type": "application/octet-stream"}, expect=200)
    for path, blob in blobs.items():
        got = client.call("GET", files_url(sid), params={"path": path}, expect=200).content
        assert got == blob, f"download of {path}: {len(got)} bytes, uploaded {len(blob)}"
    listing = client.call("GET", files_url(sid, "files:list"), params={"path": d}, expect=200).body
    names = sorted(e["name"] for e in listing["entries"])
    assert names == sorted(Path(p).name for p in blobs), listing
    client.call("DELETE", files_url(sid), params={"path": d, "recursive": "true"}, expect=200)


def lifecycle(client: SbxClient, sid: str, kind: str, want_state: str) -> None:
    op = client.call("POST", f"/v1/sandboxes/{sid}/{kind}", expect=202).body["operation"]
    op = client.wait_operation(op["id"], timeout=60)
    assert op["state"] == "succeeded", f"{kind} {sid}: {op}"
    state = client.get_sandbox(sid)["state"]
    assert state == want_state, f"after {kind}: {state}"


def op_pause_wake(client: SbxClient, sid: str) -> None:
    lifecycle(client, sid, "pause", "paused")
    lifecycle(client, sid, "wake", "running")
    run_ok(client, sid, ["true"])


def probe_pause(client: SbxClient, sid: str) -> bool:
    """Whether this runtime pauses (as POST pause tells: 501 not_implemented when it cannot)."""
    resp = client.call("POST", f"/v1/sandboxes/{sid}/pause", expect=(202, 501))
    if resp.status_code == 501:
        check_error_body(resp, resp.body, "not_implemented")
        return False
    op = client.wait_operation(resp.body["operation"]["id"], timeout=60)
    assert op["state"] == "succeeded", f"pause {sid}: {op}"
    lifecycle(client, sid, "wake", "running")
    return True


def load_worker(soak: Soak, index: int) -> None:
    """Until the deadline: create a sandbox, stream output, stdin over SSE and WebSocket, files,
    pause/wake where the runtime has it, delete."""
    client = soak.client()
    try:
        while soak.running():
            created = step(soak, "create", client.create_sandbox, {"labels": {"soak": "load", "worker": str(index)}})
            if created is None:
                time.sleep(1)
                continue
            sid = created["sandbox"]["id"]
            try:
                for _ in range(2):
                    step(soak, "session_output", op_stream_output, client, sid)
                    step(soak, "session_stdin_sse", op_stdin_sse, client, sid)
                    step(soak, "session_stdin_ws", op_stdin_ws, client, sid)
                    step(soak, "files", op_files, client, sid)
                    if not soak.running():
                        break
                if soak.pause_supported:
                    step(soak, "pause_wake", op_pause_wake, client, sid)
            finally:
                step(soak, "delete", delete, client, sid)
    finally:
        client.close()


def long_lived_worker(soak: Soak, sandbox_ids: list[str]) -> None:
    """Keeps the long-lived sandboxes busy: a command and a file round trip in each, in turn."""
    client = soak.client()
    try:
        i = 0
        while soak.running():
            sid = sandbox_ids[i % len(sandbox_ids)]
            i += 1
            step(soak, "long_lived_exec", run_ok, client, sid, ["sh", "-c", "echo alive; cat /etc/hostname >/dev/null"])
            step(soak, "long_lived_files", op_files, client, sid)
            if soak.pause_supported and i % 5 == 0:
                with soak.long_lived_lock:
                    step(soak, "long_lived_pause_wake", op_pause_wake, client, sid)
            soak.stop.wait(0.5)
    finally:
        client.close()


# ---- abuse cases ------------------------------------------------------------------------------
# Each takes the soak and a client, raises AssertionError when sbxd's answer is not the
# expected one, and may return a note for the report. Sandboxes they create they delete.

def _import_framing():
    # tests/e2e/test_http_framing.py: the corpus and its raw-socket exchange (imports
    # `conftest`, which is this suite's; it re-exports the names it needs).
    import test_http_framing
    return test_http_framing


def _import_untrusted_json():
    import test_untrusted_json
    return test_untrusted_json


def agent_pid(soak: Soak, sid: str) -> int:
    from test_agent import agent_pid as find  # tests/security
    return find(soak.daemon, sid)


def assert_agent_serves(client: SbxClient, soak: Soak, sid: str, pid: int) -> None:
    """The sandbox is `running`, its agent is the same live process, and it runs `true`."""
    sb = client.get_sandbox(sid)
    assert sb["state"] == "running", f"sandbox {sid} is {sb['state']}: {sb.get('error')}"
    assert Path(f"/proc/{pid}").exists() and agent_pid(soak, sid) == pid, f"the agent of {sid} (pid {pid}) is gone"
    run_ok(client, sid, ["true"])


def case_ws_deep_json(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 1: a 400,000-level resize and signal control message over the WebSocket: an
    error message and a 1008 close, the session unharmed, sbxd still serving."""
    uj = _import_untrusted_json()
    sid = random.choice(long_lived)
    for kind in ("resize", "signal"):
        session = client.create_session(sid, ["sleep", "100"], tty=kind == "resize")
        ssid = session["session_id"]
        if kind == "resize":
            text = '{"type":"resize","cols":10,"rows":' + uj.deep() + "}"
        else:
            text = '{"type":"signal","signal":' + uj.deep() + "}"
        uj.ws_refuses(client, ssid, text)
        st = client.get_session(ssid)["state"]
        assert st == "running", f"session after the refused {kind} message: {st}"
        client.call("POST", f"/v1/sessions/{ssid}/signal", json_body={"signal": "KILL"}, expect=204)
    healthz(client)
    run_ok(client, sid, ["true"])
    return ""


def _readable(socks: list[socket.socket], timeout_s: float) -> list[socket.socket]:
    """The sockets with something to read (data, or the peer's close); poll, since select()
    cannot take descriptors past 1023."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [by_fd[fd] for fd, _ in poller.poll(int(timeout_s * 1000))]


def case_idle_connections(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 2: connections that send nothing, from one address, up to just under its cap:
    sbxd holds them (no refusal) while /healthz and the API keep answering the others; then
    they are released."""
    n = soak.per_ip_cap - 16
    socks: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.3", 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", soak.port))
        # Nothing may have been answered or closed at once: that would be a refusal under the cap.
        refused = []
        for s in _readable(socks, 0.5):
            try:
                refused.append(s.recv(200))
            except OSError as e:
                refused.append(repr(e).encode())
        assert not refused, f"{len(refused)} of {n} idle connections refused under the per-address cap: {refused[:2]!r}"
        for _ in range(3):
            healthz(client, timeout=5)
            client.call("GET", "/v1/sandboxes", params={"page_size": "1"}, expect=200, timeout=10)
            time.sleep(0.5)
        # sbxd cuts them at the header deadline, not before (a loaded host may take that long
        # for the checks above: then there is nothing to assert here).
        closed = _readable(socks, 0)
        if time.monotonic() - t0 < soak.header_timeout_s - 1:
            assert not closed, f"{len(closed)} of {n} idle connections closed before the header deadline"
    finally:
        for s in socks:
            s.close()
    healthz(client)
    return f"{n} idle connections from 127.0.0.3 (per-address cap {soak.per_ip_cap})"


SMUGGLING_CASES = ("xchunked + CL 0", "chunked + CL", "obs-fold", "chunk extension 8 MiB")


def case_smuggling(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 3: ambiguous framings are refused with the corpus's status and the connection is
    closed, so the pipelined request behind them is never served."""
    hf = _import_framing()
    corpus = {c[0]: c for c in hf.CORPUS}
    for name in SMUGGLING_CASES:
        _, payload, status, stays_open = corpus[name]
        responses, closed, raw = hf.exchange(soak.port, payload + hf.PIPELINED, "127.0.0.4")
        assert closed, f"{name}: connection not closed: {raw[:300]!r}"
        assert responses and responses[0].status == status, f"{name}: expected {status}, got {responses!r}"
        assert len(responses) == 1, f"{name}: the bytes behind the refused request were served: {responses!r}"
        assert responses[0].headers.get("connection", "").lower() == "close", responses[0]
    healthz(client)
    return ""


def case_guest_signals(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 4: guest root's kill -TERM 1 and kill -INT 1 leave the agent serving."""
    sid = client.create_sandbox({"labels": {"soak": "abuse-signals"}})["sandbox"]["id"]
    try:
        pid = agent_pid(soak, sid)
        r = client.run(sid, ["sh", "-c", "kill -TERM 1; echo term=$?; kill -INT 1; echo int=$?"], max_seconds=60)
        time.sleep(0.3)  # a queued signal would have been handled by now
        assert_agent_serves(client, soak, sid, pid)
        return r.stdout.decode(errors="replace").replace("\n", " ").strip()
    finally:
        delete(client, sid)


def case_guest_oom(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 5: oom_score_adj 1000 on the agent, then a memory bomb in a 64 MiB sandbox: the
    bomb is OOM-killed, the agent is not."""
    sid = client.create_sandbox({"labels": {"soak": "abuse-oom"}, "resources": {"memory_mib": 64}})["sandbox"]["id"]
    try:
        pid = agent_pid(soak, sid)
        adj = client.run(sid, ["sh", "-c", "echo 1000 > /proc/1/oom_score_adj; echo rc=$?"], max_seconds=60)
        assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() != "1000", \
            "sandbox root made its agent the OOM killer's first choice"
        bomb = client.run(sid, ["python3", "-c", secutil.script("memory_bomb"), "512"], max_seconds=120,
                          keep_events=False)
        assert bomb.exit["oom_killed"], f"the memory bomb was not OOM-killed: {bomb.exit}"
        assert_agent_serves(client, soak, sid, pid)
        return "oom_score_adj write: " + adj.stdout.decode(errors="replace").strip()
    finally:
        delete(client, sid)


PROCESS_LIST_PROCS = 160
PROCESS_LIST_ARGV = 32_000
PROCESS_LIST_CONCURRENT = 4
# sbxd's RSS may grow by at most this much while the case runs. Unbounded, one reply grew it by
# 673 MiB and four by 1.4 GiB; a bounded reply (protocol/limits.h: 4 MiB per guest-sized reply)
# held by four requests at once stays well under it.
PROCESS_LIST_RSS_GROWTH_KIB = 128 << 10
# One reply's size: twice what the agent may send (protocol/limits.h, kMaxGuestReplyBytes), for
# sbxd's re-encoding; the unbounded reply was 14 MiB.
PROCESS_LIST_REPLY_BYTES = 8 << 20

# 160 processes whose argv is `sh -c 'read x' sh` and 32,000 empty strings: dash's `read` is a
# builtin, so each stays one small process (its argv in /proc/PID/cmdline) until the pipe on
# its stdin closes, which is when the spawner goes.
PROCESS_LIST_SPAWNER = f"""
import os, sys, time
r, w = os.pipe()
argv = ["sh", "-c", "read x", "sh"] + [""] * {PROCESS_LIST_ARGV}
for _ in range({PROCESS_LIST_PROCS}):
    if os.fork() == 0:
        os.dup2(r, 0)
        os.close(w)
        os.execv("/bin/sh", argv)
os.close(r)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    n = 0
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and open(f"/proc/{{p}}/cmdline", "rb").read().count(b"\\0") > {PROCESS_LIST_ARGV}:
                n += 1
        except OSError:
            pass
    if n >= {PROCESS_LIST_PROCS}:
        break
    time.sleep(0.2)
print("ready", n, flush=True)
time.sleep(600)
"""


def case_process_list(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 6: 160 processes with 32,000 empty argv entries each and four concurrent GET
    /processes: every answer is a bounded 200 (or 503 when sbxd sheds a concurrent reply), the
    agent survives and serves, sbxd's RSS stays within its bound."""
    sid = client.create_sandbox({"labels": {"soak": "abuse-processes"}})["sandbox"]["id"]
    try:
        pid = agent_pid(soak, sid)
        session = client.create_session(sid, ["python3", "-c", PROCESS_LIST_SPAWNER])
        stream = client.attach(session, timeout=120)
        try:
            first = None
            for ev in stream.events():
                if ev.event == "stdout":
                    first = base64.b64decode(ev.data["data_b64"])
                    break
                assert ev.event != "process_exited", f"the spawner exited early: {ev.data}"
            assert first is not None and first.startswith(b"ready"), f"spawner: {first!r}"
            ready = int(first.split()[1])
            assert ready >= PROCESS_LIST_PROCS, f"only {ready} of {PROCESS_LIST_PROCS} processes started"
            rss_before = vm_rss_kib(soak.pid)
            peak = [rss_before]
            answers: list = [None] * PROCESS_LIST_CONCURRENT
            done = threading.Event()

            def get(i: int) -> None:
                c = soak.client()
                try:
                    # Not validated against the contract here: an unbounded reply (millions
                    # of argv strings) would keep the validator busy for minutes. Its size
                    # and entry count are checked below instead.
                    resp = c.call("GET", f"/v1/sandboxes/{sid}/processes", expect=None, timeout=120,
                                  validate=False)
                    n = len(resp.body["processes"]) if resp.status_code == 200 else None
                    err = (resp.body or {}).get("error", {}) if resp.status_code != 200 else {}
                    code = f"{err.get('code')}: {str(err.get('message'))[:120]}" if err else None
                    answers[i] = (resp.status_code, n, len(resp.content), code)
                except Exception as e:  # noqa: BLE001 - reported below
                    answers[i] = ("error", describe(e))
                finally:
                    c.close()

            threads = [threading.Thread(target=get, args=(i,), daemon=True) for i in range(PROCESS_LIST_CONCURRENT)]
            for t in threads:
                t.start()

            def watch():
                while not done.wait(0.1):
                    try:
                        peak[0] = max(peak[0], vm_rss_kib(soak.pid))
                    except (OSError, AssertionError):
                        return
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            for t in threads:
                t.join(150)
            done.set()
            watcher.join(2)
        finally:
            stream.close()
        growth = peak[0] - rss_before
        # A dead agent fails its sandbox within a tick of sbxd's: give it a few.
        after = client.get_sandbox(sid)
        for _ in range(10):
            if after["state"] != "running" or all(a is not None and a[0] == 200 for a in answers):
                break
            time.sleep(0.5)
            after = client.get_sandbox(sid)
        note = (f"answers (status, entries, bytes, error code) {answers}; sbxd VmRSS {rss_before // 1024} MiB "
                f"-> peak {peak[0] // 1024} MiB (+{growth // 1024} MiB); sandbox then {after['state']}"
                + (f" ({after['error']['code']}: {after['error']['message'][:200]})" if after.get("error") else ""))
        bad = [a for a in answers if a is None or a[0] not in (200, 503)]
        assert not bad, f"GET /processes under the attack: {note}"
        assert any(a[0] == 200 for a in answers), f"no GET /processes answered 200: {note}"
        big = [a for a in answers if a[0] == 200 and (a[2] > PROCESS_LIST_REPLY_BYTES or a[1] > 4096)]
        assert not big, f"unbounded GET /processes replies (over {PROCESS_LIST_REPLY_BYTES >> 20} MiB or 4096 entries): {note}"
        assert growth <= PROCESS_LIST_RSS_GROWTH_KIB, \
            f"sbxd's RSS grew by {growth // 1024} MiB (bound {PROCESS_LIST_RSS_GROWTH_KIB // 1024} MiB): {note}"
        assert_agent_serves(client, soak, sid, pid)
        return note
    finally:
        delete(client, sid)


def case_uevent_socket(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 7: a NETLINK_KOBJECT_UEVENT socket is refused, and nothing of the other
    sandboxes' churn (the load creates and deletes them meanwhile) reaches the guest."""
    sid = random.choice(long_lived)
    _, out = secutil.run_script(client, sid, "netlink_events", 2, max_seconds=60)
    assert out["uevent_socket"] == "EPERM", f"socket(AF_NETLINK, SOCK_DGRAM, NETLINK_KOBJECT_UEVENT): {out['uevent_socket']}"
    assert not out["uevents"], f"the guest received host or neighbour uevents: {out['uevents'][:5]}"
    return ""


OVERSIZED = {"resources": {"memory_mib": 65536, "vcpu": 64, "disk_mib": 1048576}, "labels": {"soak": "oversized"}}


def case_oversized_create(soak: Soak, client: SbxClient, long_lived: list[str]) -> str:
    """Finding 8: a create the host cannot hold is 503 insufficient_capacity or 422
    exceeds_capacity, naming the resource, and creates nothing."""
    resp = client.call("POST", "/v1/sandboxes", json_body=OVERSIZED, expect=None)
    if resp.status_code == 202:
        sid = resp.body["sandbox"]["id"]
        with soak.created_lock:
            soak.created.append(sid)
        delete(client, sid)
        raise AssertionError(f"the oversized create was admitted: {resp.body}")
    assert resp.status_code in (503, 422), f"oversized create: {resp.status_code} {resp.body}"
    err = resp.body["error"]
    want = "insufficient_capacity" if resp.status_code == 503 else "exceeds_capacity"
    assert err["code"] == want and err.get("details", {}).get("resource"), err
    return f"{resp.status_code} {err['code']} ({err['details']['resource']})"


CASES = {
    "ws_deep_json": case_ws_deep_json,          # finding 1
    "idle_connections": case_idle_connections,  # finding 2
    "smuggling": case_smuggling,                # finding 3
    "guest_signals": case_guest_signals,        # finding 4
    "guest_oom": case_guest_oom,                # finding 5
    "process_list": case_process_list,          # finding 6
    "uevent_socket": case_uevent_socket,        # finding 7
    "oversized_create": case_oversized_create,  # finding 8
}
# A run repeats the cases round by round while there is time, but at most this often each
# (a 10-minute run fits about a dozen rounds); the first round always runs whole.
MAX_RUNS_PER_CASE = 20


def abuse_worker(soak: Soak, names: list[str], long_lived: list[str]) -> None:
    client = soak.client()
    try:
        rounds = 0
        while names and rounds < MAX_RUNS_PER_CASE and not soak.stop.is_set():
            if rounds > 0 and not soak.running():
                break
            rounds += 1
            for name in names:
                if rounds > 1 and not soak.running():
                    break
                soak.stats.case(name)
                t0 = time.monotonic()
                failure, note = None, None
                try:
                    with soak.long_lived_lock:
                        note = CASES[name](soak, client, long_lived) or None
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as e:  # noqa: BLE001 - a case's failure is its result (pytest.fail too)
                    failure = describe(e)
                # Whatever the case did, sbxd must still be the same live, healthy process.
                if not soak.sbxd_alive():
                    failure = (failure or "") + f" | sbxd died (exit {soak.daemon.proc.returncode})"
                else:
                    try:
                        healthz(client)
                    except Exception as e:  # noqa: BLE001
                        failure = (failure or "") + f" | /healthz after the case: {describe(e)}"
                soak.stats.case_done(name, time.monotonic() - t0, failure, note)
                if not soak.sbxd_alive():
                    soak.stop.set()
                    return
                soak.stop.wait(1.0)
    finally:
        client.close()


# ---- end of the run ---------------------------------------------------------------------------

def false_running(client: SbxClient) -> tuple[list[dict], dict]:
    """Every sandbox the API lists as running must run a new session of `true`. Returns the
    ones that did not, and the count per state of everything listed."""
    bad, states = [], {}
    for sb in client.list_sandboxes():
        states[sb["state"]] = states.get(sb["state"], 0) + 1
        if sb["state"] != "running":
            continue
        try:
            run_ok(client, sb["id"], ["true"], max_seconds=60)
        except Exception as e:  # noqa: BLE001
            bad.append({"id": sb["id"], "error": describe(e)[:500]})
    return bad, states


def loop_devices_mentioning(ids: list[str]) -> list[str]:
    found = []
    for dev in sorted(Path("/sys/block").glob("loop*")):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if any(sid in backing for sid in ids):
            found.append(f"{dev.name}: {backing}")
    return found


def links_mentioning(ids: list[str]) -> list[str]:
    """Network interfaces (veths) named after one of the sandboxes: a name holds at most 15
    characters, so the first 8 of the id's random part are what a name could carry."""
    keys = {sid.split("_", 1)[-1][:8] for sid in ids}
    found = []
    for dev in sorted(Path("/sys/class/net").iterdir()):
        try:
            alias = (dev / "ifalias").read_text().strip()
        except OSError:
            alias = ""
        if any(k in dev.name or k in alias for k in keys) or any(sid in alias for sid in ids):
            found.append(dev.name)
    return found


def leaks(ids: list[str], state_dir: Path) -> dict:
    """What is left on the host of the given (deleted) sandboxes: processes (sbx-agent and the
    guest's, found by cgroup and cmdline), mounts, cgroups, state directories, loop devices,
    network interfaces."""
    out = {}
    for sid in ids:
        left = hostcheck.leftovers(sid, state_dir)
        if left:
            out[sid] = {k: (v if k != "processes" else [f"{p['pid']} {p['state']} {p['cmdline'][:100]}" for p in v])
                        for k, v in left.items()}
    loops = loop_devices_mentioning(ids)
    if loops:
        out["loop_devices"] = loops
    links = links_mentioning(ids)
    if links:
        out["links"] = links
    return out

"""The Python SDK (`e2b`, sync API) against sbxd, through its documented public calls only, with
nothing but E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY pointing it at sbx (conftest.py).
Each test asserts on what the SDK returns and on the SDK's own exception classes; every sandbox
is killed in a finally, and the fixture checks that the tenant has none left afterwards."""
from __future__ import annotations

import base64
import contextlib
import time
import uuid
from datetime import datetime, timezone

import pytest

from e2b import (AuthenticationException, CommandExitException, FileNotFoundException,
                 FilesystemEventType, FileType, NotFoundException, PtySize, Sandbox,
                 SandboxException, SandboxQuery, SandboxState)

TIMEOUT_S = 120  # each sandbox's E2B timeout: a test that hangs does not leave it for long


@contextlib.contextmanager
def sandbox(**kw):
    """Sandbox.create(**kw), killed at the end even when the test fails."""
    sbx = Sandbox.create(**{"timeout": TIMEOUT_S, **kw})
    try:
        yield sbx
    finally:
        with contextlib.suppress(Exception):
            sbx.kill()


def until(what: str, check, timeout: float = 20.0, interval: float = 0.1):
    """Polls check() until it returns something true; fails naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"{what}: not within {timeout}s (last: {last!r})")


def read_or_empty(sbx, path: str) -> str:
    """The file's text, or "" while it does not exist yet."""
    from e2b.exceptions import FileNotFoundException
    try:
        return sbx.files.read(path)
    except FileNotFoundException:
        return ""


def pids(sbx) -> set[int]:
    return {p.pid for p in sbx.commands.list()}


# ---- lifecycle ---------------------------------------------------------------------------------

def test_create_with_metadata_and_envs(e2b_env):
    meta = {"suite": "e2b-python", "case": "create", "note": "a b&c=d"}
    with sandbox(metadata=meta, envs={"GREETING": "hello from envs", "N": "7"}) as sbx:
        assert sbx.sandbox_id
        assert sbx.is_running() is True
        r = sbx.commands.run('echo "$GREETING/$N"')
        assert (r.exit_code, r.stdout, r.stderr) == (0, "hello from envs/7\n", "")
        # What envd adds for every command; a command's own envs go over it.
        r = sbx.commands.run('echo "$E2B_SANDBOX $E2B_SANDBOX_ID $E2B_TEMPLATE_ID"')
        assert r.stdout == f"true {sbx.sandbox_id} base\n", r.stdout
        r = sbx.commands.run('echo "$E2B_SANDBOX"', envs={"E2B_SANDBOX": "mine"})
        assert r.stdout == "mine\n", r.stdout
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id
        assert info.metadata == meta
        assert info.state == SandboxState.RUNNING
        assert info.started_at <= datetime.now(timezone.utc) < info.end_at


def test_run_with_stdout_and_stderr_callbacks(e2b_env):
    out, err = [], []
    with sandbox() as sbx:
        r = sbx.commands.run("echo one; echo two >&2; echo three", on_stdout=out.append,
                             on_stderr=err.append)
        assert r.exit_code == 0
        assert r.stdout == "one\nthree\n" and "".join(out) == r.stdout
        assert r.stderr == "two\n" and "".join(err) == r.stderr


def test_nonzero_exit_raises_command_exit_exception(e2b_env):
    with sandbox() as sbx:
        with pytest.raises(CommandExitException) as ei:
            sbx.commands.run("echo partial; echo why >&2; exit 3")
        e = ei.value
        assert e.exit_code == 3
        assert e.stdout == "partial\n" and e.stderr == "why\n"


def test_env_and_cwd_per_command(e2b_env):
    with sandbox(envs={"A": "sandbox", "B": "sandbox"}) as sbx:
        sbx.files.make_dir("/tmp/work dir")
        r = sbx.commands.run('echo "$A $B"; pwd', envs={"A": "command"}, cwd="/tmp/work dir")
        assert r.stdout == "command sandbox\n/tmp/work dir\n"
        # The next command does not inherit the last one's.
        assert sbx.commands.run('echo "$A"; pwd', cwd="/tmp").stdout == "sandbox\n/tmp\n"


def test_background_command_and_reconnect(e2b_env):
    with sandbox() as sbx:
        h = sbx.commands.run("for i in $(seq 1 15); do echo tick $i; sleep 0.2; done; echo done",
                             background=True)
        assert h.pid > 0
        assert h.pid in pids(sbx)
        h.disconnect()
        # The process keeps running without a client; a new handle sees its later output.
        h2 = sbx.commands.connect(h.pid)
        assert h2.pid == h.pid
        seen = []
        r = h2.wait(on_stdout=seen.append)
        assert r.exit_code == 0
        assert r.stdout.endswith("tick 15\ndone\n"), r.stdout
        assert "".join(seen) == r.stdout
        until("the finished process leaves commands.list()", lambda: h.pid not in pids(sbx))


def test_kill_process(e2b_env):
    with sandbox() as sbx:
        h = sbx.commands.run("sleep 600", background=True)
        assert h.pid in pids(sbx)
        assert sbx.commands.kill(h.pid) is True
        with pytest.raises(CommandExitException) as ei:
            h.wait()
        assert ei.value.exit_code != 0
        until("the killed process leaves commands.list()", lambda: h.pid not in pids(sbx))
        assert sbx.commands.kill(h.pid) is False  # gone: the SDK's not_found
        h2 = sbx.commands.run("sleep 600", background=True)
        assert h2.kill() is True
        with pytest.raises(CommandExitException):
            h2.wait()


def test_stdin(e2b_env):
    with sandbox() as sbx:
        if hasattr(sbx.commands, "close_stdin"):
            # Newer SDKs: EOF through CloseStdin, so `cat` ends by itself.
            h = sbx.commands.run("cat; echo EOF", background=True, stdin=True)
            sbx.commands.send_stdin(h.pid, "line one\n")
            sbx.commands.send_stdin(h.pid, "line two\n")
            sbx.commands.close_stdin(h.pid)
            assert h.wait().stdout == "line one\nline two\nEOF\n"
        else:
            # e2b 2.21.1 has send_stdin but no close_stdin: the command reads what it needs.
            h = sbx.commands.run("head -n 2; echo EOF", background=True, stdin=True)
            sbx.commands.send_stdin(h.pid, "line one\n")
            sbx.commands.send_stdin(h.pid, "line two\n")
            assert h.wait().stdout == "line one\nline two\nEOF\n"


def test_pty(e2b_env):
    with sandbox() as sbx:
        # timeout: the stream's (and so the terminal's) deadline, which also bounds the reads.
        h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        assert h.pid in pids(sbx)
        sbx.pty.send_stdin(h.pid, b"stty size; echo marker-$((6*7))\n")
        # Read up to the marker before resizing: a resize racing the first `stty size` would
        # change what it prints. Iterating the handle yields its events as they come.
        chunks: list[bytes] = []
        for _stdout, _stderr, pty in h:
            if pty:
                chunks.append(pty)
            if b"marker-42" in b"".join(chunks):
                break
        assert b"marker-42" in b"".join(chunks), b"".join(chunks)
        sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(h.pid, b"stty size; exit 0\n")
        r = h.wait(on_pty=chunks.append)
        out = b"".join(chunks).decode(errors="replace")
        assert r.exit_code == 0
        assert "24 80" in out and "30 100" in out, out
        # A second terminal, killed through pty.kill.
        h2 = sbx.pty.create(PtySize(rows=10, cols=40), timeout=60)
        assert sbx.pty.kill(h2.pid) is True
        with pytest.raises(CommandExitException):
            h2.wait()


# ---- files -------------------------------------------------------------------------------------

def test_files_write_read_text_and_binary(e2b_env):
    with sandbox() as sbx:
        info = sbx.files.write("/tmp/acc/hello.txt", "hello world\nsecond line\n")
        assert info.path == "/tmp/acc/hello.txt" and info.name == "hello.txt"
        assert sbx.files.read("/tmp/acc/hello.txt") == "hello world\nsecond line\n"
        blob = bytes([0x00, 0x01, 0x02, 0xFA, 0xFF, 0x0A])
        sbx.files.write("/tmp/acc/blob.bin", blob)
        assert bytes(sbx.files.read("/tmp/acc/blob.bin", format="bytes")) == blob
        assert sbx.commands.run("od -An -tx1 /tmp/acc/blob.bin").stdout.split() == \
            ["00", "01", "02", "fa", "ff", "0a"]
        sbx.files.write("/tmp/acc/empty", "")
        assert sbx.files.read("/tmp/acc/empty") == ""
        with pytest.raises(FileNotFoundException):
            sbx.files.read("/tmp/acc/missing.txt")


def test_files_several_in_one_write(e2b_env):
    with sandbox() as sbx:
        entries = [{"path": "/tmp/multi/a.txt", "data": "alpha"},
                   {"path": "/tmp/multi/sub/b.txt", "data": "beta"},
                   {"path": "/tmp/multi/c.bin", "data": b"\x00\xff"}]
        infos = sbx.files.write_files(entries)
        assert sorted(i.path for i in infos) == sorted(e["path"] for e in entries)
        assert sbx.files.read("/tmp/multi/a.txt") == "alpha"
        assert sbx.files.read("/tmp/multi/sub/b.txt") == "beta"
        assert bytes(sbx.files.read("/tmp/multi/c.bin", format="bytes")) == b"\x00\xff"


def test_files_exists_make_dir_list_rename_remove(e2b_env):
    with sandbox() as sbx:
        d = "/tmp/tree"
        assert sbx.files.exists(d) is False
        assert sbx.files.make_dir(d) is True
        assert sbx.files.make_dir(d) is False  # already there
        assert sbx.files.exists(d) is True
        sbx.files.make_dir(f"{d}/inner")
        sbx.files.write(f"{d}/f.txt", "12345")
        entries = {e.name: e for e in sbx.files.list(d)}
        assert set(entries) == {"inner", "f.txt"}
        assert entries["inner"].type == FileType.DIR
        assert entries["f.txt"].type == FileType.FILE
        assert entries["f.txt"].size == 5 and entries["f.txt"].path == f"{d}/f.txt"
        # Owners by name, as envd gives them (`base` runs as root).
        assert (entries["f.txt"].owner, entries["f.txt"].group) == ("root", "root")
        assert sbx.files.get_info(d).owner == "root"
        moved = sbx.files.rename(f"{d}/f.txt", f"{d}/g.txt")
        assert moved.path == f"{d}/g.txt" and moved.name == "g.txt"
        assert sbx.files.exists(f"{d}/f.txt") is False
        assert sbx.files.read(f"{d}/g.txt") == "12345"
        sbx.files.remove(d)
        assert sbx.files.exists(d) is False
        with pytest.raises(NotFoundException):
            sbx.files.list(d)


def test_files_watch_dir(e2b_env):
    # The sync Python SDK watches through the polling RPCs (CreateWatcher, GetWatcherEvents,
    # RemoveWatcher).
    with sandbox() as sbx:
        d = "/tmp/watched"
        sbx.files.make_dir(d)
        w = sbx.files.watch_dir(d)
        try:
            sbx.files.write(f"{d}/new.txt", "x")
            sbx.commands.run(f"rm {d}/new.txt")
            events: list = []

            def got():
                events.extend(w.get_new_events())
                kinds = {e.type for e in events if e.name == "new.txt"}
                return FilesystemEventType.REMOVE in kinds and kinds & {
                    FilesystemEventType.CREATE, FilesystemEventType.WRITE}

            until("watch_dir events for new.txt (create/write, then remove)", got, timeout=15,
                  interval=0.2)
        finally:
            w.stop()
        with pytest.raises(SandboxException):
            w.get_new_events()  # stopped


# ---- listing, timeouts, pause ------------------------------------------------------------------

def test_list_with_metadata_filters(e2b_env):
    run = uuid.uuid4().hex[:12]
    with sandbox(metadata={"run": run, "n": "1", "owner": "a b&c"}) as one, \
            sandbox(metadata={"run": run, "n": "2"}) as two:
        def ids(query):
            p = Sandbox.list(query=query)
            out = []
            while p.has_next:
                out += [s.sandbox_id for s in p.next_items()]
            return out

        assert sorted(ids(SandboxQuery(metadata={"run": run}))) == \
            sorted([one.sandbox_id, two.sandbox_id])
        assert ids(SandboxQuery(metadata={"run": run, "n": "2"})) == [two.sandbox_id]
        # Values with spaces and & (the SDK percent-encodes them twice).
        assert ids(SandboxQuery(metadata={"owner": "a b&c"})) == [one.sandbox_id]
        assert ids(SandboxQuery(metadata={"run": "no-such-run"})) == []
        listed = Sandbox.list(query=SandboxQuery(metadata={"run": run, "n": "1"})).next_items()
        assert listed[0].metadata == {"run": run, "n": "1", "owner": "a b&c"}
        assert listed[0].state == SandboxState.RUNNING


def test_set_timeout_and_expiry(e2b_env):
    with sandbox(timeout=60) as sbx:
        sbx.set_timeout(600)
        left = (sbx.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
        assert 540 < left <= 600, left
        sbx.set_timeout(3)
        until("the sandbox expires 3 s after set_timeout(3)", lambda: not sbx.is_running(),
              timeout=40, interval=0.5)
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sbx.sandbox_id)
        assert Sandbox.kill(sbx.sandbox_id) is False


def test_pause_and_connect_keep_files_and_processes(e2b_env):
    with sandbox() as sbx:
        sbx.files.write("/tmp/state.txt", "kept across pause")
        h = sbx.commands.run("while true; do echo tick; date +%s%N >> /tmp/ticks; sleep 0.2; done",
                             background=True)
        until("the background process writes", lambda: sbx.commands.run(
            "wc -l < /tmp/ticks 2>/dev/null || echo 0").stdout.strip() not in ("", "0"))
        h.disconnect()
        sbx.pause()
        assert sbx.get_info().state == SandboxState.PAUSED
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in paused]
        sbx.connect()  # resumes it
        assert sbx.get_info().state == SandboxState.RUNNING
        assert sbx.files.read("/tmp/state.txt") == "kept across pause"
        assert h.pid in pids(sbx)
        before = int(sbx.commands.run("wc -l < /tmp/ticks").stdout)
        until("the process goes on writing after connect",
              lambda: int(sbx.commands.run("wc -l < /tmp/ticks").stdout) > before)
        # And its output goes on: a new handle reads a new line.
        h2 = sbx.commands.connect(h.pid)
        for stdout, _stderr, _pty in h2:
            if stdout and "tick" in stdout:
                break
        h2.disconnect()
        assert sbx.commands.kill(h.pid) is True


def test_connect_by_id_from_another_client(e2b_env):
    # What a second process (a worker, a serverless function) does with only the id.
    with sandbox(metadata={"case": "connect-by-id"}) as sbx:
        sbx.files.write("/tmp/from-first.txt", "first")
        other = Sandbox.connect(sbx.sandbox_id)
        assert other.sandbox_id == sbx.sandbox_id
        assert other.files.read("/tmp/from-first.txt") == "first"
        assert other.commands.run("echo second").stdout == "second\n"


def test_kill_then_not_found(e2b_env):
    sbx = Sandbox.create(timeout=TIMEOUT_S)
    try:
        sid = sbx.sandbox_id
        assert sbx.kill() is True
    finally:
        with contextlib.suppress(Exception):
            Sandbox.kill(sbx.sandbox_id)
    assert sbx.is_running() is False
    with pytest.raises(NotFoundException):
        Sandbox.connect(sid)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sid)
    assert Sandbox.kill(sid) is False
    assert sbx.kill() is False


# ---- errors ------------------------------------------------------------------------------------

def test_bad_api_key(e2b_env):
    for key in ("sbxm1_aaaaaaaaaaaaaaaaaaaa_" + "A" * 43, "not-a-key"):
        with pytest.raises(AuthenticationException):
            Sandbox.create(api_key=key, timeout=30)
        with pytest.raises(AuthenticationException):
            Sandbox.list(api_key=key).next_items()


def test_unknown_template(e2b_env):
    name = f"no-such-template-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxException) as ei:
        Sandbox.create(name, timeout=30)
    assert name in str(ei.value), str(ei.value)
    assert not isinstance(ei.value, AuthenticationException)


# ---- the code interpreter ----------------------------------------------------------------------

def test_run_code_with_a_plot(e2b_env, code_interpreter_template):
    from e2b_code_interpreter import Sandbox as CodeSandbox
    import httpx
    # The SDK's default template, unchanged; the create's envs reach its kernels (E2B's docs
    # show exactly this), whether its server started before the create (warm pool) or not.
    sbx = CodeSandbox.create(timeout=TIMEOUT_S, envs={"SBX_FROM_CREATE": "create-time"})
    try:
        try:
            ex = sbx.run_code("x = 6 * 7\nprint('out', x)\nx")
        except httpx.ConnectError as e:
            # e2b-code-interpreter up to 2.6.x reaches Jupyter at https://49999-<id>.<domain>
            # whatever E2B_SANDBOX_URL says (newer ones honour it); conftest.py's sbxd gives it
            # that name (TLS, e2b.test). If the name does not reach sbxd, say so rather than
            # leave a bare DNS or TLS error.
            pytest.fail(f"run_code could not connect to {sbx.get_host(49999)} ({e}): this "
                        "e2b-code-interpreter ignores E2B_SANDBOX_URL for the code interpreter's "
                        "port and needs that host name (DNS, TLS) to reach sbxd")
        assert ex.error is None, ex.error
        assert ex.logs.stdout == ["out 42\n"]
        assert ex.text == "42"
        ex = sbx.run_code("import os\nprint(os.environ.get('SBX_FROM_CREATE'), os.environ.get('E2B_SANDBOX'))")
        assert ex.logs.stdout == ["create-time true\n"], (ex.logs, ex.error)
        ex = sbx.run_code("print(os.environ['SBX_FROM_CREATE'])", envs={"SBX_FROM_CREATE": "per-run"})
        assert ex.logs.stdout == ["per-run\n"], (ex.logs, ex.error)
        assert sbx.run_code("print(os.environ['SBX_FROM_CREATE'])").logs.stdout == ["create-time\n"]
        ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
        assert ex.error is None, ex.error
        pngs = [r.png for r in ex.results if r.png]
        assert pngs, ex.results
        assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
        ex = sbx.run_code("1 / 0")
        assert ex.error is not None and ex.error.name == "ZeroDivisionError"
        ctx = sbx.create_code_context()
        sbx.run_code("y = 5", context=ctx)
        assert sbx.run_code("y * 2", context=ctx).text == "10"
    finally:
        with contextlib.suppress(Exception):
            sbx.kill()



# ---- on the microvm runtime ------------------------------------------------------------------------

def test_pause_of_a_microvm_sandbox_releases_its_memory(microvm_lab, tmp_path):
    """E2B's pause is sbx's suspend (docs/e2b.md): on a deployment whose default runtime is
    microvm, a sandbox of an image template is written to disk and its VMM exits, so the host
    has the guest's memory back while it is paused; connect resumes it where it stood (files
    and a process's memory). Driven by the SDK; checked on the host and through sbx's API."""
    import images
    from hostcheck import vm_processes

    mv = next(r for r in microvm_lab.admin.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
    if not mv["available"]:
        from conftest import skip_or_fail
        skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
    layout = tmp_path / "bb"
    images.write_layout(layout, [images.busybox_layer().bytes()], env=["PATH=/bin"])
    archive = images.docker_archive(layout, tmp_path / "bb.tar")
    resp = microvm_lab.admin.call("POST", "/v1/templates:import", params={"name": "bbvm-e2b"},
                                  data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                                  expect=202)
    op = microvm_lab.admin.wait_operation(resp.body["operation"]["id"], timeout=120)
    assert op["state"] == "succeeded", op
    from conftest import environment
    e2b_vars = {"E2B_API_URL": microvm_lab.url, "E2B_SANDBOX_URL": microvm_lab.url,
                "E2B_API_KEY": microvm_lab.key}
    with environment(e2b_vars):
        with sandbox(template="bbvm-e2b") as sbx:
            sid = sbx.sandbox_id.replace("sbx-", "sbx_", 1)  # E2B spells sbx's ids with a dash
            state_dir = microvm_lab.daemon.state_dir
            view = microvm_lab.sbx.call("GET", f"/v1/sandboxes/{sid}").body
            assert view.get("runtime") == "microvm", (sid, view)
            assert len(vm_processes(state_dir, sid)) == 2, "QEMU and its bridge"
            sbx.files.write("/tmp/state.txt", "kept across pause")
            # A counter in a shell's memory, through sbx's API (the image has no bash for E2B's
            # commands): after the resume it goes on from where it stood. Written aside and
            # renamed, so a read never meets the file truncated between two counts.
            r = microvm_lab.sbx.run(sid, ["sh", "-c", "(i=0; while true; do i=$((i+1)); "
                                                      "echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; "
                                                      "sleep 0.2; done) >/dev/null 2>&1 & echo started"])
            assert r.exit["exit_code"] == 0, r
            # The loop runs in the background: its first write may come after the session ended
            # (slow under TCG), so a file not there yet is "not yet".
            until("the counter counts", lambda: read_or_empty(sbx, "/tmp/n").strip() not in ("", "0"))
            sbx.pause()
            assert sbx.get_info().state == SandboxState.PAUSED
            assert vm_processes(state_dir, sid) == [], "paused, no VMM holds the guest's memory"
            # sbx's own view: suspended, the guest's state on disk in its place.
            assert microvm_lab.sbx.call("GET", f"/v1/sandboxes/{sid}").body["state"] == "suspended"
            assert (state_dir / "vm" / sid / "state").stat().st_size > 0
            sbx.connect()  # resumes it
            assert sbx.get_info().state == SandboxState.RUNNING
            assert len(vm_processes(state_dir, sid)) == 2
            assert sbx.files.read("/tmp/state.txt") == "kept across pause"
            first = int(sbx.files.read("/tmp/n"))
            assert first > 0
            until("the counter goes on after connect", lambda: int(sbx.files.read("/tmp/n")) > first)

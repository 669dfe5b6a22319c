"""sbxd's descriptors are close-on-exec: a program it starts (mke2fs for a new disk size, QEMU,
a helper) must not inherit a client's connection, the listening socket or a connection to an
agent. asio makes sockets without SOCK_CLOEXEC; sbxd marks them itself. Nothing it holds
lacks the flag even for a moment (fd_watch.py samples along a workload). And sbxd keeps
nothing its own parent left open."""

from __future__ import annotations

import base64
import http.client
import os
import select

import pytest

from conftest import Daemon, shutdown
from fd_watch import FdWatch, open_without_cloexec

def test_connections_listener_and_agent_sockets_are_close_on_exec(api, sbxd):
    sid = api.create_sandbox({"labels": {"e2e": "descriptors"}})["sandbox"]["id"]
    # While it is inspected: a session whose attach stream is open (a client connection, and
    # sbxd's connection to the agent), and a second, idle keep-alive connection.
    session = api.create_session(sid, ["sh", "-c", "echo ready; sleep 30"])
    stream = api.attach(session)
    idle = None
    try:
        first = next(stream.events())
        assert first.event == "stdout" and base64.b64decode(first.data["data_b64"]) == b"ready\n", first
        host, port = sbxd.url.split("//", 1)[1].rsplit(":", 1)
        idle = http.client.HTTPConnection(host, int(port.split("/")[0]), timeout=30)
        idle.request("GET", "/healthz")
        resp = idle.getresponse()
        resp.read()
        assert resp.status == 200
        assert open_without_cloexec(sbxd.proc.pid) == []
    finally:
        if idle is not None:
            idle.close()
        stream.close()
        api.call("POST", f"/v1/sessions/{session['session_id']}/signal",
                 json_body={"signal": "KILL"}, validate=False)


def test_sbxd_closes_what_its_parent_left_open(validator):
    """A shell's `out=$(sbxd ... &)`, or a supervisor that hands sbxd the write end of a pipe,
    waits for that pipe's end: sbxd must not hold it for its whole life."""
    r, w = os.pipe()
    daemon = Daemon(pass_fds=(w,))
    problems = []
    try:
        daemon.start()
        os.close(w)
        w = -1
        ready, _, _ = select.select([r], [], [], 30)
        assert ready, "the pipe's write end is still open in sbxd after it started listening"
        assert os.read(r, 1) == b"", "sbxd wrote into a descriptor it inherited"
        assert open_without_cloexec(daemon.proc.pid) == []
        assert "closed 1 descriptor(s) inherited from the parent" in daemon.log_path.read_text()
    finally:
        if w >= 0:
            os.close(w)
        os.close(r)
        problems = shutdown(daemon, validator, [])
    if problems:
        pytest.fail("stopping the test's sbxd: " + "; ".join(problems))


def test_nothing_sbxd_holds_along_a_workload_is_inheritable(api, sbxd):
    """Sampled all along: create, a session with output, files up and down, pause and wake,
    the metrics (which read /proc), the host's capacity (read on each admission), delete."""
    with FdWatch(sbxd.proc.pid) as watch:
        sid = api.create_sandbox({"labels": {"e2e": "descriptors"}})["sandbox"]["id"]
        try:
            r = api.run(sid, ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo done >&2"])
            assert r.exit["exit_code"] == 0 and len(r.stdout) == 100000, (r.exit, r.stderr)
            files = f"/v1/sandboxes/{sid}/files"
            body = os.urandom(1 << 20)
            api.call("PUT", files, params={"path": "/tmp/blob"}, data=body,
                     headers={"Content-Type": "application/octet-stream"}, expect=200)
            assert api.call("GET", files, params={"path": "/tmp/blob"}, expect=200).content == body
            for kind in ("pause", "wake"):
                op = api.call("POST", f"/v1/sandboxes/{sid}/{kind}", expect=202).body["operation"]
                assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded", op
            api.call("GET", "/metrics", expect=200, validate=False)
            api.list_sandboxes()
        finally:
            api.delete_sandbox(sid)
    assert watch.samples > 10, f"only {watch.samples} looks at sbxd's descriptors"
    assert sorted(watch.seen) == [], f"inheritable descriptors in sbxd ({watch.samples} looks)"


LIST_FDS = ("import os; fds = sorted(int(n) for n in os.listdir('/proc/self/fd')); "
            "print(' '.join(f'{n}:{os.readlink(f\"/proc/self/fd/{n}\")}' for n in fds[:-1] if n > 2))")


def test_a_sandbox_process_inherits_nothing_beyond_its_stdio(api, sandbox):
    """What the agent holds (its socket to sbxd, the event log, the pipes of other sessions)
    never reaches a session's process: plain, with stdin open, and beside a second session
    that is running. The listing's own directory descriptor is the last one and is left out."""
    sid = sandbox["id"]
    other = api.create_session(sid, ["sleep", "30"], stdin=True)
    running = api.attach(other)  # starts it
    try:
        for fields in ({}, {"stdin": True}, {"tty": True}):
            r = api.run(sid, ["/usr/bin/python3", "-c", LIST_FDS], **fields)
            assert r.exit["exit_code"] == 0, (r.exit, r.stderr)
            assert r.stdout.decode().strip() == "", f"{fields}: inherited {r.stdout.decode()}"
    finally:
        running.close()
        api.call("POST", f"/v1/sessions/{other['session_id']}/signal",
                 json_body={"signal": "KILL"}, validate=False)

"""Signals and ptrace: processes outside the sandbox, and the sandbox's own agent."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import time

import pytest

import secutil
from secutil import attack, run_script, sh


@pytest.fixture
def host_sleeper():
    """A host process that an escaped kill would hit."""
    p = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield p
    finally:
        p.kill()
        p.wait(10)


@attack("signals", "kill(-1, SIGKILL) as root: every process the caller may signal")
def test_kill_minus_one(api, host_sleeper):
    sb = api.create_sandbox({"labels": {"security": "kill-all"}})["sandbox"]
    # A second session that kill(-1) must take with it.
    victim = api.create_session(sb["id"], ["sh", "-c", "echo up; exec sleep 300"])
    with api.attach(victim) as stream:
        first = next(stream.events())
    assert first.event == "stdout" and base64.b64decode(first.data["data_b64"]) == b"up\n", first
    res = sh(api, sb["id"], "kill -9 -1; echo kill=$?")
    assert res.exit == secutil.CLEAN_EXIT and res.stdout == b"kill=0\n", \
        f"kill -9 -1: {res.exit} {res.stdout!r} {res.stderr!r}"
    # Attaching again replays the victim's output and, once it has ended, its exit.
    victim_result = api.collect(api.attach(victim["session_id"]), max_seconds=30)
    assert victim_result.exit is not None and victim_result.exit["signal"] == "SIGKILL", victim_result.exit
    # The agent (PID 1 of the sandbox) survived: the sandbox still runs new sessions.
    again = sh(api, sb["id"], "echo ok")
    assert again.exit == secutil.CLEAN_EXIT and again.stdout == b"ok\n", (again.exit, again.stdout)
    assert api.get_sandbox(sb["id"])["state"] == "running"
    assert host_sleeper.poll() is None, f"a host process died: exit {host_sleeper.returncode}"


@pytest.fixture(scope="module")
def signal_attack(sclient, target, sbxd):
    sleeper = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        host_pids = [sbxd.proc.pid, sleeper.pid, 1]
        out = run_script(sclient, target["id"], "signals", *host_pids)[1]
        time.sleep(0.1)
        alive = sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(10)
    return out, host_pids, alive


@attack("signals", "kill(0) and kill(SIGKILL) of host pids (sbxd's pid, a host sleep, host init)")
def test_signal_host_pids(signal_attack, sbxd, sclient, target):
    out, host_pids, sleeper_alive = signal_attack
    sbxd_pid, sleeper_pid, _init = host_pids
    # Host init's pid 1 is the sandbox's own agent inside; the others must not exist there.
    for pid in (sbxd_pid, sleeper_pid):
        r = out["host_pids"][str(pid)]
        assert r == {"exists_in_proc": False, "kill0": "ESRCH", "sigkill": "ESRCH"}, f"pid {pid}: {r}"
    assert sleeper_alive, "the host sleep process was killed from the sandbox"
    assert sbxd.proc.poll() is None, "sbxd was killed from the sandbox"
    # Pid 1 inside is the sandbox's own agent, whose credentials sandbox root does not share
    # (src/agent/identity.h): even kill(1, 0) is refused, and nothing dies.
    assert out["host_pids"]["1"] == {"exists_in_proc": True, "kill0": "EPERM", "sigkill": "EPERM"}, out["host_pids"]["1"]
    again = sh(sclient, target["id"], "echo ok")
    assert again.exit == secutil.CLEAN_EXIT and again.stdout == b"ok\n", "SIGKILL to PID 1 broke the sandbox"


@pytest.mark.parametrize("key", ["ptrace_attach_agent", "ptrace_seize_agent", "ptrace_attach_own_child",
                                 "process_vm_readv_agent"])
@attack("ptrace", "PTRACE_ATTACH/PTRACE_SEIZE of the agent and of an own child; process_vm_readv of the agent")
def test_ptrace_denied(signal_attack, key):
    out = signal_attack[0]
    assert out[key] == "EPERM", f"{key}: expected EPERM, got {out[key]}"


@pytest.fixture(scope="module")
def agent_proc_attack(sclient, target, sbxd):
    marker = "sbxsec-" + secrets.token_hex(6)
    out = run_script(sclient, target["id"], "agent_proc", marker)[1]
    return out, marker


@attack("agent", "reopen the agent's stdout/stderr (/proc/1/fd/1, a log file in the host's state "
                 "directory) and append to it: host disk writes outside any quota")
def test_agent_log_fd(agent_proc_attack, sbxd, target):
    out, marker = agent_proc_attack
    files = {fd: e for fd, e in out["fds"].items() if "open_append" in e}
    log = sbxd.state_dir / "sandboxes" / target["id"] / "agent.log"
    written = log.exists() and marker.encode() in log.read_bytes()
    # With the agent non-dumpable (the usual way to close /proc/1/fd to the sandbox) the
    # reopen fails with EACCES; then nothing reaches the host file.
    assert not written and files and all(e["open_append"] == "EACCES" for e in files.values()), \
        f"sandbox root reopened host files through the agent's fds ({'marker written to ' + str(log) if written else 'no write'}): {files}"


@attack("agent", "list the agent's fds (/proc/1/fd, /proc/1/task/1/fd): which sockets and files "
                 "PID 1 holds")
def test_agent_fd_list(agent_proc_attack):
    out, _ = agent_proc_attack
    # The agent's /proc files belong to host root (it is non-dumpable in the host's user
    # namespace): the directory itself cannot be read, not only its links.
    assert out["list_fds"] == "EACCES" and out["list_task_fds"] == "EACCES", \
        f"listdir(/proc/1/fd): {out['list_fds']}, listdir(/proc/1/task/1/fd): {out['list_task_fds']}"


@attack("agent", "open the agent's memory (/proc/1/mem) read-write to take over PID 1 and its "
                 "connection to sbxd")
def test_agent_memory(agent_proc_attack):
    out, _ = agent_proc_attack
    assert out["open_agent_mem_rdwr"] == "EACCES", \
        f"open(/proc/1/mem, O_RDWR): expected EACCES, got {out['open_agent_mem_rdwr']}"

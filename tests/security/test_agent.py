"""The agent (PID 1 of every sandbox) against sandbox root: nothing the guest does may make it
die or stop serving (signals, credentials-based tuning, OOM, fork bombs), since the API would
then report a sandbox that nobody runs. src/agent/identity.h explains the defence."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import secutil
from secutil import attack, run_script, sh


def agent_pid(sbxd, sandbox_id: str) -> int:
    """The agent's host pid, found by its --sandbox-id argument."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"sbx-agent") and b"--sandbox-id" in argv:
            i = argv.index(b"--sandbox-id")
            if i + 1 < len(argv) and argv[i + 1] == sandbox_id.encode():
                return int(entry)
    raise AssertionError(f"no sbx-agent process for {sandbox_id}")


def ioprio(pid: int) -> int:
    import ctypes
    import platform
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 252, "aarch64": 31}[platform.machine()]
    return libc.syscall(nr, 1, pid)  # ioprio_get(IOPRIO_WHO_PROCESS, pid)


def agent_state(pid: int) -> dict:
    """What a guest could try to change about its agent, read from the host."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    status = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
              for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line}
    return {
        "nice": int(fields[16]),            # field 19 of stat
        "policy": int(fields[38]),          # field 41
        "oom_score_adj": Path(f"/proc/{pid}/oom_score_adj").read_text().strip(),
        "limits": Path(f"/proc/{pid}/limits").read_text(),
        "cpus": status["Cpus_allowed_list"],
        "comm": Path(f"/proc/{pid}/comm").read_text().strip(),
        "ioprio": ioprio(pid),
        "autogroup": Path(f"/proc/{pid}/autogroup").read_text().strip(),
        "timerslack": Path(f"/proc/{pid}/timerslack_ns").read_text().strip(),
    }


def still_serves(client, sandbox_id: str) -> None:
    res = sh(client, sandbox_id, "echo ok", max_seconds=60)
    assert res.exit == secutil.CLEAN_EXIT and res.stdout == b"ok\n", \
        f"the sandbox no longer runs commands: {res.exit} {res.stdout!r} {res.stderr!r}"
    assert client.get_sandbox(sandbox_id)["state"] == "running"


@pytest.fixture(scope="module")
def creds_attack(sbxd, sclient):
    sb = sclient.create_sandbox({"labels": {"security": "agent-creds"}})["sandbox"]
    pid = agent_pid(sbxd, sb["id"])
    before = agent_state(pid)
    out = run_script(sclient, sb["id"], "agent_creds")[1]
    time.sleep(0.2)  # a queued signal would be handled by now: the agent's loop is event-driven
    yield {"sandbox": sb, "pid": pid, "before": before, "out": out}
    sclient.delete_sandbox(sb["id"])


@attack("agent", "kill(1, sig) for every signal 1..64 as sandbox root (SIGTERM and SIGINT were "
                 "fatal when the agent blocked them for a signalfd)")
def test_agent_survives_every_signal(creds_attack, sclient):
    out = creds_attack["out"]
    # The agent's credentials are not sandbox root's: the kernel refuses before any pid
    # namespace rule applies. SIGCONT may pass (same session) and does nothing.
    wrong = {sig: r for sig, r in out["signals"].items() if r != "EPERM" and not (sig == "18" and r == "OK")}
    assert not wrong, f"signals to PID 1 not refused: {wrong}"
    assert out["sigqueue_term_forged_pid0"] == "EPERM", out["sigqueue_term_forged_pid0"]
    if out["pidfd_open"] == "OK":
        assert out["pidfd_send_term"] == "EPERM" and out["pidfd_send_int"] == "EPERM", out
    assert Path(f"/proc/{creds_attack['pid']}").exists(), "the agent died"
    still_serves(sclient, creds_attack["sandbox"]["id"])


@attack("agent", "prlimit(1, NOFILE/AS/NPROC = 0), setpriority/sched_setscheduler/sched_setattr/"
                 "affinity/ioprio on PID 1 and on all of root's processes")
def test_agent_limits_and_scheduling(creds_attack, sclient):
    out = creds_attack["out"]
    for key in ("prlimit_nofile_0", "prlimit_as_0", "prlimit_nproc_0", "prlimit_read", "setpriority_pid1",
                "sched_idle", "sched_setattr_idle", "sched_setaffinity", "ioprio_idle"):
        assert out[key] == "EPERM", f"{key}: expected EPERM, got {out[key]}"
    # PID 1's group holds only the agent (sessions get groups of their own).
    assert out["setpriority_pgrp1"] in ("EPERM", "ESRCH"), out["setpriority_pgrp1"]
    # These act on every process of uid 0 in the sandbox: allowed, and the agent is not one.
    assert out["setpriority_user_root"] == "OK" and out["ioprio_user_root"] == "OK", out
    after = agent_state(creds_attack["pid"])
    assert after == creds_attack["before"], f"the agent's state changed: {creds_attack['before']} -> {after}"
    still_serves(sclient, creds_attack["sandbox"]["id"])


@attack("agent", "write /proc/1/oom_score_adj (1000), oom_adj, autogroup, timerslack_ns, comm, "
                 "clear_refs, coredump_filter, attr/current, uid_map, mem, environ")
def test_agent_proc_files(creds_attack):
    out = creds_attack["out"]
    # Some are mode 0666 by design (attr/current, timerslack_ns) and refuse the write itself.
    opened = {k: v for k, v in out["proc_writes"].items() if v == "opened:OK"}
    assert not opened, f"sandbox root opened the agent's /proc files for writing: {opened}"
    assert agent_state(creds_attack["pid"]) == creds_attack["before"]


@attack("agent", "a memory bomb in a 64 MiB sandbox after making itself the least killable "
                 "(oom_score_adj as low as allowed) and filling /dev/shm, so that the agent is the "
                 "largest process left")
def test_oom_cannot_take_the_agent(sbxd, sclient):
    sb = sclient.create_sandbox({"resources": {"memory_mib": 64}, "labels": {"security": "agent-oom"}})["sandbox"]
    try:
        pid = agent_pid(sbxd, sb["id"])
        fill = (
            "import os\n"
            "try:\n"  # what the outside battery did first: make the agent the OOM killer's choice
            "    open('/proc/1/oom_score_adj', 'w').write('1000')\n"
            "except OSError: pass\n"
            "for v in (-1000, -999, -500, 0, 500):\n"
            "    try:\n"
            "        open('/proc/self/oom_score_adj', 'w').write(str(v)); break\n"
            "    except OSError: pass\n"
            "print(open('/proc/self/oom_score_adj').read().strip(), flush=True)\n"
            "with open('/dev/shm/fill', 'wb') as f:\n"
            "    for i in range(256):\n"
            "        f.write(b'x' * (1 << 20)); f.flush()\n"
            "print('filled', flush=True)\n")
        r1 = sclient.run(sb["id"], ["python3", "-c", fill], max_seconds=120)
        bomb = "a = []\nwhile True:\n    a.append(bytearray(1 << 20))\n"
        r2 = sclient.run(sb["id"], ["python3", "-c", bomb], max_seconds=120)
        for r in (r1, r2):
            assert r.exit["signal"] == "SIGKILL" or r.exit["oom_killed"] or r.exit["exit_code"] not in (0, None), r.exit
        assert r2.exit["oom_killed"], f"the bomb was not reported as OOM-killed: {r2.exit}"
        assert Path(f"/proc/{pid}").exists() and agent_pid(sbxd, sb["id"]) == pid, "the OOM killer took the agent"
        # The tmpfs pages stay charged until removed; then the sandbox works as before.
        res = sh(sclient, sb["id"], "rm -f /dev/shm/fill; echo ok", max_seconds=60)
        assert res.stdout.endswith(b"ok\n"), (res.exit, res.stdout, res.stderr)
        still_serves(sclient, sb["id"])
    finally:
        sclient.delete_sandbox(sb["id"])


@attack("agent", "a fork bomb up to pids.max that keeps its processes: the agent must still start "
                 "sessions and serve files")
def test_fork_bomb_cannot_stop_the_agent(sbxd, sclient):
    sb = sclient.create_sandbox({"labels": {"security": "agent-pids"}})["sandbox"]
    try:
        bomb = sclient.create_session(sb["id"], ["python3", "-c",
            "import os, sys, time\n"
            "n = 0\n"
            "while True:\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(600); os._exit(0)\n"
            "        n += 1\n"
            "    except OSError as e:\n"
            "        print('held', n, e.errno, flush=True); break\n"
            "time.sleep(600)\n"])
        with sclient.attach(bomb) as stream:
            first = next(stream.events())
        assert first.event == "stdout" and b"held" in __import__("base64").b64decode(first.data["data_b64"]), first
        res = sclient.run(sb["id"], ["echo", "served"], max_seconds=60)
        assert res.exit == secutil.CLEAN_EXIT and res.stdout == b"served\n", (res.exit, res.stdout, res.stderr)
        got = sclient.call("GET", f"/v1/sandboxes/{sb['id']}/files", params={"path": "/etc/hostname"}, expect=200)
        assert got.status_code == 200
    finally:
        sclient.delete_sandbox(sb["id"])


# ---- issue 13, finding 6: guest-chosen replies are bounded in the agent ------------------------

# Forks `n` processes `sh -c 'sleep 600 & wait' x <k args of `size` bytes>` and exits: sh keeps
# its argv while it waits, and the orphans stay children of the agent.
SPAWN_ARGV = (
    "import os, sys\n"
    "n, k, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])\n"
    "args = ['sh', '-c', 'sleep 600 & wait', 'x'] + ['a' * size] * k\n"
    "import time\n"
    "pids = []\n"
    "for i in range(n):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.execvp('sh', args)\n"
    "    pids.append(pid)\n"
    "# Listed only once every child has exec'd: before that its argv is still python's.\n"
    "deadline = time.monotonic() + 60\n"
    "for pid in pids:\n"
    "    while time.monotonic() < deadline:\n"
    "        with open(f'/proc/{pid}/cmdline', 'rb') as f:\n"
    "            if f.read(3) == b'sh\\0':\n"
    "                break\n"
    "        time.sleep(0.01)\n"
    "print('spawned', n, flush=True)\n")

# A process whose cmdline holds one argv entry of >= 2 MiB: exec() takes at most 128 KiB per
# entry, so it execs with 17 of them (a larger stack limit raises ARG_MAX) and then turns the
# NULs between them into bytes of the entry, in its own memory.
ONE_BIG_ENTRY = (
    "import os, resource, sys\n"
    "HOLD = '''\n"
    "import ctypes, time\n"
    "stat = open('/proc/self/stat').read()\n"
    "f = stat[stat.rindex(')') + 2:].split()\n"
    "start = int(f[45])\n"  # arg_start: field 48 of stat, the 46th after the comm
    "cmd = open('/proc/self/cmdline', 'rb').read()\n"
    "pos = cmd.index(b'\\\\0' + b'A' * 64) + 1\n"
    "ctypes.memset(start + pos, 65, len(cmd) - pos - 1)\n"
    "print(len(open('/proc/self/cmdline', 'rb').read().split(b'\\\\0')[3]), flush=True)\n"
    "time.sleep(600)\n"
    "'''\n"
    "try:\n"
    "    resource.setrlimit(resource.RLIMIT_STACK, (64 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))\n"
    "except (ValueError, OSError):\n"
    "    pass\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    os.dup2(w, 1)\n"
    "    os.execvp('python3', ['python3', '-c', HOLD] + ['A' * 131071] * 17)\n"
    "os.close(w)\n"
    "print('entry', os.read(r, 64).decode().strip(), flush=True)\n")

# A tree whose listing to depth 32 is ~6 MiB: 16 levels of 200 files with 200-byte names.
BIG_TREE = (
    "import os\n"
    "p = '/root/big'\n"
    "for level in range(16):\n"
    "    os.makedirs(p, exist_ok=True)\n"
    "    for i in range(200):\n"
    "        open(os.path.join(p, '%03d' % i + 'n' * 197), 'w').close()\n"
    "    p = os.path.join(p, 'd' + 'n' * 197 + 'dd')\n"
    "print('made', flush=True)\n")

MAX_ARGV_ENTRIES, MAX_ARG_BYTES, MAX_ARGV_BYTES = 256, 4096, 32 << 10  # protocol/limits.h
MAX_REPLY_BYTES = 4 << 20


def held_argv(entry: dict) -> bool:
    argv = entry["argv"]
    return len(argv) >= 3 and argv[0] == "sh" and argv[2] == "sleep 600 & wait"


def check_bounded(procs: list[dict]) -> None:
    for p in procs:
        argv = p["argv"]
        assert len(argv) <= MAX_ARGV_ENTRIES, (p["pid"], len(argv))
        assert all(len(a.encode()) <= MAX_ARG_BYTES for a in argv), p["pid"]
        assert sum(len(a.encode()) for a in argv) <= MAX_ARGV_BYTES, p["pid"]


def list_processes(client, sandbox_id: str) -> dict:
    resp = client.call("GET", f"/v1/sandboxes/{sandbox_id}/processes", expect=200, timeout=120)
    assert len(resp.content) <= MAX_REPLY_BYTES + 4096, len(resp.content)
    return resp.body


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no VmHWM line")


def alive_and_serving(sbxd, client, sandbox_id: str, pid: int) -> None:
    assert Path(f"/proc/{pid}").exists() and agent_pid(sbxd, sandbox_id) == pid, "the agent died"
    still_serves(client, sandbox_id)


@attack("agent", "160 processes with 32,000 empty argv entries each, then 4 concurrent GET "
                 "/processes (the agent held every argv as strings and a JSON tree: OOM-killed, "
                 "sandbox failed)")
def test_huge_argv_process_list(sbxd, sclient):
    sb = sclient.create_sandbox({"resources": {"memory_mib": 1024},
                                 "labels": {"security": "agent-argv"}})["sandbox"]
    try:
        pid = agent_pid(sbxd, sb["id"])
        r = sclient.run(sb["id"], ["python3", "-c", SPAWN_ARGV, "160", "32000", "0"], max_seconds=120)
        assert r.exit == secutil.CLEAN_EXIT and b"spawned 160" in r.stdout, (r.exit, r.stdout, r.stderr)
        body = secutil.wait_until(
            lambda: (lambda b: b if sum(map(held_argv, b["processes"])) >= 160 else None)(
                list_processes(sclient, sb["id"])), timeout=60, interval=0.5)
        assert body, "the 160 processes never all showed up"
        clients = [sclient.clone() for _ in range(4)]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(lambda c: list_processes(c, sb["id"]), clients))
        for c in clients:
            c.close()
        for b in bodies:
            held = [p for p in b["processes"] if held_argv(p)]
            assert len(held) == 160, len(held)
            check_bounded(b["processes"])
            assert all(p["argv_truncated"] is True and len(p["argv"]) == MAX_ARGV_ENTRIES for p in held)
        assert sclient.get_sandbox(sb["id"])["state"] == "running"
        alive_and_serving(sbxd, sclient, sb["id"], pid)
        sizes = sorted(len(json.dumps(b)) for b in bodies)
        secutil.e2e_metric(f"agent argv attack: 4 concurrent process lists of {sizes[-1]} bytes; "
                           f"agent VmHWM {vm_hwm_kib(pid)} KiB")
    finally:
        sclient.delete_sandbox(sb["id"])


@attack("agent", "one process whose cmdline is a single 2 MiB argv entry, and 140 processes "
                 "with 256 argv entries of 4096 bytes (a 1 MiB cmdline each)")
def test_long_argv_process_list(sbxd, sclient):
    sb = sclient.create_sandbox({"resources": {"memory_mib": 1024},
                                 "labels": {"security": "agent-argv-long"}})["sandbox"]
    try:
        pid = agent_pid(sbxd, sb["id"])
        r = sclient.run(sb["id"], ["python3", "-c", ONE_BIG_ENTRY], max_seconds=120)
        assert r.exit == secutil.CLEAN_EXIT, (r.exit, r.stdout, r.stderr)
        got = int(r.stdout.split(b"entry", 1)[1])
        assert got >= 2 << 20, f"the holder's argv entry is {got} bytes, not >= 2 MiB"
        body = list_processes(sclient, sb["id"])
        big = [p for p in body["processes"] if p["argv"][:2] == ["python3", "-c"] and len(p["argv"]) > 3]
        assert len(big) == 1, [p["argv"][:2] for p in body["processes"]]
        assert big[0]["argv_truncated"] is True and len(big[0]["argv"][3]) == MAX_ARG_BYTES, \
            (len(big[0]["argv"]), [len(a) for a in big[0]["argv"]])
        check_bounded(body["processes"])

        r = sclient.run(sb["id"], ["python3", "-c", SPAWN_ARGV, "140", "256", "4096"], max_seconds=120)
        assert r.exit == secutil.CLEAN_EXIT and b"spawned 140" in r.stdout, (r.exit, r.stdout, r.stderr)
        # ~33 KiB per entry: the list stops before 4 MiB, short of the 140.
        body = list_processes(sclient, sb["id"])
        held = [p for p in body["processes"] if held_argv(p)]
        check_bounded(body["processes"])
        assert 0 < len(held) < 140, len(held)
        assert all(p["argv_truncated"] is True for p in held)
        assert body["truncated"] is True, "a cut list must say so"
        assert sclient.get_sandbox(sb["id"])["state"] == "running"
        alive_and_serving(sbxd, sclient, sb["id"], pid)
    finally:
        sclient.delete_sandbox(sb["id"])


@attack("agent", "a tree of long names 16 levels deep whose files:list?depth=32 would be ~6 MiB")
def test_huge_file_list(sbxd, sclient):
    sb = sclient.create_sandbox({"labels": {"security": "agent-list"}})["sandbox"]
    try:
        pid = agent_pid(sbxd, sb["id"])
        r = sclient.run(sb["id"], ["python3", "-c", BIG_TREE], max_seconds=120)
        assert r.exit == secutil.CLEAN_EXIT, (r.exit, r.stdout, r.stderr)
        resp = sclient.call("GET", f"/v1/sandboxes/{sb['id']}/files:list",
                            params={"path": "/root/big", "depth": "32"}, expect=200, timeout=120)
        assert len(resp.content) <= MAX_REPLY_BYTES, len(resp.content)
        assert resp.body["truncated"] is True
        entries = resp.body["entries"]
        assert 0 < len(entries) < 16 * 201, len(entries)
        assert entries[0]["path"] == "/root/big/000" + "n" * 197
        assert all(len(e["path"].encode()) <= 8192 for e in entries)
        alive_and_serving(sbxd, sclient, sb["id"], pid)
    finally:
        sclient.delete_sandbox(sb["id"])

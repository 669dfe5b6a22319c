"""Resource abuse: fork and thread bombs, memory, disk and output floods. Each attack gets its
own sandbox; the limit must stop it inside the sandbox, and sbxd, the host and the bystander
must not notice."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

import hostcheck
import secutil
from secutil import attack, run_script

FORK_BOMB_SECONDS = 5


def _pids_cgroup(sandbox_id: str) -> Path:
    """The workload's pids cgroup: <sandbox>/work (the agent counts in <sandbox> itself on v1)."""
    dirs = [Path(d) / "work" for d in hostcheck.cgroup_dirs(sandbox_id) if (Path(d) / "work" / "pids.max").exists()]
    assert len(dirs) == 1, f"expected one pids cgroup named after {sandbox_id}: {dirs}"
    return dirs[0]


def _pids_events_max(cg: Path) -> int:
    for line in secutil.read_text(cg / "pids.events").splitlines():
        if line.startswith("max "):
            return int(line.split()[1])
    raise AssertionError(f"{cg}/pids.events has no 'max' line")


@attack("fork-bomb", f"bash fork bomb :(){{ :|:& }};: for {FORK_BOMB_SECONDS}s (bounded by timeout -s KILL)")
def test_fork_bomb(api, sclient, bystander, sbxd):
    sb = api.create_sandbox({"labels": {"security": "fork-bomb"}})["sandbox"]
    sid = sb["id"]
    pids_max = sb["effective_resources"]["pids"]
    cg = _pids_cgroup(sid)
    assert int(secutil.read_text(cg / "pids.max")) == pids_max
    denied_before = _pids_events_max(cg)
    # The bomb's first call returns at once (its pipeline runs in the background), so bash then
    # sleeps. After FORK_BOMB_SECONDS timeout(1) SIGKILLs its whole process group, itself
    # included (bash without job control keeps every background child in that group). SIGTERM
    # would not do: bash blocks it while it retries a failed fork, for up to ~30 s.
    session = api.create_session(sid, ["timeout", "-s", "KILL", str(FORK_BOMB_SECONDS), "bash", "-c",
                                       ":(){ :|:& };:; sleep 60"])
    stream = api.attach(session)
    try:
        # While the bomb runs: the sandbox sits at its limit, and the host serves others.
        at_limit = secutil.wait_until(
            lambda: int(secutil.read_text(cg / "pids.current")) >= pids_max - 8, timeout=FORK_BOMB_SECONDS - 1)
        current = int(secutil.read_text(cg / "pids.current"))
        during_health = sclient.call("GET", "/healthz", token=None, expect=200, timeout=10).body
        during = sclient.run(bystander["sandbox"]["id"], ["echo", "ok"], max_seconds=30)
        result = api.collect(stream, max_seconds=FORK_BOMB_SECONDS + 60, keep_events=False)
    finally:
        stream.close()
    assert at_limit, f"the bomb never came near pids.max={pids_max} (pids.current {current})"
    assert current <= pids_max
    assert during_health == {"status": "ok"}
    assert during.exit == secutil.CLEAN_EXIT and during.stdout == b"ok\n", \
        f"the bystander could not run during the bomb: {during.exit} {during.stderr!r}"
    assert _pids_events_max(cg) > denied_before, "pids.events shows no fork refused by pids.max"
    assert b"fork: retry: Resource temporarily unavailable" in result.stderr \
        or b"fork: Resource temporarily unavailable" in result.stderr, result.stderr[-500:]
    assert result.exit == {"exit_code": None, "signal": "SIGKILL", "timed_out": False, "oom_killed": False}, \
        result.exit
    # The bomb is gone with its process group (the agent reaps the orphans), and the sandbox
    # works again.
    settled = secutil.wait_until(lambda: int(secutil.read_text(cg / "pids.current")) == 0, timeout=10)
    assert settled, f"bomb processes outlived timeout(1): pids.current {secutil.read_text(cg / 'pids.current')}"
    again = secutil.sh(api, sid, "echo ok")
    assert again.exit == secutil.CLEAN_EXIT and again.stdout == b"ok\n", (again.exit, again.stderr)

    op = api.delete_sandbox(sid)
    assert op["state"] == "succeeded", op
    gone = secutil.wait_until(lambda: not hostcheck.leftovers(sid, sbxd.state_dir), timeout=3)
    assert gone, f"left on the host after the delete: {hostcheck.leftovers(sid, sbxd.state_dir)}"


@attack("thread-bomb", "python threads until the kernel refuses one")
def test_thread_bomb(api):
    sb = api.create_sandbox({"labels": {"security": "thread-bomb"}})["sandbox"]
    pids_max = sb["effective_resources"]["pids"]
    cg = _pids_cgroup(sb["id"])
    denied_before = _pids_events_max(cg)
    res, out = run_script(api, sb["id"], "thread_bomb", 8 * pids_max)
    assert out["error"] == "can't start new thread", f"the thread bomb ended without a refused thread: {out}"
    # The python process and its threads share the workload's pids budget (the agent has its own).
    assert pids_max - 16 <= out["threads_started"] < pids_max, \
        f"{out['threads_started']} threads with pids.max={pids_max}: not stopped by the pids limit"
    assert _pids_events_max(cg) > denied_before, "pids.events shows no thread refused by pids.max"
    again = secutil.sh(api, sb["id"], "echo ok")
    assert again.exit == secutil.CLEAN_EXIT and again.stdout == b"ok\n"


@attack("memory-bomb", "allocate and touch 512 MiB in a sandbox limited to 64 MiB")
def test_memory_bomb(api):
    sb = api.create_sandbox({"labels": {"security": "memory-bomb"}, "resources": {"memory_mib": 64}})["sandbox"]
    assert sb["effective_resources"]["memory_mib"] == 64, sb["effective_resources"]
    res = api.run(sb["id"], ["python3", "-c", secutil.script("memory_bomb"), "512"], max_seconds=120)
    progress = [int(line.split()[1]) for line in res.stdout.decode().splitlines() if line.startswith("allocated ")]
    assert not progress or max(progress) < 64, f"allocated past the limit: {progress}"
    assert res.exit == {"exit_code": None, "signal": "SIGKILL", "timed_out": False, "oom_killed": True}, \
        f"process_exited: {res.exit} (stderr {res.stderr[-300:]!r})"
    info = api.get_session(res.session["session_id"])
    assert info["oom_killed"] is True and info["signal"] == "SIGKILL", info
    again = secutil.sh(api, sb["id"], "echo ok")
    assert again.exit == secutil.CLEAN_EXIT and again.stdout == b"ok\n", \
        f"the sandbox does not run after the OOM kill: {again.exit} {again.stderr!r}"


DISK_MIB = 64


@attack("disk-fill", f"write into /root until the file system refuses (disk_mib={DISK_MIB})")
def test_disk_fill(api, sbxd):
    sb = api.create_sandbox({"labels": {"security": "disk-fill"}, "resources": {"disk_mib": DISK_MIB}})["sandbox"]
    assert sb["effective_resources"]["disk_mib"] == DISK_MIB, sb["effective_resources"]
    free_before = secutil.statvfs_free(sbxd.state_dir)
    # At most 1.5x the quota: a missing quota fails the test instead of filling the host's disk.
    res, out = run_script(api, sb["id"], "disk_fill", "/root/sbxsec-fill", DISK_MIB * 3 // 2, max_seconds=120)
    free_after = secutil.statvfs_free(sbxd.state_dir)
    written_mib = out["written_bytes"] / (1 << 20)
    assert out["error"] == "ENOSPC", f"no ENOSPC after writing {written_mib:.1f} MiB: {out}"
    # ext4 keeps some of an image for its metadata and journal: 40-70 MiB of data fit in 64 MiB.
    assert 40 <= written_mib <= 70, f"ENOSPC after {written_mib:.1f} MiB with disk_mib={DISK_MIB}"
    assert out["second_file"] == "ENOSPC", out
    # The host gives the sandbox at most its quota (an image file may be allocated as it
    # fills); other processes on the host also write, hence the slack.
    used_mib = (free_before - free_after) / (1 << 20)
    assert used_mib < DISK_MIB + 32, f"host free space dropped by {used_mib:.0f} MiB"


FLOOD_BYTES = 1 << 30
RSS_BOUND_MIB = 64
STALL_SECONDS = 3


@attack("output-flood", "write 1 GiB to stdout while the client first stops reading, then reads all")
def test_output_flood(api, sbxd, metrics):
    """sbxd relays output from the agent's bounded buffer (8 MiB per stream) to the client and
    must never hold more than a small window of it: bounded by RSS_BOUND_MIB (1/16 of the
    output). An sbxd that buffered what the client had not read yet would grow by up to 1 GiB."""
    sb = api.create_sandbox({"labels": {"security": "output-flood"}})["sandbox"]
    pid = sbxd.proc.pid
    rss_base = secutil.vm_rss_kib(pid)
    peak = rss_base
    session = api.create_session(sb["id"], ["head", "-c", str(FLOOD_BYTES), "/dev/zero"])
    stream = api.attach(session, timeout=120)
    try:
        deadline = time.monotonic() + STALL_SECONDS
        while time.monotonic() < deadline:  # not reading: the output piles up somewhere
            peak = max(peak, secutil.vm_rss_kib(pid))
            time.sleep(0.2)
        stalled_peak = peak
        total, last, seen_exit, started = 0, None, None, time.monotonic()
        next_sample = 0.0
        buf = bytearray()
        for chunk in stream._chunks(1 << 20):
            buf += chunk
            start = 0
            while True:
                idx = buf.find(b"\n\n", start)
                if idx < 0:
                    break
                ev_type, data = _sse_fields(bytes(buf[start:idx]))
                start = idx + 2
                if ev_type == "message" and not data:
                    continue  # a keep-alive comment
                assert seen_exit is None, f"event after process_exited: {ev_type}"
                if ev_type == "stdout":
                    d = json.loads(data)
                    assert d["offset"] == total, f"stdout offset {d['offset']} != {total} bytes received"
                    b64 = d["data_b64"]
                    total += len(b64) // 4 * 3 - b64[-2:].count("=")
                elif ev_type == "process_exited":
                    seen_exit = json.loads(data)
                elif ev_type in ("error", "resync_required"):
                    raise AssertionError(f"{ev_type} event during the flood: {data[:300]}")
                last = ev_type
            del buf[:start]
            now = time.monotonic()
            if now >= next_sample:
                peak = max(peak, secutil.vm_rss_kib(pid))
                next_sample = now + 0.2
            assert now - started < 180, f"the flood is still streaming after 180 s ({total} bytes)"
    finally:
        stream.close()
    peak = max(peak, secutil.vm_rss_kib(pid))
    assert last == "process_exited", f"the stream did not end with process_exited (last event {last})"
    assert seen_exit == {"exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False}, seen_exit
    assert total == FLOOD_BYTES, f"received {total} bytes of {FLOOD_BYTES}"
    growth_mib = (peak - rss_base) / 1024
    metrics.append(f"output flood: 1 GiB in {time.monotonic() - started:.1f}s after a {STALL_SECONDS}s stall; "
                   f"sbxd VmRSS {rss_base // 1024} MiB -> peak {peak // 1024} MiB "
                   f"(stalled peak {stalled_peak // 1024} MiB, bound +{RSS_BOUND_MIB} MiB)")
    assert growth_mib < RSS_BOUND_MIB, \
        f"sbxd's VmRSS grew by {growth_mib:.1f} MiB (base {rss_base} KiB, peak while stalled " \
        f"{stalled_peak} KiB, overall {peak} KiB)"


def _sse_fields(raw: bytes):
    ev_type, data = "message", []
    for line in raw.decode().split("\n"):
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            ev_type = value
        elif name == "data":
            data.append(value)
    return ev_type, "\n".join(data)

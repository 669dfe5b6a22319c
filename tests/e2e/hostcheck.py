"""Looks for (and, as a last resort, removes) host kernel objects named after a sandbox id:
processes, mounts and cgroup directories. Every kernel object sbx creates is named after the
sandbox id (AGENTS.md), so a search by id finds what a sandbox left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _unescape_mount(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and s[i + 1:i + 4].isdigit() and len(s[i + 1:i + 4]) == 3:
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def processes_mentioning(needle: str) -> list[dict]:
    """Live processes whose cmdline or cgroup membership mentions `needle`."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        cmdline = _read(f"/proc/{entry}/cmdline").replace("\0", " ").strip()
        cgroup = _read(f"/proc/{entry}/cgroup")
        if needle in cmdline or needle in cgroup:
            stat = _read(f"/proc/{entry}/stat")
            state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
            found.append({"pid": int(entry), "cmdline": cmdline, "state": state,
                          "cgroup": [line for line in cgroup.splitlines() if needle in line]})
    return found


def vm_processes(state_dir: Path, sandbox_id: str) -> list[int]:
    """PIDs of live processes (the VMM, the bridge) whose command line names the sandbox's
    microVM directory."""
    needle = f"{state_dir}/vm/{sandbox_id}/".encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if needle in (p / "cmdline").read_bytes():
                stat = (p / "stat").read_text()
                if stat[stat.rfind(")") + 2] not in "ZX":
                    out.append(int(p.name))
        except OSError:
            continue
    return out


def mountinfo_lines(needle: str) -> list[str]:
    return [line for line in _read("/proc/self/mountinfo").splitlines() if needle in line]


def mounts_under(path: Path) -> list[str]:
    prefix = str(Path(path).resolve())
    points = []
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        if len(fields) > 4:
            mp = _unescape_mount(fields[4])
            if mp == prefix or mp.startswith(prefix + "/"):
                points.append(mp)
    return points


def cgroup_dirs(needle: str) -> list[str]:
    """Cgroup directories whose name contains `needle`, in every mounted hierarchy."""
    found = []
    roots = set()
    for line in _read("/proc/self/mountinfo").splitlines():
        parts = line.split(" - ")
        if len(parts) == 2 and parts[1].split()[0] in ("cgroup", "cgroup2"):
            roots.add(_unescape_mount(parts[0].split()[4]))
    for root in sorted(roots):
        for dirpath, dirnames, _ in os.walk(root, followlinks=False):
            for d in dirnames:
                if needle in d:
                    found.append(os.path.join(dirpath, d))
    return sorted(set(found))


def leftovers(sandbox_id: str, state_dir: Path) -> dict:
    """Everything on the host that still mentions the id (zombies are reported too)."""
    out = {
        "processes": processes_mentioning(sandbox_id),
        "mounts": mountinfo_lines(sandbox_id),
        "cgroups": cgroup_dirs(sandbox_id),
        "state_dir": [],
    }
    d = Path(state_dir) / "sandboxes" / sandbox_id
    if d.exists():
        out["state_dir"].append(str(d))
    return {k: v for k, v in out.items() if v}


def leftovers_after_delete(sandbox_id: str, state_dir: Path, timeout: float = 20.0) -> dict:
    """What a delete that reported `deleted` left. Processes, mounts and cgroups must be gone at
    once; the sandbox's directory may be removed a moment later by sbxd's reaper
    (runtime.ns.removal_backlog, docs/isolation.md §6.1), so that alone is waited for."""
    now = leftovers(sandbox_id, state_dir)
    deadline = time.monotonic() + timeout
    while set(now) == {"state_dir"} and time.monotonic() < deadline:
        time.sleep(0.05)
        now = leftovers(sandbox_id, state_dir)
    return now


def sweep(ids: list[str], state_dir: Path) -> list[str]:
    """Last resort after the daemon stopped: removes what the sandboxes left on the host.
    Returns a description of everything it had to remove (empty when nothing was left)."""
    removed = []
    for sid in ids:
        procs = processes_mentioning(sid)
        for p in procs:
            try:
                os.kill(p["pid"], signal.SIGKILL)
                removed.append(f"killed pid {p['pid']} ({p['cmdline'][:80]}) of {sid}")
            except (ProcessLookupError, PermissionError):
                pass
    if removed:
        time.sleep(0.5)
    points = set()
    for sid in ids:
        for line in mountinfo_lines(sid):
            points.add(_unescape_mount(line.split()[4]))
    points.update(mounts_under(state_dir))
    for mp in sorted(points, key=len, reverse=True):
        r = subprocess.run(["umount", "-l", mp], capture_output=True)
        removed.append(f"unmounted {mp}" + ("" if r.returncode == 0 else f" (failed: {r.stderr.decode().strip()})"))
    for sid in ids:
        for d in sorted(cgroup_dirs(sid), key=len, reverse=True):
            try:
                os.rmdir(d)
                removed.append(f"removed cgroup {d}")
            except OSError as e:
                removed.append(f"cgroup {d} could not be removed: {e}")
    return removed

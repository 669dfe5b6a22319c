"""What of a process's descriptor table lacks close-on-exec, looked at once or all along a
workload. sbxd and the agent fork and exec from many threads: a descriptor made without
O_CLOEXEC, however briefly held (a std::ifstream of /proc/meminfo), is inherited by whatever
another thread starts meanwhile. tools/check_house.py holds the rule in the source; these
look at the running process, where libraries (libcurl, libnftables) make descriptors too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

O_CLOEXEC = 0o2000000


def open_without_cloexec(pid: int) -> list[str]:
    """Descriptors of `pid` from 3 up that lack O_CLOEXEC, as "fd -> target"."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        fd = int(name)
        if fd < 3:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            with open(f"/proc/{pid}/fdinfo/{name}") as f:
                flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
        except (OSError, StopIteration):
            continue  # closed meanwhile
        if not flags & O_CLOEXEC:
            found.append(f"{fd} -> {target}")
    return found


# The sampler, run as a process of its own so the test's threads (its HTTP client) do not share
# its interpreter: in a thread of the test it took ~30 looks a second, alone it takes hundreds.
# It stops when its stdin closes, after max_samples looks or after max_s seconds, and prints
# {"samples": N, "seen": [...]}.
_SAMPLER = r"""
import json, os, select, sys, time
pid, max_samples, max_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
seen, samples, end = set(), 0, time.monotonic() + max_s
def look():
    for name in os.listdir(f"/proc/{pid}/fd"):
        if int(name) < 3:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            with open(f"/proc/{pid}/fdinfo/{name}") as f:
                flags = next(int(l.split()[1], 8) for l in f if l.startswith("flags:"))
        except (OSError, StopIteration):
            continue
        if not flags & 0o2000000:
            seen.add(f"{name} -> {target}")
try:
    while samples < max_samples and time.monotonic() < end:
        if select.select([sys.stdin], [], [], 0)[0]:
            break
        look()
        samples += 1
except FileNotFoundError:
    pass
print(json.dumps({"samples": samples, "seen": sorted(seen)}))
"""


class FdWatch:
    """Samples `pid`'s table from a process of its own until the `with` ends; `.seen` is every
    inheritable descriptor found, `.samples` how many looks were taken (a watch that took none
    proves nothing, so the caller checks it). Bounded: at most `max_samples` looks and
    `max_s` seconds."""

    def __init__(self, pid: int, max_samples: int = 1_000_000, max_s: float = 600):
        self.pid = pid
        self.seen: set[str] = set()
        self.samples = 0
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, str(pid), str(max_samples), str(max_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __enter__(self) -> "FdWatch":
        return self

    def __exit__(self, *exc) -> None:
        try:
            out, _ = self._proc.communicate(input="stop\n", timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise
        found = json.loads(out or "{}")
        self.samples = found.get("samples", 0)
        self.seen = set(found.get("seen", []))

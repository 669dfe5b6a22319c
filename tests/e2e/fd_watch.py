"""What of a process's descriptor table lacks close-on-exec, looked at once or all along a
workload. sbxd and the agent fork and exec from many threads: a descriptor made without
O_CLOEXEC, however briefly held (a std::ifstream of /proc/meminfo), is inherited by whatever
another thread starts meanwhile. tools/check_house.py holds the rule in the source; these
look at the running process, where libraries (libcurl, libnftables) make descriptors too."""

from __future__ import annotations

import os
import threading

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


class FdWatch:
    """Samples `pid`'s table from a thread until the `with` ends; `.seen` is every inheritable
    descriptor found, `.samples` how many looks were taken (a watch that took none proves
    nothing, so the caller checks it). Bounded: it stops after `max_samples` looks."""

    def __init__(self, pid: int, max_samples: int = 200_000):
        self.pid = pid
        self.max_samples = max_samples
        self.seen: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fd-watch-{pid}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.samples < self.max_samples:
            try:
                self.seen.update(open_without_cloexec(self.pid))
            except FileNotFoundError:
                return  # the process is gone; the test says why
            self.samples += 1

    def __enter__(self) -> "FdWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

#!/usr/bin/env python3
"""Where the host's tasks wait uninterruptibly (D state) while a load runs, by kernel stack.

An off-CPU profile without BPF (Debian's kernels ship no bpftrace here): every `--interval` the
sampler reads every task's state from /proc and, for each task in D, its kernel stack
(/proc/PID/task/TID/stack, root only). It prints how often each command and each stack was
seen. A count times the mean period between samples (printed) estimates the task-seconds spent
there. D state is what an I/O wait, a flush, a queue freeze or an RCU grace period looks like;
a vfork parent waiting for its child's exec shows as D too (`kernel_clone` on top), which is
not I/O.

Used for the churn's waits (docs/benchmarks.md, "Where the churn waits"): run it beside
`sbx-load --scenarios sustained`.

Usage (root): python3 bench/dstate_sample.py --seconds 14 [--interval 0.005] [--top 40]
Reads /proc only; starts, changes and leaves nothing."""
import argparse
import collections
import os
import sys
import time


def frames(stack_text: str, depth: int) -> list[str]:
    out = []
    for line in stack_text.splitlines():
        # "[<0>] ext4_sync_file+0x1a/0x3c0"
        parts = line.split(" ", 1)
        if len(parts) == 2:
            out.append(parts[1].split("+", 1)[0])
    return out[:depth]


def sample(depth: int, comms: collections.Counter, stacks: collections.Counter) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{base}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            close = stat.rfind(")")
            if close < 0 or close + 2 >= len(stat) or stat[close + 2] != "D":
                continue
            comm = stat[stat.find("(") + 1:close]
            # Kernel workers by kind, not by number: "kworker/u8:12-loop0" -> "kworker".
            if comm.startswith("kworker"):
                comm = "kworker"
            try:
                with open(f"{base}/stack") as f:
                    stack = frames(f.read(), depth)
            except OSError:
                stack = []
            comms[comm] += 1
            stacks[(comm, " < ".join(stack))] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=14.0, help="how long to sample")
    ap.add_argument("--interval", type=float, default=0.005,
                    help="pause between two scans of /proc (a scan itself takes ~20 ms "
                         "with a few thousand tasks)")
    ap.add_argument("--depth", type=int, default=12, help="stack frames kept, innermost first")
    ap.add_argument("--top", type=int, default=40, help="stacks printed")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("dstate_sample: kernel stacks need root", file=sys.stderr)
        return 2
    comms: collections.Counter = collections.Counter()
    stacks: collections.Counter = collections.Counter()
    n = 0
    start = time.monotonic()
    end = start + args.seconds
    while time.monotonic() < end:
        sample(args.depth, comms, stacks)
        n += 1
        time.sleep(args.interval)
    elapsed = time.monotonic() - start
    period_ms = elapsed * 1000 / max(n, 1)
    print(f"samples {n} over {elapsed:.1f} s: one sample ~ {period_ms:.1f} ms of a task's time")
    print()
    for comm, k in comms.most_common():
        print(f"{k:7d} {comm}")
    print()
    for (comm, stack), k in stacks.most_common(args.top):
        print(f"{k:7d} {comm}: {stack}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What a sandbox's cgroups cost the kernel to make, per hierarchy, and what a made set holds.

Makes N sets the way the ns runtime lays out a split sandbox on a cgroup v1 / hybrid host (a
directory with a `work` child in the memory, pids and cpu hierarchies and in the v2 unified
one), writes the limits a sandbox gets, removes them, and prints the mean time of each step and
the unreclaimable slab one set of the v1 directories holds (docs/benchmarks.md, "Pre-built
cgroup sets"). On a pure v2 host it times the one v2 directory and its children instead.

Usage (root): python3 bench/cgroup_mkdir.py [--sets 50]
Directories are named `mkdir-bench-<pid>-N` under `<own cgroup>/sbx` of each hierarchy and are
removed at the end, also on an error."""
import argparse
import os
import time


def own_cgroups() -> dict[str, str]:
    """hierarchy key -> the `sbx` parent an sbxd started from this shell would use."""
    own = {}
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            own[c] = path
    mounts = {}
    for line in open("/proc/mounts"):
        dev, mnt, fstype, opts = line.split()[:4]
        if fstype == "cgroup":
            for c in ("memory", "pids", "cpu"):
                if c in opts.split(","):
                    mounts[c] = mnt
        elif fstype == "cgroup2":
            mounts["unified"] = mnt
    out = {}
    for key, mnt in mounts.items():
        path = own.get("" if key == "unified" else key, "/")
        out[key] = os.path.join(mnt, path.lstrip("/"), "sbx")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=50)
    args = ap.parse_args()
    parents = own_cgroups()
    pure_v2 = set(parents) == {"unified"}
    for p in parents.values():
        os.makedirs(p, exist_ok=True)
    limits = {"memory": [("memory.limit_in_bytes", "570425344"), ("work/memory.limit_in_bytes", "536870912")],
              "pids": [("pids.max", "4224"), ("work/pids.max", "4096")],
              "cpu": [("cpu.cfs_quota_us", "100000"), ("work/cpu.shares", "102")]}
    spent: dict[str, float] = {}
    made: list[str] = []

    def timed(key: str, fn) -> None:
        t = time.perf_counter()
        fn()
        spent[key] = spent.get(key, 0.0) + time.perf_counter() - t

    def slab_kib() -> int:
        for line in open("/proc/meminfo"):
            if line.startswith("SUnreclaim:"):
                return int(line.split()[1])
        return 0

    slab_before = slab_kib()
    try:
        for i in range(args.sets):
            for key, parent in parents.items():
                d = os.path.join(parent, f"mkdir-bench-{os.getpid()}-{i}")
                timed(f"{key}: mkdir", lambda: os.mkdir(d))
                made.append(d)
                if pure_v2:
                    with open(os.path.join(d, "cgroup.subtree_control"), "w") as f:
                        f.write("+memory +pids +cpu")
                timed(f"{key}: mkdir work", lambda: os.mkdir(os.path.join(d, "work")))
                made.append(os.path.join(d, "work"))
                for name, value in limits.get(key, []):
                    def write(path=os.path.join(d, name), value=value):
                        with open(path, "w") as f:
                            f.write(value)
                    timed(f"{key}: limits", write)
        slab_per_set = (slab_kib() - slab_before) / args.sets
    finally:
        for d in reversed(made):
            t = time.perf_counter()
            try:
                os.rmdir(d)
            except OSError as e:
                print(f"rmdir {d}: {e}")
            key = next(k for k, p in parents.items() if d.startswith(p + "/"))
            spent[f"{key}: rmdir"] = spent.get(f"{key}: rmdir", 0.0) + time.perf_counter() - t
    print(f"{args.sets} sets; mean per set (µs):")
    for key in sorted(spent):
        print(f"  {key:24s} {spent[key] / args.sets * 1e6:8.1f}")
    total = sum(v for k, v in spent.items() if "rmdir" not in k)
    print(f"  {'make + limits, all':24s} {total / args.sets * 1e6:8.1f}")
    print(f"unreclaimable slab per set: {slab_per_set:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

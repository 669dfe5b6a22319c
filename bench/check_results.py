#!/usr/bin/env python3
"""Checks that a sbx-load run produced what the suite promises (CI's bench-smoke): the JSON
parses and has every scenario and peer with samples, and the plot exists. Nothing about time.

Usage: python3 bench/check_results.py DIR   (DIR holds latest.json and latency.png)
"""
import json
import os
import sys

SCENARIOS = ["create_cold", "create_warm", "first_output", "first_output_exit", "exec",
             "concurrent_create", "concurrent_create_warm", "sustained", "attach", "density", "pause", "pause_wake",
             "pause_delete"]
PEERS = ["fork_exec_true", "bwrap_echo", "unshare_echo", "runc_echo", "pipe"]
# The pause routes come from another branch: until they are merged, sbxd answers 404 and the
# tool records these as skipped, which is not a failure.
MAY_SKIP = {"pause", "pause_wake"}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "build/bench-quick"
    problems = []
    try:
        with open(os.path.join(d, "latest.json")) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"check: cannot read {d}/latest.json: {e}")
    for key in ("meta", "scenarios", "peers", "ratios", "targets"):
        if key not in res:
            problems.append(f"no \"{key}\" section")
    for section, names in (("scenarios", SCENARIOS), ("peers", PEERS)):
        got = res.get(section, {})
        for name in names:
            r = got.get(name)
            if r is None:
                problems.append(f"{section}.{name}: missing")
            elif name in MAY_SKIP and r.get("skipped"):
                print(f"check: {section}.{name}: skipped ({r['skipped']})")
            elif not r.get("n"):
                why = r.get("failure") or r.get("missing") or r.get("skipped") or "n = 0"
                problems.append(f"{section}.{name}: no samples ({why})")
    micro = os.path.join(d, "micro.json")
    try:
        with open(micro) as f:
            benches = [b for b in json.load(f).get("benchmarks", []) if b.get("iterations")]
        if not benches:
            problems.append(f"{micro}: no benchmark ran")
    except (OSError, ValueError) as e:
        problems.append(f"cannot read {micro}: {e}")
    png = os.path.join(d, "latency.png")
    if not os.path.isfile(png) or os.path.getsize(png) == 0:
        problems.append(f"{png} is missing or empty")
    for p in problems:
        print(f"check: FAIL: {p}")
    if problems:
        sys.exit(1)
    print(f"check: {d}: {len(SCENARIOS)} scenarios, {len(PEERS)} peers, the micro-benchmarks "
          f"and the plot are there")


if __name__ == "__main__":
    main()

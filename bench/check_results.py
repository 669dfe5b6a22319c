#!/usr/bin/env python3
"""Checks that a sbx-load run produced what the suite promises (CI's bench-smoke): the JSON
parses and has every scenario and peer with samples, and the plot exists. Nothing about time.
A scenario or peer that was skipped, failed or is missing fails the check, whatever it counted:
the pause scenarios included (an sbxd whose pause answers 404 or 501 records them as skipped).

Usage: python3 bench/check_results.py DIR   (DIR holds latest.json and latency.png)
"""
import json
import os
import sys

SCENARIOS = ["create_cold", "create_warm", "first_output", "first_output_exit", "exec",
             "concurrent_create", "concurrent_create_warm", "sustained", "attach", "attach_binary", "density", "pause", "pause_wake",
             "pause_delete"]
PEERS = ["fork_exec_true", "bwrap_echo", "unshare_echo", "runc_echo", "pipe"]
# One operation at a time against an idle sbxd: any error is a broken pause or wake (a 500, a
# wake that does not run commands again), not load, so it fails the check even when other
# iterations got samples. Errors elsewhere (the concurrent and sustained scenarios may meet
# load shedding) are printed but do not fail it.
NO_ERRORS = {"pause", "pause_wake", "pause_delete"}


def check(d: str) -> list[str]:
    problems = []
    try:
        with open(os.path.join(d, "latest.json")) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        return [f"cannot read {d}/latest.json: {e}"]
    for key in ("meta", "scenarios", "peers", "ratios", "targets"):
        if key not in res:
            problems.append(f"no \"{key}\" section")
    for section, names in (("scenarios", SCENARIOS), ("peers", PEERS)):
        got = res.get(section, {})
        for name in names:
            r = got.get(name)
            if not isinstance(r, dict):
                problems.append(f"{section}.{name}: missing")
                continue
            for why in ("skipped", "failure", "missing"):
                if r.get(why):
                    problems.append(f"{section}.{name}: {why}: {r[why]}")
            if not r.get("n"):
                problems.append(f"{section}.{name}: no samples (n = {r.get('n', 0)}, "
                                f"{r.get('errors', 0)} errors: {r.get('error_messages', [])})")
            elif r.get("errors"):
                line = f"{section}.{name}: {r['errors']} errors: {r.get('error_messages', [])}"
                if name in NO_ERRORS:
                    problems.append(line)
                else:
                    print(f"check: note: {line}")
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
    return problems


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "build/bench-quick"
    problems = check(d)
    for p in problems:
        print(f"check: FAIL: {p}")
    if problems:
        sys.exit(1)
    print(f"check: {d}: {len(SCENARIOS)} scenarios, {len(PEERS)} peers, the micro-benchmarks "
          f"and the plot are there")


if __name__ == "__main__":
    main()

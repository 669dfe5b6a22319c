#!/usr/bin/env python3
"""Checks that a sbx-load run produced what the suite promises (CI's bench-smoke): the JSON
parses and has every scenario and peer with samples, and the plot exists. Nothing about time.
A scenario or peer that was skipped, failed or is missing fails the check, whatever it counted:
the pause scenarios included (an sbxd whose pause answers 404 or 501 records them as skipped).

The repeatable forms must be there too: CPU ms and syscalls per operation of the scenarios
sbx-load meters (it runs perf stat on the sbxd given by --sbxd-pid; tools/bench.sh passes it),
and the file transfer JSON of bench/file_transfer.sh with its ratios and CPU per MiB.

Usage: python3 bench/check_results.py DIR   (DIR holds latest.json, micro.json, latency.png and
file_transfer.json)
"""
import json
import os
import sys

SCENARIOS = ["create_cold", "create_warm", "first_output", "first_output_exit", "exec", "exec_split",
             "concurrent_create", "concurrent_create_warm", "sustained", "attach", "attach_binary", "density", "pause", "pause_wake",
             "pause_delete"]
PEERS = ["fork_exec_true", "bwrap_echo", "unshare_echo", "runc_echo", "pipe"]
# One operation at a time against an idle sbxd: any error is a broken pause or wake (a 500, a
# wake that does not run commands again), not load, so it fails the check even when other
# iterations got samples. Errors elsewhere (the concurrent and sustained scenarios may meet
# load shedding) are printed but do not fail it.
NO_ERRORS = {"pause", "pause_wake", "pause_delete"}
# Scenarios whose CPU time and syscalls per operation sbx-load measures (SbxdMeter).
METERED = ["create_cold", "exec", "attach", "sustained"]
METER_FIELDS = ("cpu_ms_per_op", "syscalls_per_op")


def check_metered(res) -> list[str]:
    problems = []
    if not isinstance(res.get("repeatable"), list):
        problems.append("no \"repeatable\" section (CPU time and syscalls per operation)")
    for name in METERED:
        e = (res.get("scenarios", {}).get(name) or {}).get("extra", {})
        if e.get("cpu_unavailable"):
            problems.append(f"scenarios.{name}: no CPU/syscall figures: {e['cpu_unavailable']}")
            continue
        for k in METER_FIELDS:
            v = e.get(k)
            if not isinstance(v, (int, float)) or v <= 0:
                problems.append(f"scenarios.{name}: extra.{k} missing or not positive ({v!r})")
    return problems


def check_file_transfer(path: str) -> list[str]:
    try:
        with open(path) as f:
            ft = json.load(f)
    except (OSError, ValueError) as e:
        return [f"cannot read {path}: {e}"]
    problems = []
    for k in ("upload_vs_bwrap", "download_vs_bwrap"):
        v = ft.get("ratios", {}).get(k)
        if not isinstance(v, (int, float)) or v <= 0:
            problems.append(f"{path}: ratios.{k} missing ({v!r})")
    for step in ("upload", "download"):
        a = ft.get("sbx", {}).get(step, {})
        for k in ("cpu_ms_per_mib", "syscalls_per_mib"):
            if not isinstance(a.get(k), (int, float)) or a[k] <= 0:
                problems.append(f"{path}: sbx.{step}.{k} missing ({a.get(k)!r}): is perf installed?")
    return problems


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
    problems += check_metered(res)
    problems += check_file_transfer(os.path.join(d, "file_transfer.json"))
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
    print(f"check: {d}: {len(SCENARIOS)} scenarios, {len(PEERS)} peers, the micro-benchmarks, "
          f"the plot, CPU and syscalls per op of {', '.join(METERED)}, and the file transfer "
          f"figures are there")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Turns sbx-load's JSON into a latency plot and the tables of docs/benchmarks.md.

Usage:
  python3 bench/report.py [--in bench/results/latest.json] [--png bench/results/latency.png]
                          [--docs docs/benchmarks.md | --tables-out FILE]

--docs replaces the block between `<!-- bench:begin -->` and `<!-- bench:end -->` in place
(the rest of the page is hand-written); --tables-out writes the same tables to a file instead.
The plot is drawn by gnuplot (Debian: gnuplot-nox): one CDF per scenario and peer, log-x.
Python standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"

# Display order and short descriptions; names not listed here follow in JSON order.
SCENARIOS = [
    ("create_cold", "create → running (cold)"),
    ("create_warm", "create → running (warm pool)"),
    ("first_output", "create → first stdout byte of `echo hi`"),
    ("first_output_exit", "create → `echo hi` exited"),
    ("exec", "exec `true` in a running sandbox (session + attach)"),
    ("concurrent_create", "concurrent creates → running"),
    ("concurrent_create_warm", "concurrent creates → running (warm pool)"),
    ("sustained", "create + exec + delete cycle, sustained"),
    ("attach", "attach throughput (first byte → exit)"),
    ("attach_binary", "attach throughput, binary form (first byte → exit)"),
    ("density", "create → running while filling (density)"),
    ("pause", "pause"),
    ("pause_wake", "wake"),
    ("pause_delete", "delete (after pause/wake)"),
]
PEERS = [
    ("fork_exec_true", "bare fork+exec of `/bin/true` (floor)"),
    ("bwrap_echo", "`bwrap --unshare-all … echo hi`"),
    ("unshare_echo", "`unshare --fork --pid --mount --net … echo hi`"),
    ("runc_echo", "`runc run` of an `echo hi` bundle"),
    ("pipe", "`cat /dev/zero \\| head -c N` through a pipe"),
]
# Throughput-only entries: one long sample each, not a latency distribution.
NOT_PLOTTED = {"attach", "attach_binary", "pipe"}
# Distinguishable line colours (a peer is also dashed).
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8", "#98df8a", "#ff9896",
          "#c5b0d5", "#c49c94"]


def ordered(section, known):
    names = [n for n, _ in known if n in section]
    names += [n for n in section if n not in names]
    desc = dict(known)
    return [(n, desc.get(n, n), section[n]) for n in names]


def fmt_ms(v):
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_tp(r):
    t = r.get("throughput")
    if not t:
        return "–"
    v = t["value"]
    return f"{v:.0f} {t['unit']}" if v >= 100 else f"{v:.1f} {t['unit']}"


def status_note(r):
    for key in ("failure", "missing", "skipped"):
        if r.get(key):
            return f"{key}: {r[key]}"
    return ""


def scenario_note(name, r):
    e = r.get("extra", {})
    notes = []
    if name == "create_warm" and "warm_pool_hits" in e:
        notes.append(f"{e['warm_pool_hits']}/{r['n']} from the pool, {e.get('pace_ms', 0)} ms pacing")
    if name in ("concurrent_create", "concurrent_create_warm") and "concurrency" in e:
        notes.append(f"{e['concurrency']} at once, rounds: {e.get('rounds', 1)}")
        if name == "concurrent_create_warm":
            notes.append(f"{e.get('warm_pool_hits', 0)}/{r['n']} from the pool, "
                         f"{e.get('settle_ms_before_each_round', 0)} ms to refill before each round")
    if name == "sustained" and "workers" in e:
        notes.append(f"{e['workers']} workers, {e.get('duration_s', '?')} s")
    if name in ("attach", "attach_binary") and "bytes" in e:
        notes.append(f"{e['bytes'] / 2**20:.0f} MiB")
    if name == "density" and "running" in e:
        notes.append(f"{e['running']} sandboxes; delete all: {fmt_ms(e.get('delete_all_ms'))} ms")
    if name == "pause_delete" and "note" in e:
        notes.append(e["note"])
    if r.get("errors"):
        msgs = r.get("error_messages") or []
        notes.append(f"first error: {msgs[0][:120]}" if msgs else "errors")
    s = status_note(r)
    if s:
        notes.append(s)
    return "; ".join(notes).replace("|", "\\|")


def result_rows(section, known, with_notes):
    rows = []
    for name, desc, r in ordered(section, known):
        row = [f"`{name}`", desc, str(r.get("n", 0)), str(r.get("errors", 0)),
               fmt_ms(r.get("p50_ms")), fmt_ms(r.get("p90_ms")), fmt_ms(r.get("p99_ms")), fmt_tp(r)]
        row.append(scenario_note(name, r) if with_notes else status_note(r).replace("|", "\\|"))
        rows.append(row)
    return rows


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def margin(t):
    m, goal, op = t.get("measured"), t["target"], t["op"]
    if m is None or goal == 0:
        return "–"
    ratio = m / goal
    if op == "<=":
        return f"{(1 - ratio) * 100:.0f}% under" if ratio <= 1 else f"{ratio:.2f}× the target"
    return f"{(ratio - 1) * 100:.0f}% over" if ratio >= 1 else f"{ratio * 100:.0f}% of the target"


def tables(d):
    meta = d.get("meta", {})
    parts = []
    parts.append(
        f"Run: {meta.get('date', '?')}, host `{meta.get('host', '?')}` ({meta.get('kernel', '?')}, "
        f"{meta.get('cpus', '?')} CPUs), commit `{meta.get('commit', '?')}`, mode "
        f"**{meta.get('mode', '?')}**. Latencies in ms (client over HTTP on loopback); "
        f"throughput as stated.")
    for n in meta.get("notes", []):
        parts.append(f"- {n}")
    hdr = ["name", "what", "n", "errors", "p50", "p90", "p99", "throughput", "notes"]
    parts.append("### Scenarios\n\n" + table(hdr, result_rows(d.get("scenarios", {}), SCENARIOS, True)))

    dens = d.get("scenarios", {}).get("density", {}).get("extra", {})
    if dens:
        def mib(k):
            v = dens.get(k)
            return "–" if v is None else f"{v:.2f} MiB"
        rows = [
            ["sandboxes running", str(dens.get("running", "–"))],
            ["host memory per sandbox (MemAvailable drop / N, kernel included)", mib("host_mem_per_sandbox_mib")],
            ["memory cgroup usage per sandbox", mib("cgroup_mem_per_sandbox_mib")],
            ["agent RSS per sandbox (VmRSS, shared pages counted in each)", mib("agent_rss_per_sandbox_mib")],
            ["sbxd RSS before → with all of them", f"{mib('sbxd_rss_before_mib')} → {mib('sbxd_rss_mib')}"],
            ["wall time to delete them all", f"{fmt_ms(dens.get('delete_all_ms'))} ms"],
        ]
        for n in dens.get("notes", []):
            rows.append(["note", n.replace("|", "\\|")])
        parts.append("### Density\n\n" + table(["measurement", "value"], rows))

    parts.append("### Peers (same run)\n\n" + table(hdr, result_rows(d.get("peers", {}), PEERS, False)))

    rrows = [[f"`{k}`", f"{v['value']:.2f}×", v["numerator"], v["denominator"]]
             for k, v in d.get("ratios", {}).items()]
    parts.append("### Ratios\n\n" + (table(["ratio", "value", "numerator", "denominator"], rrows)
                                      if rrows else "No ratio: a side was not measured."))

    trows = []
    for t in d.get("targets", []):
        met = {True: "met", False: "**missed**", None: "not measured"}[t.get("met")]
        m = t.get("measured")
        trows.append([t["name"], f"{t['op']} {t['target']:g} {t['unit']}",
                      "–" if m is None else f"{m:.2f} {t['unit']}", met, margin(t), t.get("basis", "")])
    parts.append("### Targets (medians unless stated; reports, never test assertions)\n\n" +
                 table(["target", "goal", "measured", "result", "by how much", "from"], trows))
    parts.append("![latency distributions](../bench/results/latency.png)")
    return "\n\n".join(parts) + "\n"


def micro_table(m):
    """Google Benchmark results: time per iteration and the throughput counters it reports."""
    rows = []
    for b in m.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        unit = b.get("time_unit", "ns")
        rate = ""
        if "bytes_per_second" in b:
            rate = f"{b['bytes_per_second'] / 1e6:,.0f} MB/s"
        elif "items_per_second" in b:
            rate = f"{b['items_per_second']:,.0f} items/s"
        rows.append([f"`{b['name']}`", f"{b['real_time']:,.1f} {unit}", f"{b['cpu_time']:,.1f} {unit}",
                     str(b.get("iterations", "")), rate])
    ctx = m.get("context", {})
    head = (f"### Micro-benchmarks (`sbx-micro-bench`, Google Benchmark, {ctx.get('num_cpus', '?')} CPUs, "
            f"libbenchmark build type {ctx.get('library_build_type', '?')})\n\n")
    return head + table(["benchmark", "real time", "CPU time", "iterations", "throughput"], rows) + "\n"


def series(d):
    out = []
    for section, known, kind in (("scenarios", SCENARIOS, "sbx"), ("peers", PEERS, "peer")):
        for name, _, r in ordered(d.get(section, {}), known):
            s = [v for v in r.get("samples_ms", []) if v and v > 0]
            if name in NOT_PLOTTED or not s:
                continue
            out.append((name, kind, sorted(s)))
    return out


def plot(d, png):
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        sys.exit("report: gnuplot not found (apt-get install gnuplot-nox)")
    data = series(d)
    if not data:
        sys.exit("report: no latency samples to plot")
    meta = d.get("meta", {})
    with tempfile.TemporaryDirectory(prefix="sbx-report.") as tmp:
        plots = []
        for i, (name, kind, samples) in enumerate(data):
            path = os.path.join(tmp, f"{i}.dat")
            n = len(samples)
            with open(path, "w") as f:
                # A step CDF: each sample raises the curve by 1/n.
                for j, v in enumerate(samples):
                    f.write(f"{v} {j / n}\n{v} {(j + 1) / n}\n")
            color = COLORS[i % len(COLORS)]
            style = f"lw 2 dt {'1' if kind == 'sbx' else '2'} lc rgb '{color}'"
            label = f"{name} ({kind}, n={n})"
            plots.append(f"'{path}' using 1:2 with lines {style} title \"{label}\"")
        title = (f"sbx latency distributions ({meta.get('mode', '?')} run, {meta.get('date', '?')}, "
                 f"commit {meta.get('commit', '?')}, {meta.get('cpus', '?')} CPUs)")
        script = os.path.join(tmp, "plot.gp")
        with open(script, "w") as f:
            f.write(f"""
set terminal pngcairo size 1500,900 font 'DejaVu Sans,11' noenhanced
set output '{png}'
set title "{title}" noenhanced
set logscale x 10
set xlabel 'latency (ms, log scale)'
set ylabel 'fraction of iterations ≤ x'
set yrange [0:1.02]
set grid xtics mxtics ytics
set key outside right top noenhanced
set format x '%g'
plot {", ".join(plots)}
""")
        subprocess.run([gnuplot, script], check=True)
    if not os.path.exists(png) or os.path.getsize(png) == 0:
        sys.exit(f"report: gnuplot did not write {png}")


def update_docs(path, block):
    text = open(path).read()
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        sys.exit(f"report: {path} has no {BEGIN} … {END} block")
    new = text[: b + len(BEGIN)] + "\n" + block + text[e:]
    with open(path, "w") as f:
        f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in", dest="inp", default="bench/results/latest.json")
    ap.add_argument("--png", default="bench/results/latency.png")
    ap.add_argument("--micro", help="Google Benchmark JSON of sbx-micro-bench (optional)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--docs", help="update the generated block of this Markdown file in place")
    g.add_argument("--tables-out", help="write the tables to this file")
    args = ap.parse_args()
    with open(args.inp) as f:
        d = json.load(f)
    plot(d, os.path.abspath(args.png))
    block = tables(d)
    if args.micro and os.path.exists(args.micro):
        with open(args.micro) as f:
            block += "\n" + micro_table(json.load(f))
    if args.docs:
        update_docs(args.docs, block)
    elif args.tables_out:
        with open(args.tables_out, "w") as f:
            f.write(block)
    else:
        sys.stdout.write(block)
    print(f"report: wrote {args.png}" + (f" and {args.docs or args.tables_out}" if (args.docs or args.tables_out) else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()

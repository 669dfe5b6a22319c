#!/usr/bin/env python3
"""Turns sbx-load's JSON into a latency plot and the tables of docs/benchmarks.md.

Usage:
  python3 bench/report.py [--in bench/results/latest.json] [--png bench/results/latency.png]
                          [--file-transfer bench/results/file_transfer.json]
                          [--docs docs/benchmarks.md | --tables-out FILE]
                          [--spec SPECIFICATION.md | --spec-out FILE]

--docs replaces the block between `<!-- bench:begin -->` and `<!-- bench:end -->` in place
(the rest of the page is hand-written); --tables-out writes the same tables to a file instead.
--spec does the same for the `<!-- spec:begin -->` … `<!-- spec:end -->` block of
SPECIFICATION.md: every performance promise with its last measured value, the commit it was
measured at, and its repeatable form (CPU time, syscalls); --spec-out writes that block to a file.
The file transfer figures (bench/file_transfer.sh) come from --file-transfer when it exists.
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
SPEC_BEGIN = "<!-- spec:begin -->"
SPEC_END = "<!-- spec:end -->"

# Display order and short descriptions; names not listed here follow in JSON order.
SCENARIOS = [
    ("create_cold", "create → running (cold)"),
    ("create_warm", "create → running (warm pool)"),
    ("first_output", "create → first stdout byte of `echo hi`"),
    ("first_output_exit", "create → `echo hi` exited"),
    ("exec", "exec `true` in a running sandbox (one request: create + its stream)"),
    ("exec_split", "exec `true`, two requests (create, then attach)"),
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

    rep = repeatable_rows(d)
    if rep:
        parts.append("### Repeatable forms (CPU time and syscalls per operation)\n\n"
                     "sbxd and every process it started during the scenario (holders, agents, "
                     "the commands), user + kernel time, over the metered pass that follows the "
                     "timed steps "
                     "(`perf stat -e task-clock,raw_syscalls:sys_enter -p`); kernel threads are "
                     "not in it. `host CPU` is every CPU's busy time over the same windows "
                     "(/proc/stat): kernel threads included, but also anything else that ran, "
                     "so it means something on an idle host only.\n\n" +
                     table(["scenario", "CPU ms / op", "syscalls / op", "host CPU ms / op",
                            "CPU ns / byte", "ops metered"], rep))
    ft = d.get("_file_transfer")
    if ft:
        parts.append(file_transfer_table(ft))

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


def fmt_num(v, digits=2):
    if v is None:
        return "–"
    if abs(v) >= 1000 or (abs(v) >= 100 and float(v).is_integer()):
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def repeatable_rows(d):
    rows = []
    for r in d.get("repeatable", []):
        if "cpu_unavailable" in r:
            rows.append([f"`{r['scenario']}`", f"unavailable: {r['cpu_unavailable']}".replace("|", "\\|"),
                         "", "", "", ""])
            continue
        rows.append([f"`{r['scenario']}`", fmt_num(r.get("cpu_ms_per_op"), 3),
                     fmt_num(r.get("syscalls_per_op"), 0), fmt_num(r.get("host_cpu_ms_per_op"), 3),
                     fmt_num(r.get("cpu_ns_per_byte"), 3), fmt_num(r.get("cpu_ops"), 0)])
    return rows


def file_transfer_table(ft):
    m = ft.get("meta", {})
    sbx, bw = ft.get("sbx", {}), ft.get("bwrap", {})
    rows = []
    for step in ("upload", "download"):
        a, b = sbx.get(step, {}), bw.get(step, {})
        rows.append([step, f"{fmt_num(a.get('s'))} s ({fmt_num(a.get('mib_per_s'), 0)} MiB/s)",
                     f"{fmt_num(b.get('s'))} s ({fmt_num(b.get('mib_per_s'), 0)} MiB/s)",
                     f"{fmt_num(ft.get('ratios', {}).get(step + '_vs_bwrap'))}×",
                     fmt_num(a.get("cpu_ms_per_mib"), 2), fmt_num(a.get("syscalls_per_mib"), 0)])
    head = (f"### File transfer (`bash bench/file_transfer.sh {m.get('mib', '?')}`, "
            f"{m.get('date', '?')}, commit `{m.get('commit', '?')}`)\n\n")
    return head + table(["step", "sbx", "bwrap peer", "sbx / bwrap (time)", "CPU ms / MiB",
                         "syscalls / MiB"], rows) + \
        f"\n\nsbxd VmHWM after both: {fmt_num((sbx.get('sbxd_vmhwm_kib') or 0) / 1024, 1)} MiB."


# --- SPECIFICATION.md ---------------------------------------------------------------------------
# Every performance promise. The goals are the ones bench/load/report.cc judges latest.json by
# (issue 15's table and the earlier targets); the file transfer ones are judged here, since
# bench/file_transfer.sh is a script. `measured` reads the last run; `form` its repeatable form.

def _sc(d, name):
    r = d.get("scenarios", {}).get(name)
    return r if isinstance(r, dict) else {}


def _ratio(name):
    return lambda d, ft: (d.get("ratios", {}).get(name) or {}).get("value")


def _p(name, key):
    return lambda d, ft: _sc(d, name).get(key)


def _tp(name):
    return lambda d, ft: (_sc(d, name).get("throughput") or {}).get("value")


def _extra(name, key):
    return lambda d, ft: _sc(d, name).get("extra", {}).get(key)


def _ft_ratio(step):
    return lambda d, ft: (ft or {}).get("ratios", {}).get(f"{step}_vs_bwrap")


def _cpu(name, with_bytes=False):
    def form(d, ft):
        e = _sc(d, name).get("extra", {})
        if "cpu_ms_per_op" not in e:
            return e.get("cpu_unavailable") and f"unavailable: {e['cpu_unavailable']}"
        out = f"{fmt_num(e['cpu_ms_per_op'], 3)} CPU ms, {fmt_num(e.get('syscalls_per_op'), 0)} syscalls / op"
        if with_bytes and e.get("cpu_ns_per_byte") is not None:
            out = f"{fmt_num(e['cpu_ns_per_byte'], 3)} CPU ns / byte, " + out
        return out
    return form


def _ft_cpu(step):
    def form(d, ft):
        a = (ft or {}).get("sbx", {}).get(step, {})
        if a.get("cpu_ms_per_mib") is None:
            return None
        return (f"{fmt_num(a['cpu_ms_per_mib'], 2)} CPU ms, "
                f"{fmt_num(a.get('syscalls_per_mib'), 0)} syscalls / MiB")
    return form


def _first_output_form(d, ft):
    a = _sc(d, "create_cold").get("extra", {}).get("cpu_ms_per_op")
    b = _sc(d, "exec").get("extra", {}).get("cpu_ms_per_op")
    if a is None or b is None:
        return None
    return f"≈ create_cold + exec: {fmt_num(a + b, 3)} CPU ms"


def _concurrent_form(d, ft):
    cpu = _sc(d, "create_cold").get("extra", {}).get("cpu_ms_per_op")
    n = _sc(d, "concurrent_create").get("extra", {}).get("concurrency", 50)
    cpus = d.get("meta", {}).get("cpus")
    if cpu is None or not cpus:
        return None
    return (f"CPU floor of the burst: {n} × {fmt_num(cpu, 3)} ms / {cpus} CPUs = "
            f"{fmt_num(n * cpu / cpus, 1)} ms")


def _sustained_form(d, ft):
    cpu = _sc(d, "sustained").get("extra", {}).get("cpu_ms_per_op")
    cpus = d.get("meta", {}).get("cpus")
    if cpu is None or not cpus:
        return _cpu("sustained")(d, ft)
    return (f"{fmt_num(cpu, 3)} CPU ms / cycle → CPU ceiling {cpus} × 1000 / {fmt_num(cpu, 3)} = "
            f"{fmt_num(cpus * 1000 / cpu, 0)} cycles/s")


LOAD = "`sbx-load --scenarios {}` (tools/bench.sh)"
PROMISES = [
    dict(promise="Upload 256 MiB (PUT, fsync + rename)", op="<=", goal=2.0, unit="× bwrap",
         by="`bash bench/file_transfer.sh 256`", peer="bwrap `sh -c 'cat > f && sync f'`",
         measured=_ft_ratio("upload"), form=_ft_cpu("upload"), source="ft"),
    dict(promise="Download 256 MiB (GET) + sha256", op="<=", goal=1.2, unit="× bwrap",
         by="`bash bench/file_transfer.sh 256`", peer="bwrap `cat f` + sha256",
         measured=_ft_ratio("download"), form=_ft_cpu("download"), source="ft"),
    dict(promise="Attach throughput (SSE, the default)", op=">=", goal=0.8, unit="× pipe",
         by=LOAD.format("attach"), peer="`pipe`: `cat /dev/zero \\| head -c N`, run beside each attach run",
         measured=_ratio("attach_vs_pipe"), form=_cpu("attach", True)),
    dict(promise="Attach throughput, binary stream (asked for by the client)", op=">=", goal=0.8,
         unit="× pipe", by=LOAD.format("attach_binary"), peer="`pipe`, run beside each attach run",
         measured=_ratio("attach_binary_vs_pipe"), form=_cpu("attach_binary", True)),
    dict(promise="Exec round trip p50 (`true`, one request: create + its stream)", op="<=", goal=1.5,
         unit="× fork+exec", by=LOAD.format("exec"), peer="`fork_exec_true`",
         measured=_ratio("exec_vs_fork_exec"), form=_cpu("exec")),
    dict(promise="Create → running, cold, p50", op="<=", goal=0.5, unit="× bwrap",
         by=LOAD.format("create_cold"), peer="`bwrap_echo`",
         measured=_ratio("create_cold_vs_bwrap"), form=_cpu("create_cold")),
    dict(promise="Create → running, cold, p50 (absolute)", op="<=", goal=10, unit="ms",
         by=LOAD.format("create_cold"), peer="–", measured=_p("create_cold", "p50_ms"),
         form=_cpu("create_cold")),
    dict(promise="Create → running from the warm pool, p50", op="<=", goal=3, unit="ms",
         by=LOAD.format("create_warm"), peer="–", measured=_p("create_warm", "p50_ms"),
         form=None),
    dict(promise="Create → first output of `echo hi`, cold, p50", op="<=", goal=1.0,
         unit="× bwrap", by=LOAD.format("first_output"), peer="`bwrap_echo`",
         measured=_ratio("first_output_vs_bwrap"), form=_first_output_form),
    dict(promise="50 concurrent cold creates → running, p99", op="<=", goal=150, unit="ms",
         by=LOAD.format("concurrent_create"), peer="–",
         measured=_p("concurrent_create", "p99_ms"), form=_concurrent_form),
    dict(promise="50 concurrent creates from the warm pool, p99", op="<=", goal=150, unit="ms",
         by=LOAD.format("concurrent_create_warm"), peer="–",
         measured=_p("concurrent_create_warm", "p99_ms"), form=None),
    dict(promise="Sustained create + exec + delete (8 workers)", op=">=", goal=200,
         unit="cycles/s", by=LOAD.format("sustained"), peer="–", measured=_tp("sustained"),
         form=_sustained_form),
    dict(promise="Running sandboxes on one host (24 GiB)", op=">=", goal=5000, unit="sandboxes",
         by=LOAD.format("density"), peer="–", measured=_extra("density", "running"),
         form=None),
    dict(promise="Host memory per idle sandbox", op="<=", goal=3, unit="MiB",
         by=LOAD.format("density"), peer="–", measured=_extra("density", "host_mem_per_sandbox_mib"),
         form=lambda d, ft: (lambda v: v is not None and
                             f"memory cgroup {fmt_num(v, 2)} MiB / sandbox")(
             _extra("density", "cgroup_mem_per_sandbox_mib")(d, ft))),
    dict(promise="sbxd RSS with the density scenario's sandboxes", op="<=", goal=150, unit="MiB",
         by=LOAD.format("density"), peer="–", measured=_extra("density", "sbxd_rss_mib"),
         form=None),
]


def judge(op, goal, v):
    if v is None:
        return "not measured"
    ok = v <= goal if op == "<=" else v >= goal
    return "met" if ok else "**missed**"


def spec_block(d, ft):
    meta = d.get("meta", {})
    lines = [f"Generated by `bench/report.py --spec` from `bench/results/latest.json` "
             f"({meta.get('mode', '?')} run {meta.get('date', '?')}, commit "
             f"`{meta.get('commit', '?')}`, {meta.get('cpus', '?')} CPUs, {meta.get('kernel', '?')})"]
    if ft:
        fm = ft.get("meta", {})
        lines[0] += (f" and `bench/results/file_transfer.json` ({fm.get('mib', '?')} MiB, "
                     f"{fm.get('date', '?')}, commit `{fm.get('commit', '?')}`)")
    else:
        lines[0] += "; no file transfer results (bench/results/file_transfer.json) yet"
    lines[0] += ". Edit the prose around this block, not the block."
    rows = []
    for i, p in enumerate(PROMISES, 1):
        v = p["measured"](d, ft)
        unit = p["unit"]
        shown = "–" if v is None else (f"{fmt_num(v)}×" if unit.startswith("×") else
                                        f"{fmt_num(v)} {unit}")
        goal = f"{p['op'].replace('<=', '≤').replace('>=', '≥')} {p['goal']:g}" + \
            (unit if unit.startswith("×") else f" {unit}")
        src = ft.get("meta", {}) if p.get("source") == "ft" and ft else meta
        if p.get("source") == "ft" and v is not None and src.get("mib") != 256:
            shown += f" (of {src.get('mib')} MiB)"
        when = f"`{src.get('commit', '?')}` {str(src.get('date', '?'))[:10]}" if v is not None else "–"
        form = p["form"](d, ft) if p["form"] else None
        rows.append([f"P{i}", p["promise"], goal, p["by"], p["peer"], shown, judge(p["op"], p["goal"], v),
                     when, form or "–"])
    lines.append(table(["#", "promise", "goal", "measured by", "peer (same run)", "last measured",
                        "result", "commit, date", "repeatable form (last)"], rows))
    return "\n\n".join(lines) + "\n"


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


def print_repeatable(d, ft):
    """A plain-text table for a terminal or a CI log."""
    meta = d.get("meta", {})
    print(f"repeatable forms ({meta.get('mode', '?')} run, commit {meta.get('commit', '?')}): "
          f"sbxd + the processes it started, metered pass after the timed one")
    rows = [["scenario", "CPU ms/op", "syscalls/op", "host CPU ms/op", "CPU ns/byte", "ops"]]
    rows += [[c.strip("`") for c in r] for r in repeatable_rows(d)]
    if ft:
        for step in ("upload", "download"):
            a = ft.get("sbx", {}).get(step, {})
            rows.append([f"{step} (per MiB)", fmt_num(a.get("cpu_ms_per_mib"), 3),
                         fmt_num(a.get("syscalls_per_mib"), 0), "–", "–",
                         str(ft.get("meta", {}).get("mib", "?"))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))


def update_docs(path, block, begin=BEGIN, end=END):
    text = open(path).read()
    b, e = text.find(begin), text.find(end)
    if b < 0 or e < b:
        sys.exit(f"report: {path} has no {begin} … {end} block")
    new = text[: b + len(begin)] + "\n" + block + text[e:]
    with open(path, "w") as f:
        f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in", dest="inp", default="bench/results/latest.json")
    ap.add_argument("--png", default="bench/results/latency.png")
    ap.add_argument("--micro", help="Google Benchmark JSON of sbx-micro-bench (optional)")
    ap.add_argument("--file-transfer", help="bench/file_transfer.sh's JSON (used when it exists)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--docs", help="update the generated block of this Markdown file in place")
    g.add_argument("--tables-out", help="write the tables to this file")
    s = ap.add_mutually_exclusive_group()
    s.add_argument("--spec", help="update the generated block of SPECIFICATION.md in place")
    s.add_argument("--spec-out", help="write SPECIFICATION.md's generated block to this file")
    ap.add_argument("--no-plot", action="store_true", help="tables only (no gnuplot)")
    ap.add_argument("--print-repeatable", action="store_true",
                    help="only print the repeatable forms (CPU time, syscalls) as a table")
    args = ap.parse_args()
    with open(args.inp) as f:
        d = json.load(f)
    ft = None
    if args.file_transfer and os.path.exists(args.file_transfer):
        with open(args.file_transfer) as f:
            ft = json.load(f)
        d["_file_transfer"] = ft
    if args.print_repeatable:
        print_repeatable(d, ft)
        return
    if not args.no_plot:
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
    if args.spec:
        update_docs(args.spec, spec_block(d, ft), SPEC_BEGIN, SPEC_END)
    elif args.spec_out:
        with open(args.spec_out, "w") as f:
            f.write(spec_block(d, ft))
    wrote = ([] if args.no_plot else [args.png]) + [p for p in (args.docs, args.tables_out, args.spec,
                                                                 args.spec_out) if p]
    print(f"report: wrote {', '.join(wrote) or 'the tables to stdout'}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tests of tools/flamegraph.py on a small `perf script` fixture (the shape perf 6.1 prints for
`perf script -F comm,pid,tid,cpu,time,period,event,ip,sym,dso --show-task-events`): folding,
frame names, the process-tree filter, and an SVG whose boxes are as wide as their samples."""
from __future__ import annotations

import os
import re
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flamegraph  # noqa: E402

# sbxd (pid 100) forks a holder (200) which forks the agent (300); an unrelated cc1plus (900)
# and a kworker run at the same time. Four samples of sbxd, two of the agent.
FIXTURE = """\
swapper     0/0     [000]     0.000000: PERF_RECORD_FORK(1:1):(0:0)
sbxd   100/100   [000]  10.000000: PERF_RECORD_FORK(101:101):(100:100)
sbxd   100/101   [000]  10.000100: PERF_RECORD_FORK(100:102):(100:101)
sbxd   100/101   [000]  10.000200: PERF_RECORD_FORK(200:200):(100:101)
sbxd   200/200   [001]  10.000300: PERF_RECORD_COMM: sbxd:200/200
sbxd   200/200   [001]  10.000400: PERF_RECORD_FORK(300:300):(200:200)
sbxd   100/101   [000]  10.001000:     250000 cpu-clock:
\tffffffff81100000 copy_process+0x120 ([kernel.kallsyms])
\tffffffff81100100 __do_sys_clone3+0x90 ([kernel.kallsyms])
\t          4a1234 sbx::runtime::Spawn(sbx::Spec const&)+0x44 (/work/build/bin/sbxd)
\t          4a0000 main+0x10 (/work/build/bin/sbxd)

sbxd   100/102   [001]  10.002000:     250000 cpu-clock:
\tffffffff81100000 copy_process+0x200 ([kernel.kallsyms])
\tffffffff81100100 __do_sys_clone3+0x90 ([kernel.kallsyms])
\t          4a1234 sbx::runtime::Spawn(sbx::Spec const&)+0x50 (/work/build/bin/sbxd)
\t          4a0000 main+0x10 (/work/build/bin/sbxd)

sbxd   100/101   [000]  10.003000:     250000 cpu-clock:
\t          4a2000 std::vector<int, std::allocator<int> >::push_back(int&&)+0x8 (/work/build/bin/sbxd)
\t          4a0000 main+0x10 (/work/build/bin/sbxd)

sbxd   100/101   [000]  10.004000:     250000 cpu-clock:
\t          123456 [unknown] (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t          1e0000 [unknown] ([unknown])
\t          1e0001 [unknown] ([unknown])
\t          4a0000 main+0x10 (/work/build/bin/sbxd)

sbx-agent   300/300   [001]  10.005000:     250000 cpu-clock:
\tffffffff81200000 do_mount+0x10 ([kernel.kallsyms])
\t          5b0000 sbx::agent::Run()+0x1c (/work/build/bin/sbx-agent)

sbx-agent   300/300   [001]  10.006000:     250000 cpu-clock:
\tffffffff81200000 do_mount+0x10 ([kernel.kallsyms])
\t          5b0000 sbx::agent::Run()+0x1c (/memfd:sbx-agent (deleted))

cc1plus   900/900   [000]  10.007000:     250000 cpu-clock:
\t          700000 ggc_collect+0x5 (/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus)

kworker/u4:2-ev    55/55    [001]  10.008000:     250000 cpu-clock:
\tffffffff81300000 cgroup_destroy_wq+0x5 ([kernel.kallsyms])

"""


def lines():
    return FIXTURE.splitlines(keepends=True)


class CollapseTest(unittest.TestCase):
    def test_folds_every_sample_root_first(self):
        stacks = flamegraph.collapse(lines())
        self.assertEqual(sum(stacks.values()), 8)
        # Two samples at different offsets of the same functions are one stack.
        self.assertEqual(stacks["sbxd;main;sbx::runtime::Spawn(sbx::Spec const&);"
                                "__do_sys_clone3_[k];copy_process_[k]"], 2)
        # The second agent sample names its object "/memfd:sbx-agent (deleted)": same frame.
        self.assertEqual(stacks["sbx-agent;sbx::agent::Run();do_mount_[k]"], 2)
        self.assertEqual(stacks["kworker/u4:2-ev;cgroup_destroy_wq_[k]"], 1)

    def test_names_unresolved_frames_by_object_and_merges_repeats(self):
        stacks = flamegraph.collapse(lines())
        # "[unknown] ([unknown])" twice in a row is one box; a libc address says libc.
        self.assertEqual(stacks["sbxd;main;[unknown];[libc.so.6]"], 1)
        self.assertEqual(flamegraph.frame_name("[unknown]", "/memfd:sbx-agent (deleted)"),
                         "[memfd:sbx-agent]")

    def test_process_tree_keeps_sbxd_and_what_it_forked_only(self):
        samples, parents = flamegraph.parse(lines())
        self.assertEqual(parents, {1: 0, 101: 100, 200: 100, 300: 200})
        keep = flamegraph.descendants([100], parents)
        self.assertEqual(keep, {100, 101, 200, 300})
        stacks = flamegraph.fold(samples, keep_pids=keep)
        self.assertEqual({s.split(";")[0] for s in stacks}, {"sbxd", "sbx-agent"})
        self.assertEqual(sum(stacks.values()), 6)
        with_kthreads = flamegraph.fold(samples, keep_pids=keep,
                                        keep_comm=re.compile(r"^kworker"))
        self.assertEqual(sum(with_kthreads.values()), 7)
        dropped = flamegraph.fold(samples, drop_comm=re.compile(r"^cc1plus$"))
        self.assertEqual(sum(dropped.values()), 7)

    def test_folded_form_round_trips(self):
        stacks = flamegraph.collapse(lines())
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "f")
            with open(p, "w") as f:
                flamegraph.write_folded(stacks, f)
            with open(p) as f:
                self.assertEqual(flamegraph.read_folded(f), stacks)
        with self.assertRaises(ValueError):
            flamegraph.read_folded(["no count here\n"])


class ShortNameTest(unittest.TestCase):
    def test_drops_template_arguments_and_parameters(self):
        self.assertEqual(flamegraph.short_name(
            "boost::asio::detail::executor_op<boost::asio::detail::executor_function, "
            "std::allocator<void> >::do_complete(void*, int)"),
            "boost::asio::detail::executor_op<…>::do_complete")
        self.assertEqual(flamegraph.short_name("std::vector<int, std::allocator<int> >::push_back(int&&)"),
                         "std::vector<…>::push_back")

    def test_keeps_what_names_the_frame(self):
        self.assertEqual(flamegraph.short_name("sbx::runtime::ns::(anonymous namespace)::ChildEntry"),
                         "sbx::runtime::ns::(anonymous namespace)::ChildEntry")
        self.assertEqual(flamegraph.short_name("copy_process_[k]"), "copy_process_[k]")
        self.assertEqual(flamegraph.short_name("std::function<void ()>::operator()"),
                         "std::function<…>::operator()")
        self.assertEqual(flamegraph.short_name("operator new(unsigned long)"), "operator new")

    def test_merges_instantiations_in_the_folded_form(self):
        samples = [("p", 1, ["f<int>(int)", "g"]), ("p", 1, ["f<long>(long)", "g"])]
        self.assertEqual(flamegraph.fold(samples, short=True), Counter({"p;f<…>;g": 2}))


def boxes(svg: str):
    """(title, x, width) of every box."""
    root = ET.fromstring(svg)
    ns = {"s": "http://www.w3.org/2000/svg"}
    out = []
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        t, r = g.find("s:title", ns), g.find("s:rect", ns)
        if t is not None and r is not None:
            out.append((t.text, float(r.get("x")), float(r.get("width"))))
    return out


class RenderTest(unittest.TestCase):
    def test_widths_follow_sample_counts(self):
        stacks = flamegraph.collapse(lines())
        svg = flamegraph.render(stacks, title="t <&> x", width=1000)
        b = {t.split(" (")[0]: (x, w) for t, x, w in boxes(svg)}
        total_w = b["all"][1]
        self.assertAlmostEqual(total_w, 1000 - 20, places=1)
        # sbxd had 4 of 8 samples, the agent 2, cc1plus and the kworker 1 each.
        self.assertAlmostEqual(b["sbxd"][1], total_w * 4 / 8, places=1)
        self.assertAlmostEqual(b["sbx-agent"][1], total_w * 2 / 8, places=1)
        self.assertAlmostEqual(b["cc1plus"][1], total_w / 8, places=1)
        # Children sit inside their parent.
        self.assertGreaterEqual(b["main"][0], b["sbxd"][0])
        self.assertLessEqual(b["main"][0] + b["main"][1], b["sbxd"][0] + b["sbxd"][1] + 0.01)

    def test_tooltips_carry_counts_and_shares_and_names_are_escaped(self):
        svg = flamegraph.render(flamegraph.collapse(lines()))
        titles = [t for t, _, _ in boxes(svg)]  # parsing at all proves the escaping
        self.assertIn("sbx-agent (2 samples, 25.00%)", titles)
        self.assertIn("all (8 samples, 100.00%)", titles)
        self.assertTrue(any(t.startswith("std::vector<int, std::allocator<int> >::push_back")
                            for t in titles))

    def test_labels_are_cut_to_fit(self):
        stacks = Counter({"p;" + "x" * 200: 1, "p;short": 99})
        svg = flamegraph.render(stacks, width=600)
        texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
        self.assertIn("short", texts)
        self.assertFalse(any(t and "x" * 200 in t for t in texts))

    def test_narrow_boxes_are_left_out_but_counted(self):
        stacks = Counter({"p;big": 100000, "p;tiny": 1})
        svg = flamegraph.render(stacks, width=400, min_width=0.1)
        titles = [t for t, _, _ in boxes(svg)]
        self.assertFalse(any(t.startswith("tiny") for t in titles))
        self.assertIn("p (100001 samples, 100.00%)", titles)

    def test_no_samples_is_still_an_svg(self):
        ET.fromstring(flamegraph.render(Counter()))

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            src, svg, folded = (os.path.join(d, n) for n in ("perf.txt", "o.svg", "o.folded"))
            with open(src, "w") as f:
                f.write(FIXTURE)
            rc = flamegraph.main(["--in", src, "--out", svg, "--folded-out", folded,
                                  "--pid-tree", "100", "--title", "create"])
            self.assertEqual(rc, 0)
            with open(folded) as f:
                self.assertEqual(sum(flamegraph.read_folded(f).values()), 6)
            with open(svg) as f:
                self.assertIn("create", f.read())
            # Folded input filtered by its root frame (the process name).
            rc = flamegraph.main(["--folded-in", folded, "--out", svg, "--drop-comm", "^sbx-agent$"])
            self.assertEqual(rc, 0)
            with open(svg) as f:
                self.assertIn("all (4 samples, 100.00%)", f.read())
            # Nothing left after filtering: a failure, so a script notices an empty profile.
            self.assertEqual(flamegraph.main(["--in", src, "--out", svg, "--pid-tree", "4242"]), 1)


if __name__ == "__main__":
    unittest.main()

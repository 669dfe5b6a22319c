#!/usr/bin/env python3
"""Unit tests of bench/report.py's SPECIFICATION.md block and repeatable-form tables, on small
hand-written results (run by ctest as report_test): each promise reads the right figure and is
judged in the right direction, a missing figure is "not measured", and only the marked block of
a page is rewritten."""
import contextlib
import io
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402


def latest():
    return {
        "meta": {"commit": "abc1234", "date": "2026-12-02T10:00:00Z", "cpus": 2, "mode": "standard"},
        "scenarios": {
            "create_cold": {"p50_ms": 3.0, "extra": {"cpu_ms_per_op": 4.0, "syscalls_per_op": 660.0}},
            "exec": {"p50_ms": 2.0, "extra": {"cpu_ms_per_op": 2.4, "syscalls_per_op": 325.0}},
            "concurrent_create": {"p99_ms": 180.0, "extra": {"concurrency": 50}},
            "sustained": {"throughput": {"value": 150.0, "unit": "cycles/s"}, "extra": {"cpu_ms_per_op": 10.0}},
            "density": {"extra": {"running": 5000, "host_mem_per_sandbox_mib": 0.8}},
        },
        "ratios": {"create_cold_vs_bwrap": {"value": 0.45}, "exec_vs_fork_exec": {"value": 2.1},
                   "attach_vs_pipe": {"value": 0.9}},
        "repeatable": [{"scenario": "create_cold", "cpu_ms_per_op": 4.0, "syscalls_per_op": 660.0,
                        "cpu_ops": 200},
                       {"scenario": "exec", "cpu_unavailable": "no --sbxd-pid"}],
    }


def file_transfer():
    return {"meta": {"mib": 256, "commit": "def5678", "date": "2026-12-02T10:05:00Z"},
            "sbx": {"upload": {"s": 0.7, "mib_per_s": 365.0, "cpu_ms_per_mib": 1.4,
                               "syscalls_per_mib": 171.0},
                    "download": {"s": 2.0, "mib_per_s": 128.0}},
            "bwrap": {"upload": {"s": 0.4}, "download": {"s": 1.5}},
            "ratios": {"upload_vs_bwrap": 1.75, "download_vs_bwrap": 1.33}}


def row(block, promise):
    for line in block.splitlines():
        if f"| {promise} |" in line:
            # "\\|" inside a cell is a literal bar, not a column.
            return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    raise AssertionError(f"no row for {promise!r} in:\n{block}")


class SpecBlockTest(unittest.TestCase):
    def test_every_promise_has_a_row(self):
        block = report.spec_block(latest(), file_transfer())
        for p in report.PROMISES:
            row(block, p["promise"])

    def test_judges_each_direction(self):
        block = report.spec_block(latest(), file_transfer())
        self.assertEqual(row(block, "Create → running, cold, p50")[6], "met")          # 0.45 <= 0.5
        self.assertEqual(row(block, "Exec round trip p50 (`true`, one request: create + its stream)")[6],
                         "**missed**")                                                  # 2.1 > 1.5
        self.assertEqual(row(block, "Attach throughput (SSE, the default)")[6], "met")  # 0.9 >= 0.8
        self.assertEqual(row(block, "Sustained create + exec + delete (8 workers)")[6], "**missed**")
        self.assertEqual(row(block, "Running sandboxes on one host (24 GiB)")[6], "met")
        self.assertEqual(row(block, "Upload 256 MiB (PUT, fsync + rename)")[6], "met")
        self.assertEqual(row(block, "Download 256 MiB (GET) + sha256")[6], "**missed**")

    def test_names_commits_and_repeatable_forms(self):
        block = report.spec_block(latest(), file_transfer())
        up = row(block, "Upload 256 MiB (PUT, fsync + rename)")
        self.assertIn("def5678", up[7])
        self.assertIn("1.40 CPU ms, 171 syscalls / MiB", up[8])
        create = row(block, "Create → running, cold, p50")
        self.assertIn("abc1234", create[7])
        self.assertIn("660 syscalls / op", create[8])
        burst = row(block, "50 concurrent cold creates → running, p99")
        self.assertIn("50 × 4.000 ms / 2 CPUs = 100 ms", burst[8])
        sustained = row(block, "Sustained create + exec + delete (8 workers)")
        self.assertIn("200 cycles/s", sustained[8])

    def test_missing_figures_are_not_measured(self):
        block = report.spec_block(latest(), None)
        binary = row(block, "Attach throughput, binary stream (asked for by the client)")
        self.assertEqual((binary[5], binary[6]), ("–", "not measured"))
        self.assertEqual(row(block, "Upload 256 MiB (PUT, fsync + rename)")[6], "not measured")
        self.assertIn("no file transfer results", block)

    def test_a_smaller_transfer_says_its_size(self):
        ft = file_transfer()
        ft["meta"]["mib"] = 16
        self.assertIn("(of 16 MiB)", row(report.spec_block(latest(), ft),
                                         "Upload 256 MiB (PUT, fsync + rename)")[5])

    def test_only_the_marked_block_is_rewritten(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "SPEC.md")
            with open(p, "w") as f:
                f.write(f"intro\n{report.SPEC_BEGIN}\nold\n{report.SPEC_END}\noutro\n")
            report.update_docs(p, "new\n", report.SPEC_BEGIN, report.SPEC_END)
            with open(p) as f:
                self.assertEqual(f.read(), f"intro\n{report.SPEC_BEGIN}\nnew\n{report.SPEC_END}\noutro\n")


class RepeatableTest(unittest.TestCase):
    def test_rows_and_the_printed_table(self):
        rows = report.repeatable_rows(latest())
        self.assertEqual(rows[0][:3], ["`create_cold`", "4.000", "660"])
        self.assertIn("unavailable: no --sbxd-pid", rows[1][1])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            report.print_repeatable(latest(), file_transfer())
        text = out.getvalue()
        self.assertIn("create_cold", text)
        self.assertIn("upload (per MiB)", text)
        self.assertIn("171", text)

    def test_tables_carry_the_forms_and_the_file_transfer(self):
        d = latest()
        d["ratios"] = {}  # sbx-load's ratios carry numerator and denominator; not needed here
        d["_file_transfer"] = file_transfer()
        text = report.tables(d)
        self.assertIn("### Repeatable forms", text)
        self.assertIn("### File transfer (`bash bench/file_transfer.sh 256`", text)
        self.assertIn("| upload | 0.70 s (365 MiB/s) | 0.40 s", text)


if __name__ == "__main__":
    unittest.main()

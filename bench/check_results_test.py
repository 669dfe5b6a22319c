#!/usr/bin/env python3
"""Unit tests of bench/check_results.py on small fixture directories (run by ctest as
check_results_test): a complete run passes; a skipped, failed, missing or erroring pause
scenario fails, as does any other scenario or peer without samples."""
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_results  # noqa: E402


def good_results():
    ok = {"n": 3, "errors": 0, "p50_ms": 1.0}
    r = {
        "meta": {}, "ratios": {}, "targets": {}, "repeatable": [],
        "scenarios": {name: copy.deepcopy(ok) for name in check_results.SCENARIOS},
        "peers": {name: dict(ok) for name in check_results.PEERS},
    }
    for name in check_results.METERED:
        r["scenarios"][name]["extra"] = {"cpu_ms_per_op": 3.2, "syscalls_per_op": 850.0}
    return r


def good_file_transfer():
    step = {"s": 0.5, "cpu_ms_per_mib": 2.0, "syscalls_per_mib": 40.0}
    return {"meta": {"mib": 16}, "sbx": {"upload": dict(step), "download": dict(step)},
            "ratios": {"upload_vs_bwrap": 1.7, "download_vs_bwrap": 1.0}}


class CheckResultsTest(unittest.TestCase):
    def write(self, results, micro=None, png=b"\x89PNG", ft="good"):
        d = tempfile.mkdtemp(prefix="sbx-check-results-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d], check=False))
        with open(os.path.join(d, "latest.json"), "w") as f:
            json.dump(results, f)
        with open(os.path.join(d, "micro.json"), "w") as f:
            json.dump(micro if micro is not None else {"benchmarks": [{"name": "x", "iterations": 10}]}, f)
        if png is not None:
            with open(os.path.join(d, "latency.png"), "wb") as f:
                f.write(png)
        if ft is not None:
            with open(os.path.join(d, "file_transfer.json"), "w") as f:
                json.dump(good_file_transfer() if ft == "good" else ft, f)
        return d

    def problems_with(self, edit):
        r = good_results()
        edit(r)
        return check_results.check(self.write(r))

    def test_a_complete_run_passes(self):
        self.assertEqual(check_results.check(self.write(good_results())), [])

    def test_pause_that_answered_501_fails(self):
        # What sbx-load records when POST .../pause answers 404 or 501.
        why = "server has no pause (POST …/pause answered 501)"

        def edit(r):
            for name in ("pause", "pause_wake"):
                r["scenarios"][name] = {"skipped": why, "n": 0, "errors": 0}
        problems = self.problems_with(edit)
        self.assertTrue(any(p.startswith("scenarios.pause: skipped") for p in problems), problems)
        self.assertTrue(any(p.startswith("scenarios.pause_wake: skipped") for p in problems), problems)

    def test_a_skip_fails_even_with_samples(self):
        def edit(r):
            r["scenarios"]["pause"]["skipped"] = "anything"
        self.assertTrue(self.problems_with(edit))

    def test_missing_pause_fails(self):
        def edit(r):
            del r["scenarios"]["pause_wake"]
        self.assertIn("scenarios.pause_wake: missing", self.problems_with(edit))

    def test_pause_with_errors_fails(self):
        def edit(r):
            r["scenarios"]["pause"].update(errors=1, error_messages=["POST /v1/sandboxes/x/pause: 500"])
        self.assertTrue(any("scenarios.pause: 1 errors" in p for p in self.problems_with(edit)))

    def test_errors_elsewhere_are_only_noted(self):
        def edit(r):
            r["scenarios"]["sustained"].update(errors=2)
        self.assertEqual(self.problems_with(edit), [])

    def test_failed_or_empty_scenarios_and_peers_fail(self):
        for section, name, result in (("scenarios", "exec", {"failure": "boom", "n": 0}),
                                      ("scenarios", "create_warm", {"skipped": "no --warm-url", "n": 0}),
                                      ("peers", "runc_echo", {"missing": "runc not found", "n": 0}),
                                      ("peers", "pipe", {"n": 0})):
            r = good_results()
            r[section][name] = result
            problems = check_results.check(self.write(r))
            self.assertTrue(any(p.startswith(f"{section}.{name}:") for p in problems), (name, problems))

    def test_no_plot_or_no_micro_benchmark_fails(self):
        self.assertTrue(check_results.check(self.write(good_results(), png=None)))
        self.assertTrue(check_results.check(self.write(good_results(), micro={"benchmarks": []})))

    def test_cpu_and_syscall_figures_are_required(self):
        def unavailable(r):
            r["scenarios"]["exec"]["extra"] = {"cpu_unavailable": "spawn perf: errno 2"}
        self.assertIn("scenarios.exec: no CPU/syscall figures: spawn perf: errno 2",
                      self.problems_with(unavailable))

        def missing(r):
            del r["scenarios"]["create_cold"]["extra"]["syscalls_per_op"]
        self.assertTrue(any(p.startswith("scenarios.create_cold: extra.syscalls_per_op")
                            for p in self.problems_with(missing)))

        def no_section(r):
            del r["repeatable"]
        self.assertTrue(any("repeatable" in p for p in self.problems_with(no_section)))

    def test_file_transfer_figures_are_required(self):
        self.assertTrue(any("file_transfer.json" in p
                            for p in check_results.check(self.write(good_results(), ft=None))))
        ft = good_file_transfer()
        ft["sbx"]["upload"]["cpu_ms_per_mib"] = None  # perf was missing
        problems = check_results.check(self.write(good_results(), ft=ft))
        self.assertTrue(any("sbx.upload.cpu_ms_per_mib" in p for p in problems), problems)

    def test_the_command_line_exits_non_zero(self):
        r = good_results()
        r["scenarios"]["pause"] = {"skipped": "server has no pause", "n": 0}
        res = subprocess.run([sys.executable, os.path.join(HERE, "check_results.py"), self.write(r)],
                             capture_output=True, text=True)
        self.assertEqual(res.returncode, 1, res.stdout)
        self.assertIn("check: FAIL: scenarios.pause: skipped", res.stdout)
        res = subprocess.run([sys.executable, os.path.join(HERE, "check_results.py"),
                              self.write(copy.deepcopy(good_results()))], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stdout)


if __name__ == "__main__":
    unittest.main()

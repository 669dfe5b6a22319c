"""The soak (issue 13, "Done when"): one real sbxd under mixed load for SBX_SOAK_S seconds while
the issue's abuse cases run interleaved with it; at the end sbxd's RSS and fd count must be
back near where they started, no sandbox may be a false `running`, every abuse case must have
got its expected answer, and nothing of the soak's sandboxes may be left on the host.

It reuses the end-to-end suite's daemon and client (tests/e2e/conftest.py, sbx_client.py,
ws_client.py, hostcheck.py) and the payload builders of tests/e2e and tests/security.

Environment:
  SBX_SOAK_S          seconds of load (default 60, what CI runs; 600 is the issue's 10 minutes)
  SBX_SOAK_CASES      comma list of abuse cases to run (default: all; `none` for load only);
                      for development only, the suite's verdict is about all of them
  SBX_BUILD_DIR, SBX_TESTS_MUST_RUN: as tests/e2e. The ns runtime only (root).
Writes build/soak-report.json and prints a short table at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "e2e"
SECURITY = HERE.parent / "security"
for p in (SECURITY, E2E, HERE):
    sys.path.insert(0, str(p))


from suite_loader import load_e2e_conftest  # noqa: E402

e2e = load_e2e_conftest()

# tests/e2e/test_http_framing.py (whose framing corpus and raw-socket helpers the soak reuses)
# imports these names from `conftest`, which in this suite's run is this module.
Daemon = e2e.Daemon
shutdown = e2e.shutdown
skip_or_fail = e2e.skip_or_fail
build_dir = e2e.build_dir
validator = e2e.validator

REPORT_PATH = e2e.build_dir() / "soak-report.json"
# Filled by test_soak.py's run; written and printed at the end of the session.
REPORT: dict = {}

# The API's connection caps, set explicitly so the idle-connection case knows them (the
# defaults derive them from RLIMIT_NOFILE). Generous for the soak's own clients, which all come
# from 127.0.0.1; the idle connections come from another loopback address.
MAX_CONNECTIONS = 1024
MAX_CONNECTIONS_PER_IP = 256
HEADER_TIMEOUT_S = 10  # sbxd's default, named so that the idle-connection case knows it
DAEMON_FLAGS = ["--max-connections", str(MAX_CONNECTIONS),
                "--max-connections-per-ip", str(MAX_CONNECTIONS_PER_IP),
                "--header-timeout-s", str(HEADER_TIMEOUT_S)]


@pytest.fixture(scope="session")
def soak_sbxd(validator):
    """One sbxd (ns runtime) for the whole soak, started and stopped like the e2e suite's: at
    the end every sandbox left is deleted through the API, sbxd gets SIGTERM, and whatever its
    sandboxes left on the host is swept and reported."""
    import os
    if e2e.RUNTIME != "ns":
        skip_or_fail("the soak runs the ns runtime (its abuse cases attack real sandboxes)")
    if os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root")
    daemon = Daemon(extra_args=DAEMON_FLAGS)
    try:
        daemon.start()
        yield daemon
    finally:
        with e2e._ALL_LOCK:
            ids = list(e2e.ALL_SANDBOXES)
        problems = shutdown(daemon, validator, ids)
        if problems:
            REPORT.setdefault("errors", []).extend(f"end of session: {p}" for p in problems)
            _write_report()
            pytest.fail("end of session: " + "; ".join(problems), pytrace=False)


def _write_report() -> str | None:
    if not REPORT:
        return None
    try:
        REPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
        REPORT_PATH.write_text(json.dumps(REPORT, indent=2, sort_keys=False) + "\n")
        return None
    except OSError as e:
        return f"soak report could not be written to {REPORT_PATH}: {e}"


def _table(report: dict) -> list[str]:
    lines = []
    dur = report.get("duration_s", {})
    lines.append(f"soak: {dur.get('load', '?')} s of load (SBX_SOAK_S={dur.get('requested', '?')}), "
                 f"{dur.get('total', '?')} s in all")
    mem = report.get("sbxd", {})
    if mem:
        lines.append(f"  {'':10} {'baseline':>10} {'peak':>10} {'end':>10} {'limit':>10}")
        r, f = mem.get("rss_kib", {}), mem.get("fds", {})
        mib = lambda k: "-" if k is None else f"{k / 1024:.1f}M"  # noqa: E731
        lines.append(f"  {'VmRSS':10} {mib(r.get('baseline')):>10} {mib(r.get('peak')):>10} "
                     f"{mib(r.get('end')):>10} {mib(r.get('limit')):>10}")
        lines.append(f"  {'fds':10} {f.get('baseline', '-'):>10} {f.get('peak', '-'):>10} "
                     f"{f.get('end', '-'):>10} {f.get('limit', '-'):>10}")
    ops = report.get("operations", {})
    if ops:
        lines.append("  operations: " + ", ".join(f"{k} {v['ok']}" + (f" ({v['failed']} failed)" if v["failed"] else "")
                                              for k, v in sorted(ops.items())))
    cases = report.get("abuse_cases", {})
    if cases:
        lines.append(f"  {'abuse case':18} {'runs':>5} {'ok':>5}  result")
        for name, c in cases.items():
            verdict = "passed" if c["runs"] and not c["failed"] else ("NOT RUN" if not c["runs"] else "FAILED")
            detail = f": {c['failures'][0][:160]}" if c["failures"] else ""
            lines.append(f"  {name:18} {c['runs']:>5} {c['passed']:>5}  {verdict}{detail}")
    for key in ("false_running", "leaks"):
        if report.get(key):
            lines.append(f"  {key}: {json.dumps(report[key])[:400]}")
    errs = report.get("errors", [])
    lines.append(f"  errors: {len(errs)}" + (f" (first: {errs[0][:200]})" if errs else ""))
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not REPORT:
        return
    terminalreporter.section("soak")
    for line in _table(REPORT):
        terminalreporter.write_line(line)
    problem = _write_report()
    terminalreporter.write_line(problem or f"soak report: {REPORT_PATH}")

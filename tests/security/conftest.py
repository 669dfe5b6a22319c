"""The escape and abuse suite: every test runs one attack inside a real sandbox through the
public API and checks that it failed the expected way and that nothing outside the attacking
sandbox noticed: sbxd answers /healthz, a bystander sandbox still runs and still holds its
secret, and whatever host state the attack aimed at is unchanged.

It reuses the end-to-end suite's daemon fixture and client (tests/e2e/conftest.py,
sbx_client.py, hostcheck.py): the same sbxd start/stop, leftover sweep and contract checks.

Environment: as tests/e2e (SBX_BUILD_DIR, SBX_TESTS_MUST_RUN). The attacks target the ns
runtime, and test_microvm_guest.py's (marked runtime="microvm") a microVM beside it; the report
counts them per runtime.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "e2e"
sys.path.insert(0, str(E2E))
sys.path.insert(0, str(HERE))


from suite_loader import load_e2e_conftest  # noqa: E402

e2e = load_e2e_conftest()
from sbx_client import SbxClient  # noqa: E402
import secutil  # noqa: E402

# The e2e fixtures, registered here by name: one sbxd for the session, a per-test client whose
# sandboxes are deleted after the test.
validator = e2e.validator
sbxd = e2e.sbxd
api = e2e.api
metrics = e2e.metrics
skip_or_fail = e2e.skip_or_fail
# tests/e2e/netlab.py and the egress tests that test_egress_*_attacks.py collect here import
# these names from `conftest`, which in this suite's run is this module.
Daemon = e2e.Daemon
shutdown = e2e.shutdown
build_dir = e2e.build_dir
not_applicable_on_fake_runtime = e2e.not_applicable_on_fake_runtime
_reap_adopted_orphans = e2e._reap_adopted_orphans  # netlab's restart()
_set_child_subreaper = e2e._set_child_subreaper

REPORT_PATH = e2e.build_dir() / "security-report.json"
CASES: dict[str, dict] = {}


# ---- session-wide sandboxes -------------------------------------------------------------------

class SessionSandboxes:
    """A client that outlives single tests, and the sandboxes it made (deleted at the end)."""

    def __init__(self, daemon, validator_):
        self.client = SbxClient(daemon.url, daemon.token, validator_)
        self.daemon = daemon

    def create(self, body: dict) -> dict:
        return self.client.create_sandbox(body)["sandbox"]

    def close(self) -> list[str]:
        problems = []
        ids = list(self.client.created_sandboxes)
        with e2e._ALL_LOCK:
            e2e.ALL_SANDBOXES.extend(ids)
        for sid in ids:
            try:
                op = self.client.delete_sandbox(sid, timeout=60)
                if op["state"] != "succeeded":
                    problems.append(f"delete {sid}: {op}")
            except AssertionError as e:
                problems.append(f"delete {sid}: {e}")
        self.client.close()
        return problems


@pytest.fixture(scope="session")
def session_sandboxes(sbxd, validator):
    if sbxd.runtime != "ns":
        skip_or_fail("the escape suite attacks the ns runtime; SBX_E2E_RUNTIME=fake isolates nothing")
    s = SessionSandboxes(sbxd, validator)
    yield s
    problems = s.close()
    if problems:
        pytest.fail("deleting the suite's shared sandboxes failed: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def bystander(session_sandboxes):
    """A second sandbox that no attack targets. It holds a random secret in /root; after every
    attack it must still run a command and still hold exactly that secret."""
    sb = session_sandboxes.create({"labels": {"security": "bystander"}})
    secret = secrets.token_hex(16)
    res = session_sandboxes.client.run(sb["id"], ["sh", "-c", f"echo {secret} > /root/bystander-secret"])
    assert res.exit == secutil.CLEAN_EXIT, res.exit
    return {"sandbox": sb, "secret": secret}


@pytest.fixture(scope="session")
def target(session_sandboxes):
    """The sandbox that runs the attacks which cannot harm a later attack (denied syscalls,
    reads, writes that must fail). Attacks that change the sandbox get their own."""
    return session_sandboxes.create({"labels": {"security": "target"}})


@pytest.fixture(scope="session")
def sclient(session_sandboxes):
    return session_sandboxes.client


@pytest.fixture(autouse=True)
def unaffected(sbxd, bystander, sclient):
    """After each attack: sbxd is the same live process and healthy, the bystander runs and
    its secret is intact."""
    pid_before = sbxd.proc.pid if sbxd.proc else None
    yield
    client, bystander_ = sclient, bystander
    assert sbxd.proc is not None and sbxd.proc.poll() is None, \
        f"sbxd died during the attack (exit {sbxd.proc.returncode if sbxd.proc else None})"
    assert sbxd.proc.pid == pid_before
    health = client.call("GET", "/healthz", token=None, expect=200, timeout=10).body
    assert health == {"status": "ok"}, health
    res = client.run(bystander_["sandbox"]["id"], ["sh", "-c", "cat /root/bystander-secret; echo ok"],
                     max_seconds=30)
    assert res.exit == secutil.CLEAN_EXIT and res.stdout == f"{bystander_['secret']}\nok\n".encode(), \
        f"the bystander sandbox was affected: exit {res.exit}, stdout {res.stdout!r}, stderr {res.stderr!r}"


# ---- the report -------------------------------------------------------------------------------

def pytest_configure(config):
    # Also registered here (not only in pytest.ini) for runs that collect this suite together
    # with another one under that one's ini file.
    config.addinivalue_line("markers", "attack(cls, tried): one attack of the escape suite")


def pytest_collection_modifyitems(session, config, items):
    untagged = [i.nodeid for i in items
                if HERE in Path(str(i.fspath)).resolve().parents and i.get_closest_marker("attack") is None]
    if untagged:
        raise pytest.UsageError("every security test needs @attack(cls, tried): " + ", ".join(untagged))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("attack")
    if marker is None:
        return
    case = CASES.setdefault(item.nodeid, {
        "name": item.nodeid.split("::", 1)[-1],
        "file": item.nodeid.split("::", 1)[0],
        "class": marker.kwargs.get("cls"),
        "tried": marker.kwargs.get("tried"),
        "runtime": marker.kwargs.get("runtime", "ns"),
        "outcome": "contained",
        "detail": "",
        "seconds": 0.0,
    })
    case["seconds"] = round(case["seconds"] + report.duration, 3)
    if report.skipped and case["outcome"] == "contained":
        case["outcome"] = "skipped"
        case["detail"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    elif report.failed:
        if case["outcome"] not in ("not contained", "broke the host or a bystander"):
            case["outcome"] = "not contained" if report.when == "call" else (
                "broke the host or a bystander" if report.when == "teardown" else "setup failed")
        msg = getattr(report.longrepr, "reprcrash", None)
        text = msg.message if msg is not None else str(report.longrepr)
        case["detail"] = (case["detail"] + " | " if case["detail"] else "") + f"{report.when}: {text[:600]}"
        daemon = getattr(item, "funcargs", {}).get("sbxd")
        if isinstance(daemon, e2e.Daemon):
            report.sections.append(("sbxd log (tail)", daemon.log_tail(60)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    cases = list(CASES.values())
    if not cases:
        return
    tried = [c for c in cases if c["outcome"] != "skipped"]
    contained = [c for c in tried if c["outcome"] == "contained"]
    terminalreporter.section("security")
    for c in cases:
        if c["outcome"] != "contained":
            terminalreporter.write_line(f"{c['outcome'].upper()}: {c['name']} [{c['class']}] {c['detail'][:300]}")
    for line in e2e.METRICS:
        terminalreporter.write_line(line)
    by_runtime = {}
    for c in cases:
        r = by_runtime.setdefault(c["runtime"], {"tried": 0, "contained": 0, "skipped": 0})
        if c["outcome"] == "skipped":
            r["skipped"] += 1
        else:
            r["tried"] += 1
            r["contained"] += c["outcome"] == "contained"
    for name, r in sorted(by_runtime.items()):
        terminalreporter.write_line(f"security on runtime {name}: {r['tried']} attacks tried, "
                                    f"{r['contained']} contained, {r['skipped']} not run")
    terminalreporter.write_line(f"security: {len(tried)} attacks tried, {len(contained)} contained")
    try:
        REPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
        REPORT_PATH.write_text(json.dumps({
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kernel": os.uname().release,
            "tried": len(tried),
            "contained": len(contained),
            "by_runtime": by_runtime,
            "cases": cases,
        }, indent=2) + "\n")
        terminalreporter.write_line(f"security report: {REPORT_PATH}")
    except OSError as e:
        terminalreporter.write_line(f"security report could not be written to {REPORT_PATH}: {e}")

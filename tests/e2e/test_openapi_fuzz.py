"""Property-based tests of the whole HTTP API against its contract (docs/api/openapi.yaml):
schemathesis (pinned by tools/schemathesis/requirements.lock) generates requests for every
operation, valid and invalid, from the schemas, sends them to a real sbxd of this test's own
and checks each answer: never a 5xx, a status code, content type, headers and body the contract
documents for that operation, invalid input refused, and no route served without the token.

tools/test.sh runs this file as its own suite (api-fuzz) so its time shows apart from e2e.
The seed is random per run and printed; SBX_APIFUZZ_SEED=N repeats a run, SBX_APIFUZZ_EXAMPLES
sets the examples per operation (default 25), SBX_APIFUZZ_MAX_S the time budget (default 150).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import tempfile
from pathlib import Path

from conftest import REPO, Daemon, build_dir, shutdown, skip_or_fail
from sbx_client import SbxClient

SPEC = REPO / "docs/api/openapi.yaml"
CONFIG = REPO / "tools/schemathesis/schemathesis.toml"  # the contract's choices st cannot read

# Operations that make sbxd reach other hosts: a pull names a registry and a build's FROM may
# too. Generated references would send traffic off this machine (the tests' network rule);
# tests/e2e/test_templates.py and test_template_builds.py cover them against a loopback registry.
EXCLUDED_OPERATIONS = ["pullTemplate", "buildTemplate"]


def schemathesis() -> str:
    """The `st` command of the pinned venv (made once per lock's content)."""
    try:
        out = subprocess.run(["bash", str(REPO / "tools/schemathesis/env.sh")], capture_output=True,
                             text=True, timeout=600)
    except subprocess.TimeoutExpired:
        skip_or_fail("tools/schemathesis/env.sh took over 600 s (PyPI unreachable?)")
    if out.returncode != 0:
        skip_or_fail(f"tools/schemathesis/env.sh failed (PyPI unreachable?):\n{out.stderr[-2000:]}")
    st = out.stdout.strip().splitlines()[-1]
    assert Path(st).is_file(), out
    return st


def failures_section(out: str) -> str:
    """schemathesis's FAILURES section (each failing operation, its check and its curl line),
    or the tail of its output when it printed none (a crash, a refused schema)."""
    lines = out.splitlines()
    start = next((i for i, l in enumerate(lines) if re.fullmatch(r"=+ FAILURES =+", l.strip())), None)
    if start is None:
        return out[-6000:]
    end = next((i for i in range(start + 1, len(lines))
                if re.fullmatch(r"=+ [A-Z][A-Z ]+ =+", lines[i].strip())), len(lines))
    return "\n".join(lines[start:end])


def test_every_operation_answers_as_its_contract_says(validator):
    if os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root")
    st = schemathesis()
    seed = int(os.environ.get("SBX_APIFUZZ_SEED") or random.randrange(1, 2**31))
    examples = os.environ.get("SBX_APIFUZZ_EXAMPLES", "25")
    budget = os.environ.get("SBX_APIFUZZ_MAX_S", "150")
    print(f"schemathesis seed {seed} (SBX_APIFUZZ_SEED={seed} repeats this run)")

    # Its own sbxd: the generated requests delete templates, revoke tokens and drain the node,
    # which the shared one's other tests must not see. No warm pool: creates stay on the request.
    daemon = Daemon(["--warm-pool", "base=0"])
    problems: list[str] = []
    try:
        daemon.start()
        with tempfile.TemporaryDirectory(prefix="sbx-apifuzz-") as scratch:  # its cwd
            # One worker: with two threads, hypothesis's lambda descriptions parse source with
            # `ast` concurrently, and CPython 3.11.2 (Debian 12) then raises a spurious
            # "AST constructor recursion depth mismatch" (cpython#106905): a Runtime Error of
            # schemathesis's own that failed a CI run, whatever sbxd answered.
            argv = [st, "--config-file", str(CONFIG), "run", str(SPEC), "--url", daemon.url,
                    "-H", f"Authorization: Bearer {daemon.token}",
                    "--phases", "examples,coverage,fuzzing",
                    "--max-examples", examples, "--max-time", budget, "--seed", str(seed),
                    "--workers", "1", "--request-timeout", "30",
                    "--suppress-health-check", "all",
                    "--output-truncate", "false"]
            for op in EXCLUDED_OPERATIONS:
                argv += ["--exclude-operation-id", op]
            run = subprocess.run(argv, capture_output=True, text=True, cwd=scratch,
                                 env={**os.environ, "NO_COLOR": "1"},
                                 timeout=int(budget) + 600)
        report = build_dir() / "test-results" / "api-fuzz-schemathesis.txt"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(run.stdout + "\n" + run.stderr)
        print(run.stdout[-20000:])
        print(f"schemathesis's whole output: {report}")
        alive = daemon.proc.poll() is None
        assert alive, f"sbxd exited with {daemon.proc.returncode} under the generated requests:\n{daemon.log_tail()}"
        client = SbxClient(daemon.url, daemon.token, validator)
        try:
            client.call("GET", "/healthz", token=None, expect=200)
        finally:
            client.close()
        # The failures first and short: a CI log keeps only its head and its tail.
        assert run.returncode == 0, (
            f"schemathesis (seed {seed}) found answers that break the contract; rerun with "
            f"SBX_APIFUZZ_SEED={seed} (whole output: {report}):\n"
            f"{failures_section(run.stdout)[:6000]}\n{run.stderr[-3000:]}")
    finally:
        ids: list[str] = []
        if daemon.url and daemon.proc.poll() is None:
            client = SbxClient(daemon.url, daemon.token, validator)
            try:
                ids = [s["id"] for s in client.list_sandboxes()]
            except Exception as e:  # noqa: BLE001 - the sweep below must still run
                problems.append(f"listing the sandboxes the run made: {e}")
            finally:
                client.close()
        problems += [p for p in shutdown(daemon, validator, ids) if "was left by a test" not in p]
    assert not problems, "stopping the test's sbxd: " + "; ".join(problems)

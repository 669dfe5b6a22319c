"""The JavaScript SDK's tests (tests/e2b/node/sdk.test.js), one pytest test per node test: each
runs `node --test --test-name-pattern` on its own name against this session's sbxd, so the
results table counts them one by one and a failure shows node's own report of it (the SDK's
error and stack). The names come from the file's `test('...'` lines."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NODE_FILE = HERE / "node" / "sdk.test.js"
NODE_TEST_TIMEOUT_S = 240
# A test that needs the code interpreter's template (built once per session by a fixture).
NEEDS_CODE_INTERPRETER = {"runCode with a plot"}


def node_test_names() -> list[str]:
    text = NODE_FILE.read_text()
    names = re.findall(r"^test\('((?:[^'\\]|\\.)+)'", text, re.M)
    calls = re.findall(r"^test\(", text, re.M)
    assert len(names) == len(calls), (
        f"{NODE_FILE}: {len(calls)} test( calls but {len(names)} with a plain string name: "
        "name every test with a '...' literal so that it runs here")
    assert len(set(names)) == len(names), f"{NODE_FILE}: duplicate test names"
    return names


NAMES = node_test_names()


def js_regex_escape(s: str) -> str:
    return re.sub(r"([.*+?^${}()|\[\]\\/])", r"\\\1", s)


def node_modules() -> Path:
    d = os.environ.get("SBX_TEST_E2B_NODE_MODULES", "")
    if not d or not (Path(d) / "e2b" / "package.json").is_file():
        pytest.fail("SBX_TEST_E2B_NODE_MODULES does not name a node_modules with e2b in it: prepare "
                    "the SDKs with tools/e2b/sdk-env.sh and pass what it prints (tools/test.sh "
                    f"does); got {d!r}")
    return Path(d)


def tap_counts(out: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$",
                                             out, re.M)}


def subtest_report(out: str, name: str) -> str:
    """node's TAP block of the one test that ran (the others are listed as skipped by the name
    pattern: noise in a failure report)."""
    m = re.search(rf"^(\s*)# Subtest: {re.escape(name)}\n(.*?)(?=^\1# Subtest: |\Z)", out, re.M | re.S)
    return m.group(0) if m else out[-6000:]


def test_node_file_names_every_test():
    assert len(NAMES) >= 20, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_node(name, e2b_env, request):
    if name in NEEDS_CODE_INTERPRETER:
        request.getfixturevalue("code_interpreter_template")
    mods = node_modules()
    env = dict(os.environ, **e2b_env.env(), NODE_PATH=str(mods), NO_COLOR="1")
    env.pop("NODE_OPTIONS", None)
    argv = ["node", "--test", "--test-reporter=tap",
            f"--test-name-pattern=^{js_regex_escape(name)}$", str(NODE_FILE)]
    try:
        r = subprocess.run(argv, env=env, cwd=str(NODE_FILE.parent), capture_output=True,
                           text=True, timeout=NODE_TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"node test {name!r} still running after {NODE_TEST_TIMEOUT_S}s:\n"
                    f"{(e.stdout or b'')[-4000:]!r}")
    report = subtest_report(r.stdout, name)[-8000:] + (
        "\n[stderr]\n" + r.stderr[-3000:] if r.stderr.strip() else "")
    counts = tap_counts(r.stdout)
    # The name pattern lists every other test as skipped: exactly one may have run.
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    assert ran == 1, f"node ran {ran} tests for the pattern of {name!r} ({counts}):\n{report}"
    assert counts.get("pass") == 1 and counts.get("fail") == 0 and r.returncode == 0, \
        f"node test {name!r} failed (exit {r.returncode}):\n{report}"

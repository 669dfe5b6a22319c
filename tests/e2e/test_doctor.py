"""The host preflight from the outside: `sbx doctor`, `sbxd --check [--json]`, and sbxd refusing
to start on a host (or configuration) that a required check fails.

These start their own processes (no shared sbxd) and clean up their temp dirs. The ns runtime's
requirements pass on the project's hosts; elsewhere (not root) the tests that expect exit 0 skip
unless SBX_TESTS_MUST_RUN=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import build_dir, skip_or_fail

TIMEOUT_S = 60
CHECK_KEYS = {"id", "title", "result", "detail", "remedy", "required"}
# Rows every doctor run reports on a live host, whatever the runtime.
ALWAYS = {"kernel.version", "namespace.user", "namespace.net", "cgroup.layout", "cgroup.memory",
          "fs.overlay", "seccomp.policy", "landlock", "network.veth", "network.nftables",
          "device.loop", "device.kvm", "storage.state_dir", "storage.socket_path",
          "storage.space", "agent.binary", "template.base", "microvm.qemu", "microvm.kernel"}


def binary(name: str) -> str:
    p = build_dir() / "bin" / name
    if not p.is_file():
        pytest.fail(f"{p} not found: build first (bash tools/build.sh) or set SBX_BUILD_DIR")
    return str(p)


@pytest.fixture
def tmp():
    d = Path(tempfile.mkdtemp(prefix="sbx-doctor-e2e-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def need_root():
    if os.geteuid() != 0:
        skip_or_fail("the ns runtime's checks need root")


def run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SBX_ADMIN_TOKEN", "SBX_TOKEN")}
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)


def check_report(doc: dict) -> dict[str, dict]:
    assert set(doc) == {"ok", "checks"}, doc.keys()
    assert isinstance(doc["ok"], bool)
    rows = {}
    for c in doc["checks"]:
        assert set(c) == CHECK_KEYS, c
        assert c["result"] in ("ok", "warn", "fail", "skip"), c
        assert c["detail"], f"{c['id']}: empty detail"
        if c["result"] in ("fail", "warn"):
            assert c["remedy"], f"{c['id']}: {c['result']} without a remedy"
        assert c["id"] not in rows, f"duplicate row {c['id']}"
        rows[c["id"]] = c
    missing = ALWAYS - rows.keys()
    assert not missing, f"rows missing: {sorted(missing)}"
    failed = [c["id"] for c in doc["checks"] if c["required"] and c["result"] == "fail"]
    assert doc["ok"] == (not failed), (doc["ok"], failed)
    return rows


def test_sbx_doctor_table(tmp):
    need_root()
    p = run([binary("sbx"), "doctor", "--state-dir", str(tmp / "state")])
    assert p.returncode == 0, f"sbx doctor failed here:\n{p.stdout}\n{p.stderr}"
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "DETAIL", "/", "WHAT", "TO", "DO"], lines[0]
    assert lines[-1].startswith("ready: no required check failed"), lines[-1]
    for check_id in ALWAYS:
        assert any(line.startswith(check_id + " ") for line in lines), f"no row {check_id}:\n{p.stdout}"
    assert "\x1b[" not in p.stdout, "colors only on a terminal"
    assert not (tmp / "state").exists(), "the doctor created the state dir"


def test_sbx_doctor_json_and_sbxd_check_agree(tmp):
    need_root()
    state = str(tmp / "state")
    p = run([binary("sbx"), "doctor", "--json", "--state-dir", state])
    assert p.returncode == 0, f"sbx doctor --json failed here:\n{p.stdout}\n{p.stderr}"
    rows = check_report(json.loads(p.stdout))
    for check_id, c in rows.items():
        if c["required"]:
            assert c["result"] == "ok", f"{check_id} is required by ns and did not pass here: {c}"
    assert rows["device.kvm"]["required"] is False

    d = run([binary("sbxd"), "--check", "--json", "--state-dir", state])
    assert d.returncode == 0, f"sbxd --check --json failed here:\n{d.stdout}\n{d.stderr}"
    drows = check_report(json.loads(d.stdout))
    assert list(drows) == list(rows), "sbx doctor and sbxd --check run the same checks"
    assert not (tmp / "state").exists(), "--check created the state dir"

    t = run([binary("sbxd"), "--check", "--state-dir", state])
    assert t.returncode == 0, t.stdout + t.stderr
    assert "ready: no required check failed" in t.stdout


def test_cgroup_parent_is_reported_and_checked(tmp):
    need_root()
    state = str(tmp / "state")
    p = run([binary("sbx"), "doctor", "--json", "--state-dir", state, "--cgroup-parent", "/sbx"])
    assert p.returncode == 0, p.stdout + p.stderr
    rows = check_report(json.loads(p.stdout))
    for controller in ("memory", "pids", "cpu"):
        detail = rows[f"cgroup.{controller}"]["detail"]
        assert "/sbx" in detail and "sandboxes go under" in detail, detail
    # A bad value is a failed required row, in the doctor as in sbxd's start-up.
    bad = run([binary("sbx"), "doctor", "--json", "--state-dir", state, "--cgroup-parent", "sbx/.."])
    assert bad.returncode == 1, bad.stdout + bad.stderr
    layout = check_report(json.loads(bad.stdout))["cgroup.layout"]
    assert layout["result"] == "fail" and "not absolute" in layout["detail"], layout
    refused = start_sbxd(tmp / "state2", "--cgroup-parent", "/a/../b")
    assert refused.returncode != 0
    # Named by where the value came from (here the flag), before anything touches the host.
    assert "--cgroup-parent '/a/../b'" in refused.stderr and "'..'" in refused.stderr, refused.stderr


def test_fake_runtime_requirements(tmp):
    # Needs no root: the fake runtime requires only the state dir, the agent and the template.
    p = run([binary("sbx"), "doctor", "--json", "--runtime", "fake", "--state-dir", str(tmp / "s")])
    doc = json.loads(p.stdout)
    rows = check_report(doc)
    required = {i for i, c in rows.items() if c["required"]}
    assert required <= {"storage.state_dir", "storage.socket_path", "storage.space", "agent.binary",
                        "template.base"}, required
    assert p.returncode == 0 and doc["ok"], p.stdout


def test_failed_check_exits_1(tmp):
    p = run([binary("sbx"), "doctor", "--json", "--runtime", "fake", "--state-dir", str(tmp / "s"),
             "--agent-path", str(tmp / "no-such-agent")])
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] is False
    agent = next(c for c in doc["checks"] if c["id"] == "agent.binary")
    assert agent["result"] == "fail" and "ENOENT" in agent["detail"], agent


def start_sbxd(state_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """sbxd that must refuse to start: it may not get as far as listening."""
    argv = [binary("sbxd"), "--listen", "127.0.0.1:0", "--state-dir", str(state_dir),
            "--admin-token", "e2e-doctor-token", "--warm-pool", "base=0", *extra]
    p = run(argv)
    assert "sbxd listening" not in p.stdout, f"sbxd started:\n{p.stdout}\n{p.stderr}"
    return p


def test_sbxd_refuses_a_state_dir_too_long_for_agent_sockets(tmp):
    # Before the preflight sbxd started here, and every create failed at bind() of the agent's
    # socket (the path is over the 107 bytes of a sockaddr_un).
    need_root()
    state = tmp / ("s" * max(1, 70 - len(str(tmp))))
    assert len(str(state)) >= 70
    p = start_sbxd(state)
    assert p.returncode == 1, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "storage.socket_path" in p.stderr, p.stderr
    assert "fix: use a state dir of at most 61 characters" in p.stderr, p.stderr
    assert "host preflight failed" in p.stderr, p.stderr


def test_sbxd_refuses_a_missing_agent(tmp):
    need_root()
    p = start_sbxd(tmp / "state", "--agent-path", str(tmp / "no-such-agent"))
    assert p.returncode == 1, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "agent.binary" in p.stderr and "ENOENT" in p.stderr, p.stderr
    assert "fix: build it" in p.stderr, p.stderr

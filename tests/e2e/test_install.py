"""`cmake --install` into a scratch prefix: the files land where the README says, the systemd
unit points at them and passes `systemd-analyze verify`, and the installed sbxd finds the
installed sbx-agent beside itself. Needs a configured build tree (SBX_BUILD_DIR), not root,
and no running systemd.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, build_dir, skip_or_fail


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    if not (build_dir() / "CMakeCache.txt").is_file():
        pytest.fail(f"{build_dir()} is not a configured build tree (SBX_BUILD_DIR)")
    p = tmp_path_factory.mktemp("prefix")
    run = subprocess.run(["cmake", "--install", str(build_dir()), "--prefix", str(p)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"cmake --install failed:\n{run.stdout}\n{run.stderr}"
    return p


def test_files_are_installed(prefix):
    for name in ("sbxd", "sbx", "sbx-agent"):
        f = prefix / "bin" / name
        assert f.is_file() and os.access(f, os.X_OK), f"{f} missing or not executable"
    doc = prefix / "share" / "doc" / "sbx"
    for rel in ("README.md", "docs/isolation.md", "docs/api/openapi.yaml", "examples/sbxd.service"):
        assert (doc / rel).is_file(), f"{doc / rel} missing"
    example = REPO / "deploy" / "sbxd.toml"
    conf = prefix / "etc" / "sbx" / "sbxd.toml"
    # The example configuration belongs to another change: installed exactly when it exists.
    assert conf.is_file() == example.is_file(), f"{conf}: installed {conf.is_file()}, source {example.is_file()}"


def test_unit_points_into_the_prefix(prefix):
    unit = (prefix / "lib" / "systemd" / "system" / "sbxd.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1).split()
    assert exec_start[0] == str(prefix / "bin" / "sbxd"), exec_start
    assert exec_start[1:] == ["--config", str(prefix / "etc" / "sbx" / "sbxd.toml")], exec_start
    settings_text = "\n".join(l for l in unit.splitlines() if not l.startswith("#"))
    assert "/usr/local" not in settings_text, "a path of the default prefix was left in the unit"
    settings = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    # What keeps sandboxes alive across an sbxd stop and lets sbxd manage their cgroups.
    assert settings["KillMode"] == "process"
    assert settings["Delegate"] == "yes"
    assert settings["TasksMax"] == "infinity"
    # Sandbox cgroups outside the unit's cgroup, so systemd can restart sbxd on pure cgroup v2
    # while sandboxes run; the variable must be one the installed sbxd knows.
    env_name, env_value = settings["Environment"].split("=", 1)
    assert (env_name, env_value) == ("SBX_RUNTIME_NS_CGROUP_PARENT", "/sbx"), settings["Environment"]
    run = subprocess.run([str(prefix / "bin" / "sbxd"), "--print-config"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, env_name: env_value})
    assert run.returncode == 0, run.stderr
    assert re.search(r'^cgroup_parent = "/sbx"', run.stdout, re.M), run.stdout
    for forbidden in ("ProtectSystem", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables",
                      "RestrictNamespaces", "MountFlags", "SystemCallFilter", "ProtectHome",
                      "MemoryDenyWriteExecute", "CapabilityBoundingSet", "DevicePolicy"):
        assert forbidden not in settings, f"{forbidden}= breaks the runtime (see the unit's notes)"


def test_unit_passes_systemd_analyze_verify(prefix):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        skip_or_fail("systemd-analyze is not installed")
    unit = prefix / "lib" / "systemd" / "system" / "sbxd.service"
    # verify loads the unit offline (no running systemd needed) and checks that ExecStart's
    # binary exists and is executable; any warning (an unknown or misspelt key, a bad value)
    # counts as a failure.
    run = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    problems = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 0 and not problems, \
        f"systemd-analyze verify (rc {run.returncode}):\n{run.stdout}{run.stderr}"


def test_installed_sbxd_finds_the_installed_agent(prefix):
    # The fake runtime needs no root; its start-up probe fails unless the agent it would run is
    # there: the default --agent-path is the sbx-agent beside the sbxd binary. The state dir is
    # short: pytest's tmp_path can be too long for the agents' unix socket paths, which sbxd's
    # start-up preflight refuses.
    state_root = Path(tempfile.mkdtemp(prefix="sbx-inst-", dir="/tmp"))
    state = state_root / "state"
    proc = subprocess.Popen([str(prefix / "bin" / "sbxd"), "--runtime", "fake", "--listen",
                             "127.0.0.1:0", "--state-dir", str(state), "--warm-pool", "base=0",
                             "--admin-token", "install-test-token"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("sbxd listening on http://"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        else:
            pytest.fail(f"installed sbxd exited with {proc.wait()} before listening:\n{''.join(lines)}")
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(state_root, ignore_errors=True)

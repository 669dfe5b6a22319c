"""Fixtures of the deploy suite (tests/deploy): the helm binary and the schema validator."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cannot_run(reason: str) -> None:
    # Never a skip: helm and the validator are built by tools/test_deploy.sh wherever it runs,
    # so a missing one is a failure of that script, on a laptop as in CI.
    pytest.fail(reason)


@pytest.fixture(scope="session")
def helm() -> str:
    path = os.environ.get("SBX_HELM")
    if not path:
        try:
            out = subprocess.run(["bash", str(ROOT / "tools/helm/build.sh")], check=True,
                                 capture_output=True, text=True)
            path = out.stdout.strip().splitlines()[-1]
        except (subprocess.CalledProcessError, IndexError) as e:
            cannot_run(f"could not build helm with tools/helm/build.sh: {e}")
    if not os.access(path, os.X_OK):
        cannot_run(f"no helm binary at {path}")
    return path


@pytest.fixture(scope="session")
def validator():
    try:
        import kubernetes_validate
    except ImportError:
        cannot_run("kubernetes-validate is not installed: run under tools/test_deploy.sh's venv")
    return kubernetes_validate

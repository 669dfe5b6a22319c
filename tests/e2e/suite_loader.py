"""How the suites built on the e2e fixtures (tests/security, tests/soak) load them."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

E2E = Path(__file__).resolve().parent


def load_e2e_conftest():
    """tests/e2e/conftest.py under its own name: pytest's own import of it (when a suite runs
    in one session with tests/e2e) is then a separate module with its own daemon."""
    name = "sbx_e2e_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, E2E / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

"""End-to-end fixtures: one real sbxd per test session, a contract-checking client per test.

Environment:
  SBX_BUILD_DIR        build tree holding bin/sbxd (default: <repo>/build)
  SBX_E2E_RUNTIME      `fake` adds `--runtime fake` (no root needed); default: the real `ns`
  SBX_TESTS_MUST_RUN   1: a test that cannot run (not root) fails instead of skipping
  SBX_E2E_OPENAPI      contract file (default: <repo>/docs/api/openapi.yaml)
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openapi_validator import OpenApiValidator  # noqa: E402
from sbx_client import SbxClient  # noqa: E402
import hostcheck  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MUST_RUN = os.environ.get("SBX_TESTS_MUST_RUN") == "1"
RUNTIME = os.environ.get("SBX_E2E_RUNTIME", "ns")
# SBX_E2E_SANDBOX_RUNTIME=microvm: the `sandbox` fixture's sandboxes run on that runtime (sbxd
# itself stays on RUNTIME), so the same cases check it (tools/e2e-microvm.sh picks them).
SANDBOX_RUNTIME = os.environ.get("SBX_E2E_SANDBOX_RUNTIME", "")
PORTS_DOMAIN = "sbx.test"
LISTEN_TIMEOUT_S = 30
STOP_GRACE_S = 15

# Numbers the tests want shown in the terminal summary (e.g. throughput).
METRICS: list[str] = []
# Every sandbox id any client created in this session (for the final sweep).
ALL_SANDBOXES: list[str] = []
_ALL_LOCK = threading.Lock()


def build_dir() -> Path:
    d = Path(os.environ.get("SBX_BUILD_DIR", REPO / "build"))
    return d if d.is_absolute() else REPO / d


# The only places a test may skip (tools/check_tests.py fails CI on any other pytest.skip,
# skipif or xfail under tests/ and bench/).

def skip_or_fail(reason: str) -> None:
    """Something this host or user lacks (root, a kernel feature): skip here, fail in CI."""
    if MUST_RUN:
        pytest.fail(f"{reason} (SBX_TESTS_MUST_RUN=1: this test may not skip)")
    pytest.skip(reason)


def not_run_without_optional_component(reason: str) -> None:
    """For a test of a component Debian does not ship and the operator installs (Firecracker's
    release binaries): where it is absent the test is reported as not run, also under
    SBX_TESTS_MUST_RUN=1 (tools/test.sh prints a row saying so), never as passed."""
    pytest.skip(f"not run: {reason}")


def not_applicable_on_fake_runtime(reason: str) -> None:
    """For a test of what only the ns runtime has (kernel objects, limits, namespaces): on the
    fake runtime, which the runner chose with SBX_E2E_RUNTIME=fake, there is nothing to test,
    so it skips even under SBX_TESTS_MUST_RUN=1. That is a choice of configuration, not a
    capability found missing; CI runs the ns runtime, where this never skips."""
    if RUNTIME == "fake":
        pytest.skip(f"not applicable on the fake runtime: {reason}")


def ns_runtime_only(reason: str):
    """not_applicable_on_fake_runtime as a decorator."""
    return pytest.mark.skipif(RUNTIME == "fake", reason=f"not applicable on the fake runtime: {reason}")


class Daemon:
    def __init__(self, extra_args: list[str] | None = None, extra_env: dict[str, str] | None = None,
                 listen: str = "127.0.0.1:0", ports_domain: str = PORTS_DOMAIN,
                 prefix: list[str] | None = None, pass_fds: tuple[int, ...] = ()):
        """`listen` and `ports_domain`: sbxd takes each flag once, so a suite that needs its
        own (tests/e2b: a port known before the start, its own domain) passes them here rather
        than in `extra_args`. `prefix`: what sbxd is started under, e.g. `nsenter --net=…` for
        a node in a network namespace of its own (then `listen` is that namespace's address).
        `pass_fds`: descriptors sbxd inherits, as from a careless parent."""
        self.prefix = list(prefix or [])
        self.pass_fds = tuple(pass_fds)
        self.proc: subprocess.Popen | None = None
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        self.listen = listen
        self.ports_domain = ports_domain
        self.url = ""
        # An sbxd started with tls.*: the CA file its clients verify it with (test_tls.py).
        self.ca_file: str | None = None
        self.token = secrets.token_urlsafe(32)
        self.tmp = Path(tempfile.mkdtemp(prefix="sbx-e2e-"))
        self.state_dir = self.tmp / "state"
        self.state_dir.mkdir()
        self.log_path = self.tmp / "sbxd.log"
        self.runtime = RUNTIME
        self.binary = build_dir() / "bin" / "sbxd"
        self._listen_line = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        if not self.binary.is_file():
            pytest.fail(f"{self.binary} not found: build first (bash tools/build.sh) or set SBX_BUILD_DIR")
        # JSON explicitly (auto would pick it too: stderr is a pipe): test_logs.py parses every
        # line of this log.
        # --ports-domain: test_ports.py reaches sandbox ports by Host name too (never resolved:
        # the name only travels in the Host header to 127.0.0.1).
        argv = self.prefix + [str(self.binary), "--listen", self.listen, "--state-dir", str(self.state_dir),
                "--admin-token", self.token, "--log-format", "json",
                "--ports-domain", self.ports_domain]
        if self.runtime == "fake":
            argv += ["--runtime", "fake"]
        argv += self.extra_args
        env = {k: v for k, v in os.environ.items() if k not in ("SBX_ADMIN_TOKEN", "SBX_TOKEN")}
        env.update(self.extra_env)
        log = open(self.log_path, "ab", buffering=0)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, cwd=str(self.tmp),
                                     start_new_session=True, pass_fds=self.pass_fds)

        def reader():
            # Keeps draining the daemon's output into the log so it never blocks on a full pipe.
            host = self.listen.rsplit(":", 1)[0]
            prefixes = {f"sbxd listening on {scheme}://{host}:".encode(): scheme
                        for scheme in ("http", "https")}
            for line in self.proc.stdout:
                log.write(line)
                if not self._listen_line.is_set():
                    text = line.strip()
                    for prefix, scheme in prefixes.items():
                        idx = text.find(prefix)
                        if idx < 0:
                            continue
                        port = text[idx + len(prefix):].split(b"/")[0].decode(errors="replace")
                        if port.isdigit():
                            self.url = f"{scheme}://{host}:{port}"
                            self._listen_line.set()
            log.close()

        self._reader = threading.Thread(target=reader, name="sbxd-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        while not self._listen_line.wait(0.1):
            if self.proc.poll() is not None:
                self._reader.join(2)
                pytest.fail(f"sbxd exited with {self.proc.returncode} before listening; "
                            f"output:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"sbxd printed no 'sbxd listening on http(s)://{self.listen.rsplit(':', 1)[0]}:PORT' line within "
                            f"{LISTEN_TIMEOUT_S}s; output:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._reader:
            self._reader.join(5)
        return self.proc.returncode


@pytest.fixture(scope="session")
def validator() -> OpenApiValidator:
    return OpenApiValidator(Path(os.environ.get("SBX_E2E_OPENAPI", REPO / "docs/api/openapi.yaml")))


@pytest.fixture(scope="session")
def sbxd(validator):
    if RUNTIME != "fake" and os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    daemon = Daemon()
    try:
        daemon.start()
        yield daemon
    finally:
        with _ALL_LOCK:
            ids = list(ALL_SANDBOXES)
        problems = shutdown(daemon, validator, ids)
        for p in problems:
            METRICS.append(f"PROBLEM: {p}")
        if problems:
            pytest.fail("end of session: " + "; ".join(problems), pytrace=False)


def shutdown(daemon: Daemon, validator, ids: list[str]) -> list[str]:
    """Deletes what is left through the API, stops sbxd by its PID, removes whatever it left on
    the host (`ids`: every sandbox created through it) and its temporary directory. Returns the
    problems found."""
    problems = []
    if daemon.url:
        problems += _delete_leftovers(daemon, validator)
    rc = daemon.stop()
    if daemon.proc is not None and rc not in (0, None, -signal.SIGTERM):
        problems.append(f"sbxd exited with {rc} on SIGTERM")
    ids = list(ids)
    # Warm-pool sandboxes never reach the API's list: a clean stop must remove them itself.
    sandboxes_dir = daemon.state_dir / "sandboxes"
    if sandboxes_dir.is_dir() and rc in (0, -signal.SIGTERM):
        pooled = sorted(p.name for p in sandboxes_dir.iterdir() if p.name not in ids)
        if pooled:
            problems.append(f"sandboxes never handed out (warm pool) left after SIGTERM: {pooled}")
        ids += pooled
    swept = hostcheck.sweep(ids, daemon.state_dir)
    if swept:
        problems.append("host objects left behind after sbxd stopped (removed now): " + "; ".join(swept))
    if hostcheck.mounts_under(daemon.tmp):
        problems.append(f"mounts still under {daemon.tmp}; leaving it in place")
    else:
        shutil.rmtree(daemon.tmp, ignore_errors=True)
    return problems


def _delete_leftovers(daemon: Daemon, validator) -> list[str]:
    """Deletes, through the API, every sandbox not yet deleted."""
    problems = []
    client = SbxClient(daemon.url, daemon.token, validator, ca_file=daemon.ca_file)
    try:
        leftovers = [s for s in client.list_sandboxes() if s["state"] != "deleted"]
        ops = []
        for sb in leftovers:
            problems.append(f"sandbox {sb['id']} ({sb['state']}) was left by a test")
            try:
                ops.append(client.delete_sandbox(sb["id"], wait=False))
            except AssertionError as e:
                problems.append(f"final delete of {sb['id']}: {e}")
        for op in ops:
            try:
                op = client.wait_operation(op["id"], timeout=60)
                if op["state"] != "succeeded":
                    problems.append(f"final delete failed: {op}")
            except AssertionError as e:
                problems.append(str(e))
    except Exception as e:  # noqa: BLE001 - the sweep must not hide the daemon shutdown
        problems.append(f"listing leftovers failed: {e}")
    finally:
        client.close()
    return problems


@pytest.fixture
def api(sbxd, validator):
    """A client for one test; every sandbox it created is deleted at the end, even on failure."""
    client = SbxClient(sbxd.url, sbxd.token, validator)
    yield client
    ids = list(client.created_sandboxes)
    with _ALL_LOCK:
        ALL_SANDBOXES.extend(ids)
    cleanup_errors = []
    ops = []
    for sid in ids:
        try:
            sb = client.call("GET", f"/v1/sandboxes/{sid}", validate=False).body
            if isinstance(sb, dict) and sb.get("state") == "deleted":
                continue
            resp = client.call("DELETE", f"/v1/sandboxes/{sid}", validate=False)
            if resp.status_code == 202:
                ops.append(resp.body["operation"]["id"])
            elif resp.status_code != 404:
                cleanup_errors.append(f"DELETE {sid} -> {resp.status_code} {resp.body}")
        except Exception as e:  # noqa: BLE001
            cleanup_errors.append(f"cleanup of {sid}: {e}")
    for op_id in ops:
        try:
            client.wait_operation(op_id, timeout=60)
        except Exception as e:  # noqa: BLE001
            cleanup_errors.append(f"cleanup wait {op_id}: {e}")
    client.close()
    if cleanup_errors:
        pytest.fail("cleaning up this test's sandboxes failed:\n" + "\n".join(cleanup_errors))


@pytest.fixture
def sandbox(api) -> dict:
    """A running sandbox, deleted after the test."""
    body = {"labels": {"e2e": "1"}}
    if SANDBOX_RUNTIME:
        body["runtime"] = SANDBOX_RUNTIME
        body["resources"] = {"memory_mib": 256}
    return api.create_sandbox(body, timeout=300)["sandbox"]


@pytest.fixture
def metrics():
    return METRICS


# ---- sbxd restarts: one state dir, several sbxd in turn -----------------------------------------

def _set_child_subreaper(on: bool) -> None:
    import ctypes
    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0, ctypes.get_errno()


def _reap_adopted_orphans(ids, daemon_pids, max_seconds=30):
    """Sandboxes outlive the sbxd that started them: their first process is then re-parented
    to us (a subreaper while the test runs) and, once deleted, is our zombie. Reaps those of
    `ids` (only zombies whose parent is this process, never the daemons)."""
    me = os.getpid()
    deadline = time.monotonic() + max_seconds
    while True:
        alive = []
        for sid in ids:
            for p in hostcheck.processes_mentioning(sid):
                try:
                    stat = open(f"/proc/{p['pid']}/stat").read()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[-1].split()
                state, ppid = fields[0], int(fields[1])
                if state == "Z" and ppid == me and p["pid"] not in daemon_pids:
                    os.waitpid(p["pid"], os.WNOHANG)
                else:
                    alive.append(p)
        if not alive or time.monotonic() > deadline:
            return
        time.sleep(0.05)


@pytest.fixture
def restartable(validator):
    """Starts sbxd on a state directory that outlives it: start() the first time, restart()
    to stop it (SIGTERM: sandboxes keep running) and start a new one on the same state."""
    if RUNTIME != "fake":
        if os.geteuid() != 0:
            skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    state = {"daemon": None, "sandboxes": [], "first_tmp": None}
    _set_child_subreaper(True)

    class Ctl:
        @property
        def daemon(self) -> Daemon:
            """The sbxd running now."""
            return state["daemon"]

        def start(self, extra_args: list[str] | None = None):
            d = Daemon(extra_args)
            d.start()
            state["daemon"] = d
            return SbxClient(d.url, d.token, validator)

        def restart(self, extra_args: list[str] | None = None, kill: bool = False, between=None):
            """A new sbxd on the same state (and token), as after an upgrade; `extra_args`
            are its additional flags. `kill`: the old one gets SIGKILL (a crash) instead of
            SIGTERM. `between`: called once the old one is gone, before the new one starts
            (what a host reboot would have removed meanwhile)."""
            old = state["daemon"]
            if kill:
                os.kill(old.proc.pid, signal.SIGKILL)
                old.proc.wait(10)
                if old._reader:
                    old._reader.join(5)
            else:
                rc = old.stop()
                assert rc in (0, -15), f"sbxd exited with {rc} on SIGTERM"
            if between is not None:
                between()
            d = Daemon(extra_args)
            shutil.rmtree(d.tmp, ignore_errors=True)
            d.tmp, d.state_dir, d.log_path, d.token = old.tmp, old.state_dir, old.log_path, old.token
            d.start()
            state["daemon"] = d
            client = SbxClient(d.url, d.token, validator)
            deadline = time.monotonic() + 60
            while client.call("GET", "/readyz", token=None, validate=False).status_code != 200:
                assert time.monotonic() < deadline, "sbxd not ready after restart"
                time.sleep(0.1)
            return client

        def track(self, client):
            state["sandboxes"] = client.created_sandboxes

    try:
        yield Ctl()
    finally:
        d = state["daemon"]
        problems = []
        if d is not None:
            ids = list(state["sandboxes"])
            _reap_adopted_orphans(ids, {d.proc.pid} if d.proc else set())
            problems = shutdown(d, validator, ids)
        _set_child_subreaper(False)
    if problems:
        pytest.fail("stopping the test's sbxd: " + "; ".join(problems))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("call", "teardown"):
        daemon = getattr(item, "funcargs", {}).get("sbxd")
        if isinstance(daemon, Daemon):
            report.sections.append(("sbxd log (tail)", daemon.log_tail(80)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if METRICS:
        terminalreporter.section("sbx e2e notes")
        for line in METRICS:
            terminalreporter.write_line(line)

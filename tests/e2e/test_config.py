"""sbxd's configuration (docs/config.md): a TOML file under SBX_* variables under flags, rejected
at start-up when wrong, printed with --print-config, and reloaded on SIGHUP. Each test that needs
a running daemon starts its own sbxd (own state dir, port 0) and stops it by PID at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from conftest import RUNTIME, Daemon, build_dir, shutdown, skip_or_fail
from sbx_client import SbxClient

RELOAD_TIMEOUT_S = 10
POOL_TIMEOUT_S = 60


def sbxd_once(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs sbxd to completion (a start-up that must fail, or --print-config)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("SBX_ADMIN_TOKEN", "SBX_CONFIG")}
    full_env.update(env or {})
    return subprocess.run([str(build_dir() / "bin" / "sbxd"), *args], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL, env=full_env)


def test_unknown_key_in_the_file_stops_sbxd_naming_its_path(tmp_path):
    conf = tmp_path / "sbxd.toml"
    conf.write_text("[sandbox.defaults]\nmemory_mib = 256\nmemroy_mib = 128\n")
    state = tmp_path / "state"
    r = sbxd_once("--config", str(conf), "--listen", "127.0.0.1:0", "--state-dir", str(state),
                  "--runtime", "fake")
    assert r.returncode != 0, (r.returncode, r.stdout, r.stderr)
    assert f"unknown key 'sandbox.defaults.memroy_mib' in {conf}:3:1" in r.stderr, r.stderr
    assert "did you mean 'sandbox.defaults.memory_mib'" in r.stderr, r.stderr
    assert "listening" not in r.stdout
    assert not state.exists(), "the state directory was created before the configuration was checked"


@pytest.mark.parametrize("env, words", [
    ({"SBX_SANDBOX_DEFAULTS_MEMROY_MIB": "128"}, "unknown configuration variable SBX_SANDBOX_DEFAULTS_MEMROY_MIB"),
    ({"SBX_SANDBOX_LIMITS_MAX_VCPU": "0"}, "SBX_SANDBOX_LIMITS_MAX_VCPU=0: must be between 1 and 1024"),
    ({"SBX_CONFIG": "/nonexistent/sbxd.toml"}, "(from SBX_CONFIG): read file: open(/nonexistent/sbxd.toml)"),
])
def test_bad_environment_stops_sbxd(tmp_path, env, words):
    state = tmp_path / "state"
    r = sbxd_once("--listen", "127.0.0.1:0", "--state-dir", str(state), "--runtime", "fake", env=env)
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert words in r.stderr, r.stderr
    assert not state.exists()


def test_toml_parse_error_names_file_line_and_column(tmp_path):
    conf = tmp_path / "sbxd.toml"
    conf.write_text("[server]\nhttp_threads = 2\nlisten = \n")
    r = sbxd_once("--config", str(conf), "--print-config")
    assert r.returncode != 0
    assert f"{conf}:3:" in r.stderr and "TOML parse error" in r.stderr, r.stderr


def test_print_config_layers_the_sources_and_redacts_the_token(tmp_path):
    conf = tmp_path / "sbxd.toml"
    conf.write_text('[server]\nadmin_token = "from-the-file-secret"\nhttp_threads = 3\n'
                    "[sandbox.limits]\nmax_memory_mib = 4096\n[runtime]\nworkers = 2\n"
                    "[warm_pool]\nbase = 1\n")
    conf.chmod(0o600)
    r = sbxd_once("--config", str(conf), "--print-config", "--admin-token", "from-the-flag-secret",
                  "--workers", "6", env={"SBX_RUNTIME_WORKERS": "5", "SBX_SERVER_HTTP_THREADS": "4",
                                         "SBX_TESTS_MUST_RUN": os.environ.get("SBX_TESTS_MUST_RUN", "0")})
    assert r.returncode == 0, r.stderr
    assert "secret" not in r.stdout and "secret" not in r.stderr, r.stdout
    assert 'admin_token = "<redacted>"  # --admin-token' in r.stdout, r.stdout
    printed = tomllib.loads(r.stdout)
    assert printed["server"]["http_threads"] == 4                 # env over file
    assert printed["runtime"]["workers"] == 6                     # flag over env
    assert printed["sandbox"]["limits"]["max_memory_mib"] == 4096  # file over default
    assert printed["sandbox"]["defaults"]["memory_mib"] == 512     # default
    assert printed["warm_pool"] == {"base": 1}
    assert f"max_memory_mib = 4096  # {conf}:5" in r.stdout, r.stdout


def _message(line: str) -> str:
    """The message of one log line: the "msg" of a JSON line, else the line itself."""
    try:
        return json.loads(line)["msg"]
    except (ValueError, KeyError, TypeError):
        return line


class OwnDaemon:
    """A second sbxd with a configuration file, and a client that remembers what it created."""

    def __init__(self, tmp_path: Path, validator, config: str):
        self.conf = tmp_path / "sbxd.toml"
        self.conf.write_text(config)
        self.daemon = Daemon(extra_args=["--config", str(self.conf)])
        self.validator = validator
        self.client: SbxClient | None = None

    def start(self) -> SbxClient:
        self.daemon.start()
        self.client = SbxClient(self.daemon.url, self.daemon.token, self.validator)
        return self.client

    def log(self) -> str:
        return self.daemon.log_path.read_text(errors="replace")

    def reload(self, config: str | None = None, marker: str = "SIGHUP: configuration") -> str:
        """Rewrites the file (if given), sends SIGHUP and returns the log lines the reload wrote."""
        if config is not None:
            self.conf.write_text(config)
        before = self.log().count(marker)
        os.kill(self.daemon.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while self.log().count(marker) <= before:
            assert self.daemon.proc.poll() is None, f"sbxd exited on SIGHUP:\n{self.daemon.log_tail()}"
            assert time.monotonic() < deadline, f"no '{marker}' line after SIGHUP:\n{self.daemon.log_tail()}"
            time.sleep(0.05)
        time.sleep(0.1)  # the warnings of the same reload
        return "\n".join(m for m in (_message(line) for line in self.log().splitlines())
                         if "SIGHUP" in m)

    def close(self) -> list[str]:
        problems = []
        ids = list(self.client.created_sandboxes) if self.client else []
        if self.client:
            for sid in ids:
                try:
                    sb = self.client.call("GET", f"/v1/sandboxes/{sid}", validate=False).body
                    if sb.get("state") != "deleted":
                        op = self.client.delete_sandbox(sid)
                        if op["state"] != "succeeded":
                            problems.append(f"delete {sid}: {op}")
                except Exception as e:  # noqa: BLE001 - stop the daemon whatever happens
                    problems.append(f"delete {sid}: {e}")
            self.client.close()
        return problems + shutdown(self.daemon, self.validator, ids)


@pytest.fixture
def own_sbxd(tmp_path, validator):
    if RUNTIME != "fake" and os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    started: list[OwnDaemon] = []

    def start(config: str) -> OwnDaemon:
        d = OwnDaemon(tmp_path, validator, config)
        started.append(d)
        d.start()
        return d

    yield start
    problems = []
    for d in started:
        problems += d.close()
    if problems:
        pytest.fail("stopping the test's own sbxd: " + "; ".join(problems))


# Small pools of the ns runtime: this daemon runs beside the session's.
BASE_CONFIG = """
[runtime]
workers = 2
[runtime.ns]
netns_pool = 1
userns_pool = 1
disk_pool = 0
[sandbox.limits]
max_memory_mib = {max_memory}
[sessions]
attach_token_ttl_s = {ttl}
[warm_pool]
base = {pool}
[log]
level = "{level}"
"""


def config(max_memory=65536, ttl=900, pool=0, level="info", extra="") -> str:
    return BASE_CONFIG.format(max_memory=max_memory, ttl=ttl, pool=pool, level=level) + extra


def create_until_warm(client: SbxClient) -> dict:
    deadline = time.monotonic() + POOL_TIMEOUT_S
    while True:
        created = client.create_sandbox({}, wait=False)
        client.wait_operation(created["operation"]["id"])
        if created["operation"]["result"] == {"warm_pool": True}:
            return created
        assert time.monotonic() < deadline, f"no create served by the warm pool within {POOL_TIMEOUT_S}s"
        time.sleep(0.3)


def test_sighup_reloads_limits_pool_ttl_and_keeps_restart_only_keys(own_sbxd):
    d = own_sbxd(config())
    api = d.client

    # Before: a 2048 MiB sandbox is within the limits, and there is no warm pool.
    created = api.create_sandbox({"resources": {"memory_mib": 2048}})
    assert created["sandbox"]["effective_resources"]["memory_mib"] == 2048
    plain = api.create_sandbox({}, wait=False)
    assert plain["operation"]["result"] is None, plain["operation"]
    api.wait_operation(plain["operation"]["id"])
    session = api.create_session(plain["sandbox"]["id"], ["true"])
    ttl_before = _token_ttl(session)
    assert 890 <= ttl_before <= 905, session

    lines = d.reload(config(max_memory=1024, ttl=60, pool=1, level="debug",
                            extra="[server]\nhttp_threads = 3\n"))
    assert "configuration reloaded" in lines, lines
    for key in ("sandbox.limits.max_memory_mib 65536 -> 1024", "sessions.attach_token_ttl_s 900 -> 60",
                "warm_pool.base 0 -> 1", 'log.level "info" -> "debug"'):
        assert key in lines, lines
    assert "server.http_threads changed (2 -> 3) but needs a restart; keeping 2" in lines, lines

    # The new limit applies to the next create.
    resp = api.call("POST", "/v1/sandboxes", json_body={"resources": {"memory_mib": 2048}}, expect=400)
    assert resp.body["error"]["code"] == "invalid_argument", resp.body
    assert resp.body["error"]["details"]["field"] == "resources.memory_mib", resp.body
    assert "1024" in resp.body["error"]["message"], resp.body
    api.create_sandbox({"resources": {"memory_mib": 1024}}, wait=False)
    # The new TTL applies to the next session's attach token.
    session = api.create_session(plain["sandbox"]["id"], ["true"])
    assert 50 <= _token_ttl(session) <= 65, session
    # The pool turned on fills, and serves a create.
    warm = create_until_warm(api)
    assert warm["sandbox"]["state"] == "running"

    # Turned off again: creates are built cold.
    lines = d.reload(config(max_memory=1024, ttl=60, pool=0, level="debug"))
    assert "warm_pool.base 1 -> 0" in lines, lines
    cold = api.create_sandbox({}, wait=False)
    assert cold["operation"]["result"] is None, cold["operation"]
    api.wait_operation(cold["operation"]["id"])


def test_sighup_remakes_the_disk_pool_at_the_new_default_size(own_sbxd):
    if RUNTIME != "ns":
        skip_or_fail("the disk pool belongs to the ns runtime")

    def conf(disk_mib: int) -> str:
        return (BASE_CONFIG.replace("disk_pool = 0", "disk_pool = 1").format(
                    max_memory=65536, ttl=900, pool=0, level="info")
                + f"[sandbox.defaults]\ndisk_mib = {disk_mib}\n")

    d = own_sbxd(conf(512))
    pool_dir = d.daemon.state_dir / "disk-images" / "pool"

    def pooled_sizes() -> list[int]:
        try:
            return [p.stat().st_size >> 20 for p in pool_dir.iterdir() if p.suffix == ".img"]
        except FileNotFoundError:
            return []

    def wait_pool(size: int) -> None:
        deadline = time.monotonic() + POOL_TIMEOUT_S
        while pooled_sizes() != [size]:
            assert time.monotonic() < deadline, f"pool holds {pooled_sizes()} MiB, not [{size}]"
            time.sleep(0.1)

    wait_pool(512)
    lines = d.reload(conf(256))
    assert "sandbox.defaults.disk_mib 512 -> 256" in lines, lines
    assert "disk pool: now making 256 MiB disks (1 pooled disk(s) of the old size dropped)" in \
        [_message(line) for line in d.log().splitlines()], d.daemon.log_tail()
    wait_pool(256)
    # The next default create takes it: a 256 MiB writable layer.
    sb = d.client.create_sandbox({})["sandbox"]
    assert sb["effective_resources"]["disk_mib"] == 256, sb
    df = d.client.run(sb["id"], ["df", "-m", "/"]).stdout.decode().splitlines()
    assert 200 <= int(df[1].split()[1]) <= 256, df


def test_sighup_with_a_bad_file_keeps_the_running_configuration(own_sbxd):
    d = own_sbxd(config(max_memory=1024))
    api = d.client
    for bad, words in [
        ("[sandbox.limits]\nmax_memory_mib = 4096\nbogus = 1\n", "unknown key 'sandbox.limits.bogus'"),
        ("[sandbox.limits\n", "TOML parse error"),
        ("[sandbox.limits]\nmax_memory_mib = 4096\n[warm_pool]\nnope = 1\n", "template 'nope' not found"),
        ("[sandbox.limits]\nmax_memory_mib = 100\n", "must be within"),
    ]:
        lines = d.reload(bad, marker="configuration not reloaded")
        assert words in lines.splitlines()[-1] or words in lines, lines
        assert d.daemon.proc.poll() is None
        # Still the old limit.
        resp = api.call("POST", "/v1/sandboxes", json_body={"resources": {"memory_mib": 2048}}, expect=400)
        assert "1024" in resp.body["error"]["message"], resp.body
    assert api.call("GET", "/readyz", token=None, expect=200).body == {"status": "ready"}


def _token_ttl(session: dict) -> float:
    from datetime import datetime, timezone
    expires = datetime.fromisoformat(session["attach"]["expires_at"].replace("Z", "+00:00"))
    return (expires - datetime.now(timezone.utc)).total_seconds()

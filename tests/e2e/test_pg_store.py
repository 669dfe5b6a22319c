"""sbxd on PostgreSQL (docs/store.md): the same API on `--store postgresql://...`, what it
remembers survives a restart, and a store URL it cannot use stops it with a clear message. The
server is Debian's PostgreSQL, started for this module by tools/pg_test_server.sh on a unix
socket (no TCP port) and stopped after."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, RUNTIME, Daemon, build_dir, skip_or_fail

SERVER = REPO / "tools" / "pg_test_server.sh"


@pytest.fixture(scope="module")
def pg_host():
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        skip_or_fail("no PostgreSQL server (apt-get install postgresql)")
    parent = Path(tempfile.mkdtemp(prefix="sbx-pg-"))
    parent.chmod(0o755)  # the server runs as `postgres` and must reach its directory
    host = parent / "pg"
    subprocess.run(["bash", str(SERVER), "start", str(host)], check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    try:
        yield host
    finally:
        subprocess.run(["bash", str(SERVER), "stop", str(host)], timeout=120)
        os.rmdir(parent)


def make_db(host: Path) -> str:
    """A fresh database on the module's server; its URL."""
    name = "sbxe2e_" + secrets.token_hex(4)
    psql = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql")) or [Path("/usr/bin/psql")]
    subprocess.run([str(psql[-1]), f"postgresql:///postgres?host={host}&user=sbx", "-qc",
                    f"CREATE DATABASE {name}"], check=True, timeout=60)
    return f"postgresql:///{name}?host={host}&user=sbx"


def test_sandboxes_sessions_and_keys_live_in_postgresql_across_a_restart(restartable, pg_host):
    url = make_db(pg_host)
    api = restartable.start(["--store", url])
    restartable.track(api)
    sb = api.create_sandbox(idempotency_key="pg-create-1")["sandbox"]
    out = api.run(sb["id"], ["sh", "-c", "echo hello from postgres"])
    assert out.stdout == b"hello from postgres\n" and out.exit["exit_code"] == 0
    log = restartable.daemon.log_path.read_text()
    assert "store: postgresql postgresql:///" in log, log[-2000:]

    api = restartable.restart(["--store", url])
    restartable.track(api)
    # The sandbox, its session and the idempotency key came back from PostgreSQL.
    assert api.get_sandbox(sb["id"])["state"] == "running"
    again = api.create_sandbox(idempotency_key="pg-create-1", wait=False)
    assert again["sandbox"]["id"] == sb["id"]
    assert api.get_session(out.session["session_id"])["exit_code"] == 0
    out = api.run(sb["id"], ["sh", "-c", "echo still here"])
    assert out.stdout == b"still here\n"
    # Nothing went to a SQLite file in the state dir.
    assert not (restartable.daemon.state_dir / "sbx.db").exists()
    api.delete_sandbox(sb["id"])


@pytest.mark.parametrize("url, expect", [
    ("mysql://root:hunter2@127.0.0.1/sbx", "store.url"),
    ("relative/sbx.db", "store.url"),
])
def test_a_store_url_sbxd_cannot_use_is_refused_at_the_config_check(url, expect):
    proc = subprocess.run([str(build_dir() / "bin" / "sbxd"), "--check", "--store", url],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert expect in text, text
    assert "hunter2" not in text, text  # the password never shows


def test_an_unreachable_database_stops_sbxd_with_its_url_and_no_password(pg_host):
    if RUNTIME != "fake" and os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    # A socket directory where no server listens: the connection fails at once.
    empty = Path(tempfile.mkdtemp(prefix="sbx-nopg-"))
    d = Daemon(["--store", f"postgresql://sbx:hunter2@/sbx?host={empty}"])
    try:
        argv = [str(d.binary), "--listen", "127.0.0.1:0", "--state-dir", str(d.state_dir),
                "--admin-token", d.token, "--store", d.extra_args[1]]
        if RUNTIME == "fake":
            argv += ["--runtime", "fake"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        text = proc.stdout + proc.stderr
        assert "store: open postgresql://sbx:***@/sbx" in text, text
        assert "hunter2" not in text, text
    finally:
        os.rmdir(empty)


def pg_server(verb: str, host: Path) -> None:
    """tools/pg_test_server.sh `pause` (stop, data kept: an outage) or `resume` on the module's
    server."""
    subprocess.run(["bash", str(SERVER), verb, str(host)], check=True, timeout=120,
                   stdout=subprocess.DEVNULL)


def test_a_database_outage_is_503_never_404_and_the_api_serves_again_after_it(restartable, pg_host):
    """With PostgreSQL stopped, reads of a sandbox, its session and its operation fail with 503
    `unavailable`: a 404 would tell a client its sandbox is gone. With the server back, the
    same sbxd answers them again; a stored row that does not decode is a 500, not a 404."""
    url = make_db(pg_host)
    api = restartable.start(["--store", url])
    restartable.track(api)
    created = api.create_sandbox()
    sb, op = created["sandbox"], created["operation"]
    out = api.run(sb["id"], ["sh", "-c", "echo before the outage"])
    assert out.stdout == b"before the outage\n"
    session_id = out.session["session_id"]
    reads = [f"/v1/sandboxes/{sb['id']}", f"/v1/sessions/{session_id}", f"/v1/operations/{op['id']}"]
    pg_server("pause", pg_host)
    try:
        for path in reads:
            resp = api.call("GET", path, expect=(503, 500))
            assert resp.status_code == 503, (path, resp.status_code, resp.body)
            assert resp.body["error"]["code"] == "unavailable", (path, resp.body)
    finally:
        pg_server("resume", pg_host)
    deadline = time.monotonic() + 30
    while True:  # the pool reconnects on the next transaction; bounded by the deadline
        resp = api.call("GET", reads[0])
        if resp.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert resp.status_code == 200 and resp.body["state"] == "running", resp.body
    assert api.get_session(session_id)["exit_code"] == 0
    assert api.get_operation(op["id"])["state"] == "succeeded"

    # A failure inside a transaction on a live connection, here a row that no longer decodes:
    # 500 `internal`, not a 404 (which the service made of any failed read before).
    def psql(statement: str) -> None:
        exe = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))[-1]
        subprocess.run([str(exe), url, "-qc", statement], check=True, timeout=60)
    for path, table, column, row_id, sound in [
            (reads[0], "sandboxes", "env", sb["id"], "'{}'"),
            (reads[1], "sessions", "spec", session_id, "'{}'"),
            (reads[2], "operations", "result", op["id"], "NULL")]:
        psql(f"UPDATE {table} SET {column} = '{{not json' WHERE id = '{row_id}'")
        try:
            resp = api.call("GET", path, expect=(500, 404))
            assert resp.status_code == 500 and resp.body["error"]["code"] == "internal", \
                (path, resp.status_code, resp.body)
        finally:  # sound again, so that the sandbox can be listed and deleted whatever happened
            psql(f"UPDATE {table} SET {column} = {sound} WHERE id = '{row_id}'")
    assert api.get_sandbox(sb["id"])["state"] == "running"
    api.delete_sandbox(sb["id"])

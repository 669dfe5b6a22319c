"""The official E2B SDKs, as published, driving a real sbxd (issue 19, docs/e2b.md).

Runs in the interpreter tools/e2b/sdk-env.sh prepared (a venv holding the pinned SDKs of
tests/e2b/python/requirements.lock, or with --newest the newest releases); the Node tests run
under `node --test` from test_node_sdk.py, with the node_modules that script installed.
tools/test.sh runs it as the suites `e2b` (pinned) and `e2b-drift` (newest).

One sbxd for the session (tests/e2e/conftest.py's Daemon, sweep and leftover checks), one tenant
made through its admin API (docs/tenancy.md) whose token is the E2B API key: E2B keys are tenant
tokens. The SDKs are pointed at sbxd through the environment only, as a user would:
E2B_API_URL, E2B_SANDBOX_URL (both the daemon's origin) and E2B_API_KEY.

That sbxd is set up as an E2B-style deployment, because e2b-code-interpreter 2.6.2 ignores
E2B_SANDBOX_URL for its server on port 49999 and always calls https://49999-{sandbox id}.{domain}
(domain: what the create answer says): it serves TLS only, with a certificate of a CA made for the
session (openssl) for 127.0.0.1 and *.e2b.test; it routes {port}-{id}.e2b.test to sandbox ports
(--ports-domain) and answers `domain: e2b.test:PORT` (--e2b-domain), its port chosen before it
starts. The SDKs trust the CA through the environment (SSL_CERT_FILE for Python's httpx,
NODE_EXTRA_CA_CERTS for node), and a wildcard DNS record *.e2b.test -> 127.0.0.1 is simulated
inside this pytest process only (socket.getaddrinfo, for the session; .test is a reserved TLD, so
nothing real is shadowed and nothing leaves loopback). The node SDKs honour E2B_SANDBOX_URL for
port 49999 and need no name.

Environment: as tests/e2e (SBX_BUILD_DIR, SBX_TESTS_MUST_RUN; the ns runtime), plus
  SBX_TEST_E2B_NODE_MODULES  node_modules holding e2b and @e2b/code-interpreter (sdk-env.sh prints it)
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
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
import cross_tenant  # noqa: E402

# The e2e fixtures by name (sbxd is this suite's own, below).
validator = e2e.validator
metrics = e2e.metrics
skip_or_fail = e2e.skip_or_fail
REPO = e2e.REPO
MUST_RUN = e2e.MUST_RUN

TENANT_SCOPES = ["read", "sandboxes", "sessions", "files", "templates"]
# How long a killed sandbox may take to be gone from sbx's own API (E2B's kill answers at once;
# sbx finishes the delete in the background).
GONE_TIMEOUT_S = 60
# The session's E2B domain: sandbox ports are https://{port}-{sandbox id}.e2b.test:PORT.
E2B_DOMAIN = "e2b.test"
START_ATTEMPTS = 3  # a port chosen free can be taken before sbxd binds it


# ---- sbxd as an E2B deployment: TLS, a wildcard name ----------------------------------------------

def make_pki(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 and *.e2b.test: (CA, certificate, key), PEM.
    With the openssl command (as test_egress_proxy.py): the SDKs' venv has no `cryptography`."""
    def run(*argv: str) -> None:
        r = subprocess.run(["openssl", *argv], cwd=d, capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"openssl {' '.join(argv)}: exit {r.returncode}: {r.stderr[-2000:]}")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=sbx e2b test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=sbxd e2b test")
    (d / "server.ext").write_text(
        f"subjectAltName=IP:127.0.0.1,DNS:*.{E2B_DOMAIN}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    (d / "server.key").chmod(0o600)
    return d / "ca.pem", d / "server.pem", d / "server.key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_e2b_daemon(ca: Path, cert: Path, key: Path, extra_args: list[str] | None = None):
    """sbxd over TLS on a port known before it starts, so that its E2B answers can name it."""
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        d = e2e.Daemon(listen=f"127.0.0.1:{port}", ports_domain=E2B_DOMAIN,
                       extra_args=["--tls-cert-file", str(cert), "--tls-key-file", str(key),
                                   "--e2b-domain", f"{E2B_DOMAIN}:{port}", *(extra_args or [])])
        d.ca_file = str(ca)
        d.pki = (ca, cert, key)
        try:
            d.start()
        except pytest.fail.Exception:
            taken = "Address already in use" in d.log_tail()
            d.stop()
            shutil.rmtree(d.tmp, ignore_errors=True)
            if taken and attempt < START_ATTEMPTS:
                continue
            raise
        assert d.url == f"https://127.0.0.1:{port}", d.url
        return d
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def sbxd(validator):
    """tests/e2e's session sbxd (swept and checked when it stops), with TLS and E2B's host names."""
    if e2e.RUNTIME != "fake" and os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    pki = Path(tempfile.mkdtemp(prefix="sbx-e2b-pki-"))
    daemon = None
    problems: list[str] = []
    try:
        daemon = start_e2b_daemon(*make_pki(pki))
        yield daemon
    finally:
        if daemon is not None:
            with e2e._ALL_LOCK:
                ids = list(e2e.ALL_SANDBOXES)
            problems = e2e.shutdown(daemon, validator, ids)
            for p in problems:
                e2e.METRICS.append(f"PROBLEM: {p}")
        shutil.rmtree(pki, ignore_errors=True)
    if problems:
        pytest.fail("end of session: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def wildcard_dns():
    """What a DNS record *.e2b.test -> 127.0.0.1 would do, for this process and this session only:
    the code interpreter SDK reaches its sandbox's port 49999 by such a name."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and name.rstrip(".").lower().endswith("." + E2B_DOMAIN):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.getaddrinfo = real

class Lab:
    """The session's tenant, its E2B API key, and the clients that check and clean up."""

    def __init__(self, daemon, validator_):
        self.daemon = daemon
        self.url = daemon.url
        self.admin = SbxClient(daemon.url, daemon.token, validator_, ca_file=daemon.ca_file)
        t = self.admin.call("POST", "/v1/admin/tenants", json_body={"name": "e2b-sdk"},
                            expect=201).body["tenant"]
        self.tenant = t["id"]
        tok = self.admin.call("POST", f"/v1/admin/tenants/{self.tenant}/tokens",
                              json_body={"name": "e2b-api-key", "scopes": TENANT_SCOPES},
                              expect=201).body["token"]
        self.key = tok["token"]
        # The tenant's own view, through sbx's API (not the SDK): what is left after a test.
        self.sbx = SbxClient(daemon.url, self.key, validator_, ca_file=daemon.ca_file)
        self.seen: set[str] = set()

    def env(self) -> dict[str, str]:
        """What an E2B user sets to move an application to sbx, nothing more: the three E2B
        variables, and trust in the CA of sbxd's certificate (a private one here) for Python
        (httpx reads SSL_CERT_FILE) and node (NODE_EXTRA_CA_CERTS)."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": self.key,
                "SSL_CERT_FILE": self.daemon.ca_file, "NODE_EXTRA_CA_CERTS": self.daemon.ca_file}

    def live_sandboxes(self) -> list[dict]:
        return [s for s in self.sbx.list_sandboxes() if s["state"] != "deleted"]

    def sweep(self) -> list[str]:
        """Deletes (through sbx's API) what a test left, waits until every sandbox of the tenant is
        gone, and returns what had been left running (the test's own cleanup should have killed
        it). Sandboxes being deleted already (an E2B kill returns before that ends) are waited
        for, not reported."""
        left: dict[str, str] = {}
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while True:
            live = self.live_sandboxes()
            self.seen.update(s["id"] for s in live)
            if not live:
                return list(left.values())
            for s in live:
                if s["state"] == "deleting":
                    continue
                left.setdefault(s["id"], f"{s['id']} ({s['state']}, labels {s.get('labels')})")
                # 409: another operation (a create, a pause) is in flight; tried again next round.
                self.sbx.call("DELETE", f"/v1/sandboxes/{s['id']}", validate=False)
            if time.monotonic() > deadline:
                raise AssertionError(f"sandboxes not gone {GONE_TIMEOUT_S}s after the test: "
                                     f"{[(s['id'], s['state']) for s in live]}")
            time.sleep(0.1)

    def close(self) -> None:
        # Every sandbox the SDKs made, deleted ones included: the host sweep at the end of the
        # session checks that none left a kernel object behind.
        try:
            self.seen.update(s["id"] for s in self.sbx.list_sandboxes(state="deleted"))
            self.seen.update(s["id"] for s in self.sbx.list_sandboxes())
        except Exception as e:  # noqa: BLE001 - the tenant's deletion below must still run
            e2e.METRICS.append(f"PROBLEM: listing the E2B tenant's sandboxes: {e}")
        with e2e._ALL_LOCK:
            e2e.ALL_SANDBOXES.extend(sorted(self.seen))
        try:
            cross_tenant.delete_tenants(self.admin, [self.tenant])
        finally:
            self.sbx.close()
            self.admin.close()


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """os.environ with `values` set, as it was again at the end."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def lab(sbxd, validator, wildcard_dns):
    # The environment is set before any test makes an SDK client: the e2b SDK's transport (and
    # its TLS context, read from SSL_CERT_FILE) is made once per process.
    lab_ = Lab(sbxd, validator)
    try:
        with environment(lab_.env()):
            yield lab_
    finally:
        lab_.close()


@pytest.fixture
def e2b_env(lab, metrics, request):
    """The E2B environment for one test; after it, every sandbox the tenant has is gone (a
    sandbox the test's own cleanup left running is deleted and noted)."""
    try:
        request.node.sbxd_log_offset = lab.daemon.log_path.stat().st_size
    except OSError:
        request.node.sbxd_log_offset = 0
    yield lab
    left = lab.sweep()
    if left:
        metrics.append(f"{request.node.nodeid}: left running, deleted by the sweep: {left}")


# ---- the code interpreter's template ------------------------------------------------------------

# The build of the template (branch e2b-ci: a Python script; a shell wrapper if one comes).
CI_SCRIPTS = [REPO / "tools" / "e2b" / "code-interpreter.py", REPO / "tools" / "e2b" / "code-interpreter.sh"]
CI_TEMPLATE = "code-interpreter-v1"
CI_BUILD_TIMEOUT_S = 1200


@pytest.fixture(scope="session")
def code_interpreter_template(lab):
    """The template `code-interpreter-v1` (issue 19: the SDKs' default for the code interpreter),
    made in this sbxd with the operator's token (the shared catalogue every tenant sees) by
    tools/e2b/code-interpreter.py (its rootfs and wheels are cached on the host). Without the
    script the run_code tests cannot run: skipped locally, failed under SBX_TESTS_MUST_RUN=1
    (CI). Once per session; a failed build fails every test that needs it."""
    script = next((p for p in CI_SCRIPTS if p.is_file()), None)
    if script is None:
        skip_or_fail(f"{CI_SCRIPTS[0].relative_to(REPO)} not found: the template {CI_TEMPLATE} "
                     "cannot be built")
    env = dict(os.environ, SBX_URL=lab.url, SBX_TOKEN=lab.daemon.token, SBX_CACERT=lab.daemon.ca_file,
               SBX_BUILD_DIR=str(e2e.build_dir()))
    # Debian's python for the .py (standard library only), not the SDKs' venv.
    argv = ["/usr/bin/python3", str(script)] if script.suffix == ".py" else ["bash", str(script)]
    try:
        r = subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True,
                           timeout=CI_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.relative_to(REPO)} did not finish within {CI_BUILD_TIMEOUT_S}s")
    if r.returncode != 0:
        pytest.fail(f"{script.relative_to(REPO)} exited {r.returncode}:\n"
                    f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    t = lab.sbx.call("GET", f"/v1/templates/{CI_TEMPLATE}", validate=False)
    assert t.status_code == 200, (f"{script.relative_to(REPO)} succeeded but the tenant does not "
                                  f"see the template {CI_TEMPLATE}: {t.status_code} {t.body}")
    return CI_TEMPLATE


def requests_since(log_path: Path, offset: int, limit: int = 80) -> str:
    """What the SDK asked sbxd and what it answered during one test, from sbxd's JSON log: one
    line per request (method, path, status, tenant) and sbxd's warnings and errors."""
    import json
    out = []
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError as e:
        return f"(cannot read {log_path}: {e})"
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "method" in rec and "status" in rec:
            if rec.get("path", "").startswith("/v1/"):
                continue  # the fixture's own checks through sbx's API
            out.append(f"{rec['method']} {rec['path']} -> {rec['status']} "
                       f"({rec.get('duration_ms', '?')} ms)")
        elif rec.get("level") in ("warn", "warning", "error") or "refused" in rec.get("msg", ""):
            out.append(f"  [{rec.get('level')}] {rec.get('msg', '')[:300]}")
    if len(out) > limit:
        out = out[:10] + [f"  ... {len(out) - limit} more ..."] + out[-(limit - 10):]
    return "\n".join(out) or "(no E2B request reached sbxd)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("call", "teardown"):
        lab_ = getattr(item, "funcargs", {}).get("e2b_env") or getattr(item, "funcargs", {}).get("lab")
        if lab_ is not None:
            offset = getattr(item, "sbxd_log_offset", None)
            if offset is not None:
                report.sections.append(("E2B requests sbxd saw in this test",
                                        requests_since(lab_.daemon.log_path, offset)))
            report.sections.append(("sbxd log", str(lab_.daemon.log_path)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    e2e.pytest_terminal_summary(terminalreporter, exitstatus, config)


# ---- an E2B deployment on the microvm runtime -------------------------------------------------------

@pytest.fixture(scope="session")
def microvm_lab(sbxd, lab, validator):
    """A second sbxd, its default runtime microvm (docs/microvm.md), with the session's TLS
    certificate (the SDKs trust its CA already) and a tenant of its own. Skipped (failed with
    SBX_TESTS_MUST_RUN=1) where microvm cannot run."""
    daemon = start_e2b_daemon(*sbxd.pki, extra_args=["--runtime", "microvm", "--default-memory-mib", "256",
                                                     "--warm-pool", "base=0"])
    lab_ = None
    problems: list[str] = []
    try:
        lab_ = Lab(daemon, validator)
        yield lab_
    finally:
        if lab_ is not None:
            lab_.sweep()
            ids = sorted(lab_.seen)
            lab_.close()
            problems = e2e.shutdown(daemon, validator, ids)
        else:
            daemon.stop()
    if problems:
        pytest.fail("microvm E2B sbxd: " + "; ".join(problems), pytrace=False)

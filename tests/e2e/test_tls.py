"""TLS on sbxd's listener (docs/config.md, tls.cert_file and tls.key_file; docs/threat-model.md,
"TLS"): with both files set sbxd speaks only HTTPS, the CLI verifies it (--cacert, SBX_CACERT,
the URL's host), a SIGHUP reads the files again for new connections, and a bad file stops the
start-up naming the file and OpenSSL's reason.

Each test starts its own sbxd on 127.0.0.1:0 with a test CA made here (python `cryptography`,
already a dependency of the test environment), and stops it by PID. Traffic: loopback only."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509

import requests

from conftest import PORTS_DOMAIN, RUNTIME, Daemon, build_dir, shutdown, skip_or_fail
from port_helpers import start_server, websocket_echo
from sbx_client import SbxClient
from testca import Ca, name as _name
from ws_client import WsClient

RELOAD_TIMEOUT_S = 10
CLI_TIMEOUT_S = 120
HEADER_TIMEOUT_S = 2


# ---- sbxd with TLS, and the CLI ----------------------------------------------------------------

class TlsDaemon:
    """An sbxd whose certificate and key live at cert_path and key_path (rewritten to rotate)."""

    def __init__(self, tmp_path: Path, validator, ca: Ca, cert_pem: bytes, key_pem: bytes):
        self.cert_path = tmp_path / "server.pem"
        self.key_path = tmp_path / "server.key"
        self.cert_path.write_bytes(cert_pem)
        self.key_path.write_bytes(key_pem)
        self.key_path.chmod(0o600)
        self.daemon = Daemon(extra_args=["--tls-cert-file", str(self.cert_path),
                                         "--tls-key-file", str(self.key_path),
                                         "--header-timeout-s", str(HEADER_TIMEOUT_S),
                                         "--warm-pool", "base=0",
                                         "--log-level", "debug"])
        self.daemon.ca_file = str(ca.path)
        self.validator = validator
        self.client: SbxClient | None = None

    @property
    def port(self) -> int:
        return int(self.daemon.url.rsplit(":", 1)[1])

    def start(self) -> SbxClient:
        self.daemon.start()
        assert self.daemon.url.startswith("https://"), self.daemon.url
        self.client = SbxClient(self.daemon.url, self.daemon.token, self.validator,
                                ca_file=self.daemon.ca_file)
        return self.client

    def log(self) -> str:
        return self.daemon.log_path.read_text(errors="replace")

    def sighup(self, marker: str) -> None:
        before = self.log().count(marker)
        os.kill(self.daemon.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while self.log().count(marker) <= before:
            assert self.daemon.proc.poll() is None, f"sbxd exited on SIGHUP:\n{self.daemon.log_tail()}"
            assert time.monotonic() < deadline, f"no '{marker}' line after SIGHUP:\n{self.daemon.log_tail()}"
            time.sleep(0.05)

    def sbx(self, *args: str, ca: Path | str | None = None, env_ca: Path | str | None = None,
            url: str | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        env.update(SBX_URL=url or self.daemon.url, SBX_TOKEN=self.daemon.token,
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        if env_ca is not None:
            env["SBX_CACERT"] = str(env_ca)
        argv = [str(build_dir() / "bin" / "sbx")]
        if ca is not None:
            argv += ["--cacert", str(ca)]
        proc = subprocess.run(argv + list(args), input=stdin if stdin is not None else b"",
                              capture_output=True, env=env, timeout=CLI_TIMEOUT_S)
        assert proc.returncode < 128, f"sbx died of a signal: {proc}"
        return proc

    def close(self) -> list[str]:
        ids = list(self.client.created_sandboxes) if self.client else []
        # Sandboxes the CLI made are found by the final sweep (it lists them over TLS).
        if self.client:
            self.client.close()
        return shutdown(self.daemon, self.validator, ids)


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    return {"ca": Ca.make(d, "sbx-test-ca"), "other_ca": Ca.make(d, "sbx-test-other-ca")}


@pytest.fixture
def tls_sbxd(tmp_path, validator, pki):
    if RUNTIME != "fake" and os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    # 127.0.0.1, and the ports' host names (test_port_relay_over_tls); `localhost` is a name
    # this certificate does not carry.
    cert, key = pki["ca"].issue("sbxd-1", ips=("127.0.0.1",), dns=(f"*.{PORTS_DOMAIN}",))
    d = TlsDaemon(tmp_path, validator, pki["ca"], cert, key)
    try:
        d.start()
        yield d
    finally:
        problems = d.close()
        if problems:
            pytest.fail("stopping the test's sbxd: " + "; ".join(problems))


def tls_connect(port: int, cafile: str | None, server_hostname: str = "127.0.0.1") -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=cafile)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return ctx.wrap_socket(raw, server_hostname=server_hostname)
    except BaseException:
        raw.close()
        raise


def http_get(s: socket.socket, path: str, host: str = "127.0.0.1", headers: dict | None = None) -> bytes:
    """One keep-alive GET on an open connection; the response's head and body."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return head + b"\r\n\r\n" + body


# ---- tests -------------------------------------------------------------------------------------

def test_cli_over_tls_creates_runs_attaches_and_copies(tls_sbxd, pki, tmp_path):
    ca = pki["ca"].path
    created = tls_sbxd.sbx("create", ca=ca)
    assert created.returncode == 0, created
    sid = created.stdout.decode().strip().splitlines()[-1]
    assert sid.startswith("sbx_"), created
    tls_sbxd.client.created_sandboxes.append(sid)

    # A session and its streamed attach (binary attach stream) over TLS, SBX_CACERT this time.
    run = tls_sbxd.sbx("exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 3", env_ca=ca)
    assert run.returncode == 3, run
    assert run.stdout == b"out\n", run
    assert b"err\n" in run.stderr, run

    # A bigger stream: many writes, reassembled in order.
    big = tls_sbxd.sbx("exec", sid, "--", "sh", "-c", "seq 1 20000", ca=ca)
    assert big.returncode == 0, big
    assert big.stdout == "".join(f"{i}\n" for i in range(1, 20001)).encode()

    # The WebSocket session (sbx exec -i) over TLS.
    ws = tls_sbxd.sbx("exec", "-i", sid, "--", "sh", "-c", "tr a-z A-Z; exit 4", ca=ca,
                      stdin=b"hello\nworld\n")
    assert ws.returncode == 4, ws
    assert ws.stdout == b"HELLO\nWORLD\n", ws

    # File transfers both ways (a streamed upload and download on their own connections).
    local = tmp_path / "payload.bin"
    local.write_bytes(os.urandom(3 << 20))
    up = tls_sbxd.sbx("cp", str(local), f"{sid}:/tmp/payload.bin", ca=ca)
    assert up.returncode == 0, up
    back = tmp_path / "back.bin"
    down = tls_sbxd.sbx("cp", f"{sid}:/tmp/payload.bin", str(back), ca=ca)
    assert down.returncode == 0, down
    assert back.read_bytes() == local.read_bytes()

    rm = tls_sbxd.sbx("rm", sid, ca=ca)
    assert rm.returncode == 0, rm


def test_plain_http_to_the_tls_port_fails_cleanly(tls_sbxd, pki):
    with socket.create_connection(("127.0.0.1", tls_sbxd.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 400"), data
    assert b"HTTPS" in data, data

    # The CLI pointed at the TLS port with http:// reads that answer as an error, not a crash.
    plain = tls_sbxd.sbx("ls", url=tls_sbxd.daemon.url.replace("https://", "http://"))
    assert plain.returncode == 1, plain
    assert b"https://" in plain.stderr, plain

    # sbxd goes on serving HTTPS.
    assert tls_sbxd.client.call("GET", "/healthz", token=None, validate=False).status_code == 200
    assert tls_sbxd.daemon.proc.poll() is None


def test_port_relay_over_tls(tls_sbxd, pki):
    """A server in a sandbox reached through sbxd's TLS listener: by path and by host name
    (the name in SNI and Host, verified against the test CA), bodies both ways, and a
    WebSocket, whose upgraded connection sbxd relays inside TLS; plain HTTP to the port's URL
    is refused before anything reaches the sandbox."""
    api = tls_sbxd.client
    sb = api.create_sandbox({})["sandbox"]
    sid, traffic = sb["id"], {"X-Sbx-Traffic-Token": sb["traffic_token"]}
    start_server(api, sid, 8000, "0.0.0.0")
    base = tls_sbxd.daemon.url
    http = requests.Session()
    http.trust_env = False
    http.verify = str(pki["ca"].path)
    try:
        # The path form.
        url = f"{base}/v1/sandboxes/{sid}/ports/8000"
        r = http.get(f"{url}/headers?a=1", headers=traffic, timeout=30)
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["path"] == "/headers?a=1"
        assert "x-sbx-traffic-token" not in seen["headers"]
        assert seen["headers"].get("x-forwarded-for") == "127.0.0.1"
        # The server speaks plain HTTP to sbxd: the header tells it the client used https.
        r = http.get(f"{url}/headers", headers={**traffic, "X-Forwarded-Proto": "http"}, timeout=30)
        assert r.json()["headers"].get("x-forwarded-proto") == "https", r.json()
        # Bodies both ways: chunked and with a length up, chunked down, each past a TLS
        # record many times over.
        blob = os.urandom(3 << 20)
        digest = hashlib.sha256(blob).hexdigest()
        for data in (blob, (blob[i:i + (1 << 18)] for i in range(0, len(blob), 1 << 18))):
            r = http.post(f"{url}/sum", data=data, headers=traffic, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json() == {"length": len(blob), "sha256": digest}
        n = 5 << 20
        r = http.get(f"{url}/bytes?n={n}", headers=traffic, timeout=60)
        assert r.status_code == 200 and len(r.content) == n
        pattern = bytes(range(256)) * 256
        assert r.content == pattern * (n // len(pattern))
        # Without the traffic token, sbxd answers itself.
        assert http.get(f"{url}/headers", timeout=30).status_code == 401

        # The host-name form: the name goes in SNI and in Host; the certificate's *.sbx.test
        # covers it with the id's `_` written `-` (no wildcard matches a label with `_`: the
        # form with it fails verification, which is why sbxd takes this one).
        host = f"8000-{sid.replace('_', '-')}.{PORTS_DOMAIN}"
        with pytest.raises(ssl.SSLCertVerificationError):
            tls_connect(tls_sbxd.port, str(pki["ca"].path),
                        server_hostname=f"8000-{sid}.{PORTS_DOMAIN}").close()
        with tls_connect(tls_sbxd.port, str(pki["ca"].path), server_hostname=host) as s:
            answer = http_get(s, "/headers?b=2", host=host, headers=traffic)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
            seen = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert seen["path"] == "/headers?b=2" and seen["headers"]["host"] == host, seen
            # The connection stays open for the next request.
            assert http_get(s, "/headers", host=host, headers=traffic).startswith(b"HTTP/1.1 200")

        # A WebSocket through the relay, inside TLS, by path and by host name.
        for path, name in ((f"/v1/sandboxes/{sid}/ports/8000/ws", None), ("/ws", host)):
            websocket_echo(WsClient(base, path, None, extra_headers=traffic,
                                    ssl_context=api.ssl_context(), host=name))

        # Plain HTTP to the port's URL on the TLS listener: refused with the "use https://"
        # answer, and the relay goes on serving.
        with socket.create_connection(("127.0.0.1", tls_sbxd.port), timeout=10) as s:
            s.sendall(f"GET /v1/sandboxes/{sid}/ports/8000/headers HTTP/1.1\r\n"
                      f"Host: 127.0.0.1\r\nX-Sbx-Traffic-Token: {sb['traffic_token']}\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 400") and b"HTTPS" in data, data
        plain = requests.Session()
        plain.trust_env = False
        try:
            r = plain.get(f"{base.replace('https://', 'http://')}/v1/sandboxes/{sid}/ports/8000/headers",
                          headers=traffic, timeout=30)
            assert r.status_code == 400 and "https://" in r.json()["error"]["message"], r.text
        finally:
            plain.close()
        assert http.get(f"{url}/headers", headers=traffic, timeout=30).status_code == 200

        # The CLI prints https:// URLs for a TLS sbxd.
        out = tls_sbxd.sbx("port", sid, "8000", ca=pki["ca"].path)
        assert out.returncode == 0, out
        assert out.stdout.decode().splitlines() == [f"{base}/v1/sandboxes/{sid}/ports/8000/",
                                                    f"https://{host}:{tls_sbxd.port}/"], out
    finally:
        http.close()
    assert api.delete_sandbox(sid)["state"] == "succeeded"


def test_a_silent_client_is_cut_off_at_the_header_timeout(tls_sbxd):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", tls_sbxd.port), timeout=HEADER_TIMEOUT_S + 10) as s:
        assert s.recv(1) == b""  # closed by sbxd, no hello ever sent
    elapsed = time.monotonic() - started
    assert HEADER_TIMEOUT_S - 0.5 <= elapsed < HEADER_TIMEOUT_S + 5, elapsed
    # Logged at debug, and the daemon is fine.
    deadline = time.monotonic() + 5
    while "TLS handshake with 127.0.0.1" not in tls_sbxd.log():
        assert time.monotonic() < deadline, tls_sbxd.daemon.log_tail()
        time.sleep(0.05)
    assert tls_sbxd.client.call("GET", "/healthz", token=None, validate=False).status_code == 200


def test_a_client_without_the_ca_or_for_another_name_fails_verification(tls_sbxd, pki, tmp_path):
    # The system's CAs do not know the test CA.
    no_ca = tls_sbxd.sbx("ls")
    assert no_ca.returncode == 1, no_ca
    err = no_ca.stderr.decode()
    assert "certificate verify failed" in err and "--cacert" in err, err

    wrong_ca = tls_sbxd.sbx("ls", ca=pki["other_ca"].path)
    assert wrong_ca.returncode == 1, wrong_ca
    assert "certificate verify failed" in wrong_ca.stderr.decode(), wrong_ca

    # The right CA, but a name the certificate does not carry.
    by_name = tls_sbxd.sbx("ls", ca=pki["ca"].path, url=f"https://localhost:{tls_sbxd.port}")
    assert by_name.returncode == 1, by_name
    assert "mismatch" in by_name.stderr.decode(), by_name

    missing = tls_sbxd.sbx("ls", ca=tmp_path / "nope.pem")
    assert missing.returncode == 2, missing
    assert "nope.pem" in missing.stderr.decode(), missing

    with pytest.raises(ssl.SSLCertVerificationError):
        tls_connect(tls_sbxd.port, cafile=str(pki["other_ca"].path)).close()

    ok = tls_sbxd.sbx("ls", ca=pki["ca"].path)
    assert ok.returncode == 0, ok
    assert tls_sbxd.daemon.proc.poll() is None


def test_sighup_serves_a_new_certificate_to_new_connections(tls_sbxd, pki):
    ca, other = pki["ca"], pki["other_ca"]
    # A connection made before the reload keeps its certificate and goes on serving.
    before = tls_connect(tls_sbxd.port, cafile=str(ca.path))
    try:
        old_der = before.getpeercert(binary_form=True)
        assert http_get(before, "/healthz").startswith(b"HTTP/1.1 200")

        cert, key = other.issue("sbxd-2", ips=("127.0.0.1",), dns=("localhost",))
        tls_sbxd.cert_path.write_bytes(cert)
        tls_sbxd.key_path.write_bytes(key)
        tls_sbxd.sighup("SIGHUP: TLS certificate reloaded")
        tls_sbxd.daemon.ca_file = str(other.path)  # for the final sweep
        tls_sbxd.client.use_ca(tls_sbxd.daemon.ca_file)

        after = tls_connect(tls_sbxd.port, cafile=str(other.path))
        with after:
            new_der = after.getpeercert(binary_form=True)
        assert new_der != old_der
        assert x509.load_der_x509_certificate(new_der).subject == _name("sbxd-2")
        assert http_get(before, "/healthz").startswith(b"HTTP/1.1 200")
    finally:
        before.close()

    ok = tls_sbxd.sbx("ls", ca=other.path, url=f"https://localhost:{tls_sbxd.port}")
    assert ok.returncode == 0, ok
    stale = tls_sbxd.sbx("ls", ca=ca.path)
    assert stale.returncode == 1, stale

    # A reload whose files do not load keeps the running certificate, and says why.
    tls_sbxd.cert_path.write_text("not a certificate\n")
    tls_sbxd.sighup("SIGHUP: TLS certificate not reloaded")
    log = tls_sbxd.log()
    assert str(tls_sbxd.cert_path) in log.split("SIGHUP: TLS certificate not reloaded")[-1].splitlines()[0]
    still = tls_connect(tls_sbxd.port, cafile=str(other.path))
    with still:
        assert still.getpeercert(binary_form=True) == new_der
    assert tls_sbxd.daemon.proc.poll() is None


def _sbxd_once(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    state = tmp_path / "state-once"
    state.mkdir(exist_ok=True)
    return subprocess.run([str(build_dir() / "bin" / "sbxd"), "--listen", "127.0.0.1:0",
                           "--state-dir", str(state), "--config", "", *args],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, env=env)


def test_a_bad_certificate_or_key_stops_the_start_up_naming_the_file(tmp_path, pki):
    cert, key = pki["ca"].issue("sbxd")
    good_cert, good_key = tmp_path / "c.pem", tmp_path / "k.pem"
    good_cert.write_bytes(cert)
    good_key.write_bytes(key)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    _, other_key = pki["ca"].issue("other")
    wrong_key = tmp_path / "wrong.key"
    wrong_key.write_bytes(other_key)

    r = _sbxd_once(tmp_path, "--tls-cert-file", str(garbage), "--tls-key-file", str(good_key))
    assert r.returncode != 0, r
    assert str(garbage) in r.stderr and "no start line" in r.stderr, r.stderr

    r = _sbxd_once(tmp_path, "--tls-cert-file", str(tmp_path / "absent.pem"), "--tls-key-file", str(good_key))
    assert r.returncode != 0, r
    assert "absent.pem" in r.stderr and "No such file" in r.stderr, r.stderr

    r = _sbxd_once(tmp_path, "--tls-cert-file", str(good_cert), "--tls-key-file", str(wrong_key))
    assert r.returncode != 0, r
    assert str(wrong_key) in r.stderr and "does not belong" in r.stderr, r.stderr

    r = _sbxd_once(tmp_path, "--tls-cert-file", str(good_cert))
    assert r.returncode != 0, r
    assert "tls.key_file must be set too" in r.stderr, r.stderr

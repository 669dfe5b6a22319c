"""Real registries for the template tests, started on 127.0.0.1 and stopped by PID: Debian's
docker-registry (plain http, htpasswd basic auth, TLS from a test CA, or behind the Docker token
flow), the token service that flow needs, and Debian's tinyproxy as the configured HTTP proxy.

The token service is the test's own (there is none in Debian): it does what the distribution
registry's token spec asks of one (docs.docker.com/registry/spec/auth/token): on
GET /token?service=S&scope=repository:R:A it checks Basic credentials and answers a JWT signed
with a key whose certificate chains to the registry's `rootcertbundle` (x5c header), granting
only the actions the user holds. It counts what it was asked, so a test can prove the flow ran."""
from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

import images
from conftest import skip_or_fail
from testca import Ca

START_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, f"{what} exited: {log.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"{what} did not listen on {port}"
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class TokenService:
    """The Docker token flow's authorization service, over TLS from `ca`, on 127.0.0.1."""

    ISSUER = "sbx-test-token-issuer"
    SERVICE = "sbx-test-registry"

    def __init__(self, root: Path, ca: Ca, users: dict[str, tuple[str, list[str]]]):
        """users: name -> (password, actions granted on every repository)."""
        root.mkdir(parents=True, exist_ok=True)
        self.users = users
        self.requests: list[dict] = []  # what each GET /token asked and was given
        self.lock = threading.Lock()
        cert_pem, key_pem = ca.issue("sbx-test-token-service")
        (root / "token.crt").write_bytes(cert_pem)
        (root / "token.key").write_bytes(key_pem)
        # The signing key: its certificate is issued by the same CA, and the registry trusts
        # the CA (rootcertbundle) and verifies the chain the token's x5c header carries.
        signer_pem, signer_key_pem = ca.issue("sbx-test-token-signer", ips=())
        self.signer_der = x509.load_pem_x509_certificate(signer_pem).public_bytes(
            serialization.Encoding.DER)
        self.signer_key = serialization.load_pem_private_key(signer_key_pem, password=None)
        self.rootcertbundle = ca.path
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the test reads `requests`
                pass

            def do_GET(self):
                service.answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(root / "token.crt", root / "token.key")
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def realm(self) -> str:
        return f"https://127.0.0.1:{self.port}/token"

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        q = parse_qs(url.query)
        user = None
        auth = h.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            name, _, password = base64.b64decode(auth[6:]).decode(errors="replace").partition(":")
            if self.users.get(name, (None,))[0] != password:
                self._record(q, name, refused=True)
                return self._send(h, 401, {"errors": [{"code": "UNAUTHORIZED",
                                                       "message": "wrong user or password"}]})
            user = name
        if url.path != "/token" or q.get("service") != [self.SERVICE]:
            return self._send(h, 400, {"errors": [{"code": "BAD_REQUEST", "message": "bad service"}]})
        granted = []
        held = self.users[user][1] if user else []
        for scope in q.get("scope", []):
            kind, _, rest = scope.partition(":")
            repo, _, actions = rest.rpartition(":")
            allowed = [a for a in actions.split(",") if a in held]
            if kind == "repository" and allowed:
                granted.append({"type": "repository", "name": repo, "actions": allowed})
        self._record(q, user, refused=False, granted=granted)
        token = self._jwt(user or "", granted)
        self._send(h, 200, {"token": token, "access_token": token, "expires_in": 300})

    def _record(self, q, user, refused, granted=()):
        with self.lock:
            self.requests.append({"user": user, "scope": q.get("scope", []), "refused": refused,
                                  "granted": list(granted)})

    def _jwt(self, subject: str, access: list) -> str:
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(self.signer_der).decode()]}
        claims = {"iss": self.ISSUER, "sub": subject, "aud": self.SERVICE, "exp": now + 300,
                  "nbf": now - 60, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        der = self.signer_key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class Registry:
    """Debian's docker-registry on 127.0.0.1: plain http, or TLS with a certificate from `ca`;
    optionally behind htpasswd basic auth or a TokenService."""

    def __init__(self, root: Path, htpasswd: Path | None = None, *, ca: Ca | None = None,
                 token: TokenService | None = None):
        exe = shutil.which("docker-registry")
        if not exe:
            skip_or_fail("docker-registry is not installed (tools/install-deps.sh installs it)")
        self.port = free_port()
        self.tls = ca is not None
        root.mkdir(parents=True, exist_ok=True)
        cfg = {"version": 0.1, "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
               "http": {"addr": f"127.0.0.1:{self.port}"}}
        if ca:
            cert, key = ca.issue("sbx-test-registry")
            (root / "registry.crt").write_bytes(cert)
            (root / "registry.key").write_bytes(key)
            cfg["http"]["tls"] = {"certificate": str(root / "registry.crt"),
                                  "key": str(root / "registry.key")}
        if htpasswd:
            cfg["auth"] = {"htpasswd": {"realm": "sbx-test", "path": str(htpasswd)}}
        if token:
            cfg["auth"] = {"token": {"realm": token.realm, "service": token.SERVICE,
                                     "issuer": token.ISSUER,
                                     "rootcertbundle": str(token.rootcertbundle)}}
        (root / "config.yml").write_text(json.dumps(cfg))  # JSON is YAML
        self.log_path = root / "registry.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([exe, "serve", str(root / "config.yml")], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_listening(self.port, self.proc, self.log_path, "docker-registry")

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push(self, layout: Path, repo: str, creds: str | None = None) -> None:
        # The pushing side is the test's, not what is tested: it skips verification.
        args = ["copy", "-q", "--dest-tls-verify=false"]
        if creds:
            args += ["--dest-creds", creds]
        images.skopeo(*args, f"oci:{layout}:t", f"docker://{self.host}/{repo}")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class TinyProxy:
    """Debian's tinyproxy on 127.0.0.1, in the foreground, logging every request it relays."""

    def __init__(self, root: Path):
        exe = shutil.which("tinyproxy")
        if not exe:
            skip_or_fail("tinyproxy is not installed (tools/install-deps.sh installs tinyproxy-bin)")
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = root / "tinyproxy.log"
        self.log_path.touch()
        # No ConnectPort line: CONNECT to any port (the registries listen on random ones).
        (root / "tinyproxy.conf").write_text(
            f"Port {self.port}\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 60\n"
            f"MaxClients 16\nLogLevel Connect\nLogFile \"{self.log_path}\"\n")
        self.out = open(root / "tinyproxy.out", "wb")
        self.proc = subprocess.Popen([exe, "-d", "-c", str(root / "tinyproxy.conf")],
                                     stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_listening(self.port, self.proc, root / "tinyproxy.out", "tinyproxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def relayed(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self.out.close()

"""The egress lab of the networking tests (issue 16): sbxd runs inside a network namespace the
test makes, whose only route out is a veth to a second namespace, the "stand-in internet" (an
HTTP server and a UDP echo on 198.18.0.2, a second address 198.19.0.10), in a range the
configuration exempts (198.18.0.0/15). Nothing is sent off the machine, and the host's own
namespace, routes and sysctls are never touched: forwarding and nftables change only inside the
test's namespaces, which are deleted at the end (their veths and sbx's table go with them).

The test's main thread enters sbxd's namespace (setns) to reach its API on 127.0.0.1 there,
and returns to its own namespace at the end. Each test file makes its own lab (a module-scoped
fixture around `lab(...)`), with its own profiles and stand-in servers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import (Daemon, _reap_adopted_orphans, _set_child_subreaper,  # noqa: E402
                      not_applicable_on_fake_runtime, shutdown, skip_or_fail)
from sbx_client import SbxClient  # noqa: E402

CLONE_NEWNET = 0x40000000
POOL4 = "10.241.0.0/24"
POOL6 = "fd5b:5bd0:0:2::/64"
INTERNET = "198.18.0.2"   # the stand-in internet's end of the uplink veth
FAR = "198.19.0.10"       # a second address of the stand-in internet (behind 198.18.0.2)
UPLINK_HOST = "198.18.0.1"  # sbxd's end of the uplink
HTTP_PORT, OTHER_PORT, UDP_PORT, HOST_SERVICE_PORT = 8080, 8081, 9000, 7999


# The stand-in internet: HTTP on every address (8080 and 8081), UDP echo on 9000.
INTERNET_SERVERS = r"""
import http.server, socket, socketserver, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"internet-ok"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
for port in (8080, 8081):
    s = socketserver.ThreadingTCPServer(("0.0.0.0", port), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 9000))
print("ready", flush=True)
while True:
    data, addr = u.recvfrom(2048); u.sendto(data, addr)
"""

# A service on sbxd's own namespace, every address: a sandbox must never reach it.
HOST_SERVICE = r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7999)); s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"host-service"); c.close()
"""

# Run inside a sandbox: one probe per argument, "tcp:HOST:PORT" or "udp:HOST:PORT"; prints
# one line per probe, "ok" or the error.
PROBE = r"""
import socket, sys
for spec in sys.argv[1:]:
    kind, host, port = spec.split(":")
    try:
        if kind == "tcp":
            s = socket.create_connection((host, int(port)), timeout=1.5)
            s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n"); s.settimeout(1.5); s.recv(64); s.close()
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
            s.sendto(b"ping", (host, int(port))); s.recvfrom(64); s.close()
        print(spec, "ok")
    except Exception as e:
        print(spec, type(e).__name__)
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


class Netns:
    """The test's two namespaces and the veth between them; remove() undoes everything."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.sbxd_ns = f"sbxt-d-{tag}"
        self.inet_ns = f"sbxt-i-{tag}"
        self.procs: list[subprocess.Popen] = []

    def make(self, internet_servers: Sequence[str] = ()) -> None:
        d, i = self.sbxd_ns, self.inet_ns
        sh("ip", "netns", "add", d)
        sh("ip", "netns", "add", i)
        sh("ip", "-n", d, "link", "set", "lo", "up")
        sh("ip", "-n", i, "link", "set", "lo", "up")
        sh("ip", "-n", d, "link", "add", "uplink0", "type", "veth", "peer", "name", "inet0",
           "netns", i)
        sh("ip", "-n", d, "addr", "add", f"{UPLINK_HOST}/30", "dev", "uplink0")
        sh("ip", "-n", i, "addr", "add", f"{INTERNET}/30", "dev", "inet0")
        sh("ip", "-n", i, "addr", "add", f"{FAR}/32", "dev", "lo")
        sh("ip", "-n", d, "link", "set", "uplink0", "up")
        sh("ip", "-n", i, "link", "set", "inet0", "up")
        sh("ip", "-n", d, "route", "add", "default", "via", INTERNET)
        self.procs.append(self._serve(i, INTERNET_SERVERS))
        self.procs.append(self._serve(d, HOST_SERVICE))
        for code in internet_servers:
            self.procs.append(self._serve(i, code))

    def _serve(self, ns: str, code: str) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", code],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        line = p.stdout.readline()
        assert line.strip() == "ready", f"server in {ns} did not start: {line!r}"
        return p

    def remove(self) -> list[str]:
        problems = []
        for p in self.procs:
            p.kill()
            p.wait(10)
        for ns in (self.sbxd_ns, self.inet_ns):
            r = sh("ip", "netns", "del", ns, check=False)
            if r.returncode != 0 and "No such file" not in r.stderr:
                problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
        return problems


def libc_setns(path: str) -> int:
    """Moves the calling thread into the network namespace at `path`; returns the old one's fd."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)
    return old


def libc_setns_fd(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns back")


@contextlib.contextmanager
def lab(validator, profiles_toml: str, extra_args: Sequence[str] = (),
        internet_servers: Sequence[str] = ()) -> Iterator[SbxClient]:
    """sbxd in a fresh test namespace behind the stand-in internet, configured with
    `profiles_toml` (TOML text: egress.profiles.* and any other keys) and `extra_args`;
    `internet_servers`: more Python programs to run in the stand-in internet (each prints
    "ready" once it serves). Yields a client of that sbxd; the calling thread is inside sbxd's
    namespace meanwhile (to reach its API on 127.0.0.1 there)."""
    not_applicable_on_fake_runtime("egress needs the ns runtime")
    if os.geteuid() != 0:
        skip_or_fail("egress needs root (network namespaces, nftables)")
    net = Netns()
    daemon = None
    old_ns = None
    client = None
    restarted = False

    def restart() -> SbxClient:
        """SIGTERM to sbxd (sandboxes keep running) and a new one on the same state and token,
        as after an upgrade; returns a client of the new one (the old client's port is gone).
        The sandboxes' first processes are re-parented to this process meanwhile (a subreaper
        until the lab ends), which reaps them once deleted, as conftest's `restartable` does."""
        nonlocal daemon, client, restarted
        if not restarted:
            _set_child_subreaper(True)
            restarted = True
        old = daemon
        rc = old.stop()
        assert rc in (0, -signal.SIGTERM), f"sbxd exited with {rc} on SIGTERM"
        d = Daemon(old.extra_args)
        shutil.rmtree(d.tmp, ignore_errors=True)
        d.tmp, d.state_dir, d.log_path, d.token = old.tmp, old.state_dir, old.log_path, old.token
        d.binary = old.binary
        daemon = d
        d.start()
        fresh = SbxClient(d.url, d.token, validator)
        fresh.netns, fresh.restart, fresh.daemon_pid = net, restart, d.proc.pid
        fresh.created_sandboxes = client.created_sandboxes  # what the cleanup checks
        client.close()
        client = fresh
        deadline = time.monotonic() + 60
        while fresh.call("GET", "/readyz", token=None, validate=False).status_code != 200:
            assert time.monotonic() < deadline, "sbxd not ready after restart"
            time.sleep(0.1)
        return fresh

    try:
        net.make(internet_servers)
        tmp_conf = Path(f"/tmp/{net.sbxd_ns}.toml")
        tmp_conf.write_text(profiles_toml)
        wrapper = Path(f"/tmp/{net.sbxd_ns}-sbxd")
        daemon = Daemon(extra_args=[
            "--config", str(tmp_conf), "--egress", "true", "--egress-pool-v4", POOL4,
            "--egress-pool-v6", POOL6, "--egress-exempt", "198.18.0.0/15",
            "--egress-uplink", "uplink0", "--warm-pool", "base=0", *extra_args])
        # sbxd in the test's namespace: nsenter enters only the network namespace and execs
        # (the Daemon's PID is sbxd's own).
        wrapper.write_text(f"#!/bin/sh\nexec nsenter --net=/run/netns/{net.sbxd_ns} "
                           f"{daemon.binary} \"$@\"\n")
        wrapper.chmod(0o755)
        daemon.binary = wrapper
        daemon.start()
        old_ns = libc_setns(f"/run/netns/{net.sbxd_ns}")
        client = SbxClient(daemon.url, daemon.token, validator)
        client.netns = net  # tests reach the namespaces' names through it
        client.restart = restart  # a test that restarts sbxd uses the client it returns
        client.daemon_pid = daemon.proc.pid  # sbxd's own (nsenter execs it)
        yield client
    finally:
        problems = []
        if client is not None:
            client.close()
        if daemon is not None:
            ids = list(client.created_sandboxes) if client else []
            if restarted:
                _reap_adopted_orphans(ids, {daemon.proc.pid} if daemon.proc else set())
            problems += shutdown(daemon, validator, ids)
        if restarted:
            _set_child_subreaper(False)
        if old_ns is not None:
            libc_setns_fd(old_ns)
            os.close(old_ns)
        problems += net.remove()
        for p in (Path(f"/tmp/{net.sbxd_ns}.toml"), Path(f"/tmp/{net.sbxd_ns}-sbxd")):
            p.unlink(missing_ok=True)
        if problems:
            pytest.fail("egress lab cleanup: " + "; ".join(problems), pytrace=False)


def probe(api: SbxClient, sid: str, *specs: str) -> dict[str, str]:
    r = api.run(sid, ["/usr/bin/python3", "-c", PROBE, *specs], max_seconds=60)
    out = {}
    for line in r.stdout.decode().splitlines():
        spec, _, verdict = line.partition(" ")
        out[spec] = verdict
    assert set(out) == set(specs), (r.stdout, r.stderr)
    return out


def create(api: SbxClient, body: dict) -> dict:
    return api.create_sandbox(body)["sandbox"]

"""Domain rules held on each connection (issue 16): sbxd's Host/SNI proxy, end to end.

The lab (netlab.py) runs sbxd in a test namespace behind a stand-in internet, which here also
serves TLS on 8443 for several names on each of its addresses (certificates of a CA this test
makes with `openssl`, handed to the sandbox through the files API) and a DNS server this test
controls (sbxd's resolver forwards to it: `--egress-dns-upstream`). A sandbox of profile
`named` may reach `pypi.test` (8443 and 8080) and `*.pythonhosted.test` (8443) by name only.

Asserted: an allowed name at the address it resolved to passes (TLS and plain HTTP, the server
sees the name); a disallowed SNI or Host at that same address is refused (`name_not_allowed`);
an allowed name sent to an address it did not resolve to is refused (`name_address_mismatch`);
a connection naming nothing (`no_name`), a direct-IP connection and UDP (`udp_domain`) are
refused. Each refusal shows in the sandbox's denial counts.

The tests marked `needs_resolver` need sbxd's resolver (branch `dns`, flag
`--egress-dns-upstream`); the others do what the resolver would at the packet level only: they
add the sandbox's veth . address to `resolved4` with the nft command in the test's namespace,
so a connection is steered to the proxy exactly as after a lookup, while sbxd's NameTable stays
empty (nothing in sbxd is faked: an allowed name there is an unresolved one).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netlab  # noqa: E402
from conftest import build_dir, skip_or_fail  # noqa: E402
from netlab import FAR, INTERNET, UDP_PORT, create  # noqa: E402

TLS_PORT = 8443
HTTP_PORT = 8080

OTHER_PORT = netlab.OTHER_PORT

PROFILES = f"""
[egress.profiles.named]
description = "two names by name, one address by CIDR"
allow = [{{domain = "pypi.test", ports = "{TLS_PORT}"}},
         {{domain = "pypi.test", ports = "{HTTP_PORT}"}},
         {{domain = "*.pythonhosted.test", ports = "{TLS_PORT}"}},
         {{cidr = "{FAR}/32", ports = "{OTHER_PORT}", protocol = "tcp"}}]
"""

# name -> address, answered by the stand-in DNS server (everything else: NXDOMAIN).
ZONE = {"pypi.test": INTERNET, "evil.test": INTERNET, "files.pythonhosted.test": INTERNET,
        "mirror.pythonhosted.test": FAR}

# The stand-in DNS server: A records of ZONE over UDP, TTL 300.
DNS_SERVER = r"""
import socket, struct
ZONE = %r
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 53))
print("ready", flush=True)
while True:
    q, addr = u.recvfrom(512)
    try:
        qid, flags, qd = struct.unpack(">HHH", q[:6])
        pos, labels = 12, []
        while q[pos]:
            labels.append(q[pos + 1:pos + 1 + q[pos]].decode()); pos += 1 + q[pos]
        qtype = struct.unpack(">H", q[pos + 1:pos + 3])[0]
        question = q[12:pos + 5]
        name = ".".join(labels).lower()
        ip = ZONE.get(name)
        if ip and qtype == 1:
            ans = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 300, 4) + socket.inet_aton(ip)
            u.sendto(struct.pack(">HHHHHH", qid, 0x8180, 1, 1, 0, 0) + question + ans, addr)
        else:
            rcode = 0 if ip else 3
            u.sendto(struct.pack(">HHHHHH", qid, 0x8180 | rcode, 1, 0, 0, 0) + question, addr)
    except Exception:
        pass
"""

# TLS on every address, for every name of its certificate: answers "tls-ok SNI" with the name
# the ClientHello carried (the proxy never terminates TLS: the server sees the client's SNI).
TLS_SERVER = r"""
import socket, ssl, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(%r, %r)
seen = {}
def sni(sock, name, _ctx):
    seen[id(sock)] = name
ctx.sni_callback = sni
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", %d)); s.listen(64)
def serve(c):
    try:
        t = ctx.wrap_socket(c, server_side=True)
        t.recv(1024)
        t.sendall(("tls-ok " + str(seen.pop(id(t), None))).encode())
        t.close()
    except Exception:
        c.close()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# Run inside a sandbox: one probe per argument, prints "SPEC ok REPLY" or "SPEC ErrorName".
#   resolve:NAME            getaddrinfo through sbxd's resolver
#   tls:ADDR:PORT:SNI       TLS to ADDR (a name is resolved first) with SNI, verifying the CA
#   http:ADDR:PORT:HOST     plain HTTP GET with that Host
#   raw:ADDR:PORT           a connection that sends a non-HTTP, non-TLS greeting
#   udp:ADDR:PORT           a datagram, waits for the echo
CLIENT = r"""
import socket, ssl, sys
def addr(a):
    return socket.getaddrinfo(a, None, socket.AF_INET)[0][4][0]
for spec in sys.argv[1:]:
    kind, *args = spec.split(":")
    try:
        if kind == "resolve":
            print(spec, "ok", addr(args[0])); continue
        if kind == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
            s.sendto(b"ping", (addr(args[0]), int(args[1]))); s.recvfrom(64)
            print(spec, "ok"); continue
        s = socket.create_connection((addr(args[0]), int(args[1])), timeout=3)
        s.settimeout(3)
        if kind == "tls":
            ctx = ssl.create_default_context(cafile="/tmp/sbx-test-ca.pem")
            s = ctx.wrap_socket(s, server_hostname=args[2])
            s.sendall(b"hello"); reply = s.recv(256)
        elif kind == "http":
            s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % args[2]).encode())
            # Until the server closes (Connection: close): headers and body may come apart.
            data = b""
            while len(data) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            reply = data.split(b"\r\n\r\n", 1)[-1] if b"\r\n\r\n" in data else b""
        else:
            s.sendall(b"SSH-2.0-probe\r\n"); reply = s.recv(64)
        if not reply:
            raise ConnectionResetError("closed")
        print(spec, "ok", " ".join(reply.decode(errors="replace").split())[:80])
    except Exception as e:
        print(spec, type(e).__name__)
"""


def make_ca(d: Path) -> tuple[Path, Path, Path]:
    """A CA and one certificate for every name of ZONE and pypi.test, both P-256 (fast)."""
    def run(*argv: str) -> None:
        subprocess.run(list(argv), check=True, capture_output=True, cwd=d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=sbx proxy test CA")
    run("openssl", "req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=pypi.test")
    sans = ",".join(f"DNS:{n}" for n in ZONE)
    (d / "ext").write_text(f"subjectAltName={sans}\n")
    run("openssl", "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "ext")
    return d / "ca.pem", d / "leaf.pem", d / "leaf.key"


def has_resolver() -> bool:
    out = subprocess.run([str(build_dir() / "bin" / "sbxd"), "--help"], capture_output=True, text=True)
    return "--egress-dns-upstream" in out.stdout + out.stderr


@pytest.fixture(scope="module")
def plab(validator):
    resolver = has_resolver()
    with tempfile.TemporaryDirectory(prefix="sbx-proxy-ca-") as tmp:
        ca, cert, key = make_ca(Path(tmp))
        servers = [DNS_SERVER % (ZONE,), TLS_SERVER % (str(cert), str(key), TLS_PORT)]
        extra = ["--egress-dns-upstream", f"{INTERNET}:53"] if resolver else []
        with netlab.lab(validator, PROFILES, extra_args=extra, internet_servers=servers) as api:
            api.test_ca = ca.read_bytes()
            api.resolver = resolver
            yield api


def needs_resolver(api) -> None:
    if not api.resolver:
        skip_or_fail("needs sbxd's resolver (branch dns: --egress-dns-upstream)")


def steer(api, sid: str, *addrs: str) -> None:
    """What sbxd's resolver does at the packet level after answering: veth . address into
    resolved4 (TTL 300 s), so the sandbox's TCP to these addresses goes to the proxy."""
    links = subprocess.run(["ip", "-n", api.netns.sbxd_ns, "-o", "link", "show"],
                           capture_output=True, text=True, check=True).stdout
    veth = next(l.split(":")[1].strip().split("@")[0] for l in links.splitlines()
                if f"alias {sid}" in l)
    elems = ", ".join(f'"{veth}" . {a} timeout 300s' for a in addrs)
    # libnftables through ctypes (no nft command here); this thread is in sbxd's namespace.
    lib = ctypes.CDLL("libnftables.so.1")
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    ctx = lib.nft_ctx_new(0)
    try:
        rc = lib.nft_run_cmd_from_buffer(ctx, f"add element inet sbx resolved4 {{ {elems} }}".encode())
    finally:
        lib.nft_ctx_free(ctx)
    assert rc == 0, f"nft add element for {veth}"


def named_sandbox(api) -> str:
    sb = create(api, {"egress_profile": "named"})
    api.call("PUT", f"/v1/sandboxes/{sb['id']}/files", params={"path": "/tmp/sbx-test-ca.pem"},
             data=api.test_ca, expect=200)
    return sb["id"]


def client(api, sid: str, *specs: str) -> dict[str, str]:
    r = api.run(sid, ["/usr/bin/python3", "-c", CLIENT, *specs], max_seconds=90)
    out = {}
    for line in r.stdout.decode().splitlines():
        spec, _, verdict = line.partition(" ")
        out[spec] = verdict
    assert set(out) == set(specs), (r.stdout, r.stderr)
    return out


def denied(api, sid: str) -> dict[str, int]:
    return api.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body["denied"]


def test_allowed_names_pass_and_the_server_sees_them(plab):
    needs_resolver(plab)
    sid = named_sandbox(plab)
    got = client(plab, sid, f"tls:pypi.test:{TLS_PORT}:pypi.test",
                 f"tls:files.pythonhosted.test:{TLS_PORT}:files.pythonhosted.test",
                 f"http:pypi.test:{HTTP_PORT}:pypi.test")
    assert got[f"tls:pypi.test:{TLS_PORT}:pypi.test"] == "ok tls-ok pypi.test", got
    assert got[f"tls:files.pythonhosted.test:{TLS_PORT}:files.pythonhosted.test"] == \
        "ok tls-ok files.pythonhosted.test", got
    assert got[f"http:pypi.test:{HTTP_PORT}:pypi.test"] == "ok internet-ok", got
    plab.delete_sandbox(sid)


@pytest.mark.attack(cls="egress",
                    tried="a disallowed TLS SNI or HTTP Host at an allowed address (a shared CDN "
                          "address)")
def test_disallowed_sni_or_host_at_an_allowed_address_is_refused(plab):
    needs_resolver(plab)
    sid = named_sandbox(plab)
    # pypi.test resolves first (INTERNET enters the sandbox's resolved set); then the same
    # address with another name. evil.test itself is not resolvable for this sandbox.
    got = client(plab, sid, "resolve:pypi.test", f"tls:{INTERNET}:{TLS_PORT}:evil.test",
                 f"http:{INTERNET}:{HTTP_PORT}:evil.test",
                 # an allowed name on a port its rule does not list
                 f"tls:{INTERNET}:{HTTP_PORT}:files.pythonhosted.test")
    assert got["resolve:pypi.test"] == f"ok {INTERNET}", got
    for spec, verdict in got.items():
        if not spec.startswith("resolve"):
            assert not verdict.startswith("ok"), got
    assert denied(plab, sid).get("name_not_allowed", 0) >= 3, denied(plab, sid)
    plab.delete_sandbox(sid)


@pytest.mark.attack(cls="egress",
                    tried="an allowed name at an address it did not resolve to for this sandbox")
def test_allowed_name_at_an_address_it_did_not_resolve_to_is_refused(plab):
    needs_resolver(plab)
    sid = named_sandbox(plab)
    # FAR is resolved for mirror.pythonhosted.test only; pypi.test resolved to INTERNET.
    got = client(plab, sid, "resolve:pypi.test", "resolve:mirror.pythonhosted.test",
                 f"tls:{FAR}:{TLS_PORT}:pypi.test",
                 f"tls:{FAR}:{TLS_PORT}:mirror.pythonhosted.test")
    assert got["resolve:mirror.pythonhosted.test"] == f"ok {FAR}", got
    assert not got[f"tls:{FAR}:{TLS_PORT}:pypi.test"].startswith("ok"), got
    assert got[f"tls:{FAR}:{TLS_PORT}:mirror.pythonhosted.test"] == \
        "ok tls-ok mirror.pythonhosted.test", got
    assert denied(plab, sid).get("name_address_mismatch", 0) >= 1, denied(plab, sid)
    plab.delete_sandbox(sid)


@pytest.mark.attack(cls="egress",
                    tried="direct-IP TCP without a name, and UDP/QUIC, under domain rules")
def test_no_name_direct_ip_and_udp_are_refused(plab):
    needs_resolver(plab)
    sid = named_sandbox(plab)
    # Before any lookup: INTERNET is no resolved address of this sandbox (dropped in nft).
    got = client(plab, sid, f"tls:{INTERNET}:{TLS_PORT}:pypi.test")
    assert not got[f"tls:{INTERNET}:{TLS_PORT}:pypi.test"].startswith("ok"), got
    got = client(plab, sid, "resolve:pypi.test", f"raw:{INTERNET}:{TLS_PORT}",
                 f"udp:{INTERNET}:{UDP_PORT}")
    assert not got[f"raw:{INTERNET}:{TLS_PORT}"].startswith("ok"), got
    assert not got[f"udp:{INTERNET}:{UDP_PORT}"].startswith("ok"), got
    counts = denied(plab, sid)
    assert counts.get("no_name", 0) >= 1, counts
    assert counts.get("udp_domain", 0) >= 1, counts
    plab.delete_sandbox(sid)


def test_steered_connections_are_judged_by_the_proxy(plab):
    """Without a lookup in sbxd (NameTable empty): the nft redirect, SO_ORIGINAL_DST, the peek
    and each refusal reason, and a CIDR-allowed destination relayed without a name."""
    sid = named_sandbox(plab)
    steer(plab, sid, INTERNET, FAR)
    got = client(plab, sid,
                 f"http:{INTERNET}:{HTTP_PORT}:pypi.test",   # allowed, but never resolved here
                 f"http:{INTERNET}:{HTTP_PORT}:evil.test",   # not allowed
                 f"http:{INTERNET}:{OTHER_PORT}:pypi.test",  # allowed name, not on this port
                 f"raw:{INTERNET}:{HTTP_PORT}",              # no name at all
                 f"raw:{FAR}:{OTHER_PORT}",                  # the CIDR rule: no name needed
                 f"udp:{INTERNET}:{UDP_PORT}")
    assert got[f"raw:{FAR}:{OTHER_PORT}"].startswith("ok"), got
    for spec, verdict in got.items():
        if spec != f"raw:{FAR}:{OTHER_PORT}":
            assert not verdict.startswith("ok"), got
    counts = denied(plab, sid)
    assert counts.get("name_address_mismatch", 0) >= 1, counts
    assert counts.get("name_not_allowed", 0) >= 2, counts
    assert counts.get("no_name", 0) >= 1, counts
    assert counts.get("udp_domain", 0) >= 1, counts
    plab.delete_sandbox(sid)


def test_unsteered_addresses_are_dropped(plab):
    """An address no lookup answered (a direct-IP connection) never reaches the proxy."""
    sid = named_sandbox(plab)
    got = client(plab, sid, f"http:{INTERNET}:{HTTP_PORT}:pypi.test")
    assert not got[f"http:{INTERNET}:{HTTP_PORT}:pypi.test"].startswith("ok"), got
    counts = denied(plab, sid)
    assert counts.get("not_allowed", 0) + counts.get("unresolved_address", 0) >= 1, counts
    assert counts.get("name_address_mismatch", 0) == 0, counts
    plab.delete_sandbox(sid)

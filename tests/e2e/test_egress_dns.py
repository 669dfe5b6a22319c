"""sbxd's own DNS resolver end to end (issue 16, docs/isolation.md §2.3c), in the lab of netlab.py
(sbxd in a test namespace behind a stand-in internet on the exempted 198.18.0.0/15; nothing
leaves the machine). The stand-in internet runs a DNS server this test controls (it can forge
answers) on 198.18.0.2:53, which sbxd's resolver uses as its upstream."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netlab  # noqa: E402
from netlab import FAR, HTTP_PORT, INTERNET, OTHER_PORT, create  # noqa: E402

PROFILES = f"""
[egress.profiles.names]
description = "two names, a wildcard, and one name the DNS server forges"
allow = [{{domain = "allowed.test", ports = "{HTTP_PORT}"}},
         {{domain = "*.cdn.test", ports = "{HTTP_PORT}"}},
         {{domain = "forged.test", ports = "{HTTP_PORT}"}},
         {{domain = "many.test", ports = "{HTTP_PORT}"}}]
"""

# A DNS server the test controls, run in the stand-in internet (UDP and TCP port 53 on every
# address). Answers from ZONE; names it does not know get NXDOMAIN. Every question it is asked
# is appended to the log file the test names (so a test can see a refused name never left
# sbxd). No dnslib: the few lines of the wire format with struct.
DNS_SERVER = r"""
import socket, socketserver, struct, sys, threading
LOG = "@LOG@"
ZONE = {
    # name: [(type, ttl, value)]; type 1 A, 28 AAAA, 5 CNAME
    "allowed.test": [(1, 300, "198.18.0.2")],
    "www.cdn.test": [(5, 600, "edge.cdn-provider.test")],
    "edge.cdn-provider.test": [(1, 60, "198.19.0.10")],
    # An allowed name pointed at private and metadata addresses beside the real one.
    "forged.test": [(1, 300, "198.18.0.2"), (1, 300, "10.0.0.5"), (1, 300, "169.254.169.254")],
    "other.test": [(1, 300, "198.18.0.2")],
    # 120 addresses: ~3 KB, more than a UDP answer holds (the server truncates it, TC).
    "many.test": [(1, 300, f"198.18.1.{i}") for i in range(1, 121)],
}
UDP_MAX = 1232  # the EDNS payload size sbxd's resolver advertises upstream
def name_of(msg, pos):
    labels = []
    while msg[pos]:
        n = msg[pos]; labels.append(msg[pos + 1:pos + 1 + n].decode()); pos += 1 + n
    return ".".join(labels).lower(), pos + 1
def wire(name):
    return b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
def answer(q):
    qid, flags = struct.unpack("!HH", q[:4])
    name, end = name_of(q, 12)
    qtype, = struct.unpack("!H", q[end:end + 2])
    with open(LOG, "a") as f:
        f.write(f"{name} {qtype}\n")
    question = q[12:end + 4]
    records, cur = [], name
    for _ in range(8):
        rrs = ZONE.get(cur)
        if rrs is None:
            break
        nxt = None
        for t, ttl, v in rrs:
            if t == 5:
                rd = wire(v); nxt = v
            elif t == qtype == 1:
                rd = socket.inet_pton(socket.AF_INET, v)
            elif t == qtype == 28:
                rd = socket.inet_pton(socket.AF_INET6, v)
            else:
                continue
            records.append(wire(cur) + struct.pack("!HHIH", t, 1, ttl, len(rd)) + rd)
        if nxt is None:
            break
        cur = nxt
    rcode = 0 if name in ZONE else 3
    head = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, len(records), 0, 0)
    return head + question + b"".join(records)
class T(socketserver.BaseRequestHandler):
    def handle(self):
        n, = struct.unpack("!H", self.request.recv(2))
        q = self.request.recv(n)
        a = answer(q)
        self.request.sendall(struct.pack("!H", len(a)) + a)
socketserver.ThreadingTCPServer.allow_reuse_address = True
tcp = socketserver.ThreadingTCPServer(("0.0.0.0", 53), T)
threading.Thread(target=tcp.serve_forever, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 53))
print("ready", flush=True)
while True:
    q, addr = u.recvfrom(2048)
    try:
        a = answer(q)
        if len(a) > UDP_MAX:  # as a real server does: TC, the question, no records
            _, end = name_of(q, 12)
            flags, = struct.unpack("!H", a[2:4])
            a = a[:2] + struct.pack("!HHHHH", flags | 0x0200, 1, 0, 0, 0) + q[12:end + 4]
        u.sendto(a, addr)
    except Exception as e:
        print("dns server:", e, file=sys.stderr, flush=True)
"""

# Run inside a sandbox: one probe per argument, printing one line each.
#   "gai:NAME"                  getaddrinfo (glibc, through /etc/resolv.conf): the sorted
#                               IPv4 addresses joined by ",", or the error's name
#   "udp:SERVER:NAME" / "tcp:SERVER:NAME"  one A query sent straight to SERVER port 53: "rcode=N
#                               a=ADDR,ADDR" or the error's name (a timeout: nothing answered)
#   "resolver"                  the first nameserver of /etc/resolv.conf
DNS_PROBE = r"""
import socket, struct, sys
def query(name):
    q = struct.pack("!HHHHHH", 0x5b5b, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    return q + struct.pack("!HH", 1, 1)
def parse(a):
    qid, flags, qd, an = struct.unpack("!HHHH", a[:8])
    pos = 12
    while a[pos]: pos += 1 + a[pos]
    pos += 5
    addrs = []
    for _ in range(an):
        if a[pos] & 0xc0 == 0xc0: pos += 2
        else:
            while a[pos]: pos += 1 + a[pos]
            pos += 1
        t, c, ttl, n = struct.unpack("!HHIH", a[pos:pos + 10]); pos += 10
        if t == 1: addrs.append(socket.inet_ntoa(a[pos:pos + 4]))
        pos += n
    return f"rcode={flags & 15} a={','.join(sorted(addrs))}"
for spec in sys.argv[1:]:
    try:
        kind, _, rest = spec.partition(":")
        if kind == "gai":
            infos = socket.getaddrinfo(rest, 80, socket.AF_INET, socket.SOCK_STREAM)
            out = ",".join(sorted({i[4][0] for i in infos}))
        elif kind == "resolver":
            out = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
        else:
            server, name = rest.split(":")
            if kind == "udp":
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
                s.sendto(query(name), (server, 53)); out = parse(s.recvfrom(4096)[0])
            else:
                s = socket.create_connection((server, 53), timeout=2); s.settimeout(2)
                q = query(name); s.sendall(struct.pack("!H", len(q)) + q)
                n, = struct.unpack("!H", s.recv(2)); a = b""
                while len(a) < n: a += s.recv(n - len(a))
                out = parse(a)
        print(spec, out)
    except Exception as e:
        print(spec, type(e).__name__)
"""


LOG = Path(f"/tmp/sbxt-dns-{secrets.token_hex(3)}.log")


@pytest.fixture(scope="module")
def lab(validator):
    LOG.write_text("")
    try:
        with netlab.lab(validator, PROFILES, ["--egress-dns-upstream", INTERNET],
                        [DNS_SERVER.replace("@LOG@", str(LOG))]) as client:
            yield client
    finally:
        LOG.unlink(missing_ok=True)


@contextlib.contextmanager
def sandbox(api, body: dict):
    """A sandbox deleted however the test ends (the lab refuses leftovers)."""
    sb = create(api, body)
    try:
        yield sb
    finally:
        api.delete_sandbox(sb["id"])


def dns_probe(api, sid: str, *specs: str) -> dict[str, str]:
    r = api.run(sid, ["/usr/bin/python3", "-c", DNS_PROBE, *specs], max_seconds=60)
    out = {}
    for line in r.stdout.decode().splitlines():
        spec, _, verdict = line.partition(" ")
        out[spec] = verdict
    assert set(out) == set(specs), (r.stdout, r.stderr)
    return out


def asked_upstream() -> set[str]:
    return {line.split()[0] for line in LOG.read_text().splitlines() if line.strip()}


def egress(api, sid: str) -> dict:
    return api.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body


def wait_denied(api, sid: str, reason: str) -> dict:
    """The sandbox's egress view once `reason` is counted (sbxd's own counts are immediate,
    nft's are read when asked; a short wait covers both)."""
    deadline = time.monotonic() + 10
    while True:
        eg = egress(api, sid)
        if eg.get("denied", {}).get(reason, 0) > 0 or time.monotonic() > deadline:
            return eg
        time.sleep(0.3)


def test_none_has_no_dns(lab):
    with sandbox(lab, {}) as sb:
        got = dns_probe(lab, sb["id"], "gai:allowed.test", f"udp:{INTERNET}:allowed.test")
        assert got["gai:allowed.test"] in ("gaierror",), got
        assert got[f"udp:{INTERNET}:allowed.test"] != "rcode=0 a=198.18.0.2", got
        assert not got[f"udp:{INTERNET}:allowed.test"].startswith("rcode="), got


@pytest.mark.attack(cls="egress",
                    tried="resolve names the rules do not allow through sbxd's resolver")
def test_allow_list_resolves_exactly_its_names(lab):
    with sandbox(lab, {"egress_profile": "names"}) as sb:
        sid = sb["id"]
        got = dns_probe(lab, sid, "resolver", "gai:allowed.test", "gai:www.cdn.test",
                        "gai:other.test", "gai:cdn.test")
        # resolv.conf names the veth's host end: .1 of the sandbox's /30 in the pool.
        assert got["resolver"].startswith("10.241.0.") and int(got["resolver"].rsplit(".", 1)[1]) % 4 == 1, got
        resolver = got["resolver"]
        assert got["gai:allowed.test"] == INTERNET, got
        # A CNAME chain: the final address, recorded under the name asked.
        assert got["gai:www.cdn.test"] == FAR, got
        assert got["gai:other.test"] == "gaierror", got
        assert got["gai:cdn.test"] == "gaierror", got   # *.cdn.test is not cdn.test itself
        # REFUSED, straight from the resolver, over UDP and TCP; the name never went upstream.
        raw = dns_probe(lab, sid, f"udp:{resolver}:other.test", f"tcp:{resolver}:other.test",
                        f"tcp:{resolver}:allowed.test")
        assert raw[f"udp:{resolver}:other.test"] == "rcode=5 a=", raw
        assert raw[f"tcp:{resolver}:other.test"] == "rcode=5 a=", raw
        assert raw[f"tcp:{resolver}:allowed.test"] == f"rcode=0 a={INTERNET}", raw
        asked = asked_upstream()
        assert "allowed.test" in asked and "www.cdn.test" in asked, asked
        assert "other.test" not in asked and "cdn.test" not in asked, asked
        eg = egress(lab, sid)
        names = [d.get("name") for d in eg["recent_denials"] if d.get("reason") == "dns_name"]
        assert "other.test" in names, eg
        assert eg["denied"].get("dns_name", 0) > 0, eg


def test_an_answer_too_large_for_udp_comes_whole_over_tcp(lab):
    """The upstream truncates (TC) an answer of 120 addresses: sbxd asks again over TCP, and the
    sandbox's resolver (glibc: a 512-byte UDP answer, then TCP to sbxd) gets every address."""
    with sandbox(lab, {"egress_profile": "names"}) as sb:
        got = dns_probe(lab, sb["id"], "gai:many.test")
        want = {f"198.18.1.{i}" for i in range(1, 121)}
        assert set(got["gai:many.test"].split(",")) == want, got
        # Asked at least twice upstream: over UDP (truncated), then over TCP.
        asked = [line.split()[0] for line in LOG.read_text().splitlines() if line.strip()]
        assert asked.count("many.test") >= 2, asked


@pytest.mark.attack(cls="egress",
                    tried="a forged DNS answer pointing an allowed name at private and metadata "
                          "addresses")
def test_forged_answer_to_private_addresses_is_stripped(lab):
    with sandbox(lab, {"egress_profile": "names"}) as sb:
        got = dns_probe(lab, sb["id"], "gai:forged.test")
        # The DNS server answered 198.18.0.2, 10.0.0.5 and 169.254.169.254: only the first is told.
        assert got["gai:forged.test"] == INTERNET, got
        eg = egress(lab, sb["id"])
        stripped = {(d.get("destination"), d.get("reason")) for d in eg["recent_denials"]
                    if d.get("name") == "forged.test"}
        assert ("10.0.0.5", "private") in stripped and ("169.254.169.254", "metadata") in stripped, eg


@pytest.mark.attack(cls="egress",
                    tried="DNS over UDP and TCP to another resolver than sbxd's")
def test_dns_to_another_resolver_is_refused_under_domain_rules(lab):
    with sandbox(lab, {"egress_profile": "names"}) as sb:
        got = dns_probe(lab, sb["id"], f"udp:{INTERNET}:allowed.test", f"tcp:{INTERNET}:allowed.test",
                        f"udp:{FAR}:allowed.test")
        assert all(not v.startswith("rcode=") for v in got.values()), got
        eg = wait_denied(lab, sb["id"], "dns_other")
        assert eg["denied"].get("dns_other", 0) >= 3, eg


@pytest.mark.attack(cls="egress",
                    tried="connect to an address no allowed name resolved to")
def test_unresolved_address_is_dropped_and_counted(lab):
    with sandbox(lab, {"egress_profile": "names"}) as sb:
        # No name resolved to FAR for this sandbox, and no CIDR rule allows it.
        got = netlab.probe(lab, sb["id"], f"tcp:{FAR}:{OTHER_PORT}")
        assert got[f"tcp:{FAR}:{OTHER_PORT}"] != "ok", got
        eg = wait_denied(lab, sb["id"], "unresolved_address")
        assert eg["denied"].get("unresolved_address", 0) > 0, eg


def test_open_resolves_everything_and_other_resolvers_are_just_traffic(lab):
    with sandbox(lab, {"egress_profile": "open"}) as sb:
        got = dns_probe(lab, sb["id"], "gai:other.test", "gai:allowed.test", "gai:forged.test",
                        f"udp:{INTERNET}:other.test")
        assert got["gai:other.test"] == INTERNET, got
        assert got["gai:allowed.test"] == INTERNET, got
        assert got["gai:forged.test"] == INTERNET, got   # stripped for `open` too
        assert got[f"udp:{INTERNET}:other.test"] == f"rcode=0 a={INTERNET}", got


@pytest.mark.attack(cls="egress",
                    tried="reach sbxd's resolver on its real port, past the port-53 redirect")
def test_resolver_port_is_not_reachable_directly(lab):
    with sandbox(lab, {"egress_profile": "open"}) as sb:
        resolver = dns_probe(lab, sb["id"], "resolver")["resolver"]
        # Straight to the resolver's own port (not redirected): the host drops it.
        got = netlab.probe(lab, sb["id"], f"udp:{resolver}:10053", f"tcp:{resolver}:10053")
        assert all(v != "ok" for v in got.values()), got


def test_cli_create_allow_takes_names(lab):
    """`sbx create --egress PROFILE --allow HOST[:PORT]`: the CLI sends domain rules as the API
    takes them, and a name outside the profile is refused by sbxd naming the field."""
    import subprocess
    from conftest import build_dir
    cli = [str(build_dir() / "bin" / "sbx"), "--url", lab.base_url, "--token", lab.token]
    # The test thread is in sbxd's namespace (netlab.lab); the CLI it starts is too.
    out = subprocess.run([*cli, "create", "--egress", "names",
                          "--allow", f"allowed.test:{HTTP_PORT}", "--allow", f"*.cdn.test:{HTTP_PORT}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip()
    lab.created_sandboxes.append(sid)
    try:
        eg = egress(lab, sid)
        assert eg["profile"] == "names", eg
        got = {(r["domain"], str(r.get("ports"))) for r in eg["narrowed"]}
        assert got == {("allowed.test", str(HTTP_PORT)), ("*.cdn.test", str(HTTP_PORT))}, eg
        assert all("cidr" not in r for r in eg["narrowed"]), eg
    finally:
        lab.delete_sandbox(sid)
    wide = subprocess.run([*cli, "create", "--egress", "names", "--allow", "other.test"],
                          capture_output=True, text=True, timeout=120)
    assert wide.returncode != 0 and "egress.allow[0]" in wide.stderr, (wide.returncode, wide.stderr)

"""Egress profiles end to end (issue 16), in the lab of netlab.py (sbxd in a test namespace
behind a stand-in internet on the exempted 198.18.0.0/15; nothing leaves the machine)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netlab  # noqa: E402
from fd_watch import FdWatch  # noqa: E402
from netlab import (FAR, HOST_SERVICE_PORT, HTTP_PORT, INTERNET, OTHER_PORT, POOL4,  # noqa: E402,F401
                    UDP_PORT, UPLINK_HOST, create, probe)
from sbx_client import SbxClient  # noqa: E402,F401

PROFILES = f"""
[egress.profiles.lab]
description = "the stand-in internet's web server only"
allow = [{{cidr = "{INTERNET}/32", ports = "{HTTP_PORT}", protocol = "tcp"}}]
"""


# The stand-in internet's record of datagrams on RECORD_PORT: one "SOURCE PAYLOAD" line each,
# in a file the test reads (same machine, same file system).
RECORD_PORT = 9003
RECORDER = r"""
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", %d))
print("ready", flush=True)
with open(%r, "a", buffering=1) as f:
    while True:
        data, addr = u.recvfrom(512)
        f.write("%%s %%s\n" %% (addr[0], data.decode(errors="replace")))
"""

# Run in a sandbox: argv SPOOF HOST. Tries to send from SPOOF, an address the sandbox does not
# have (IP_FREEBIND binds it without any capability): a datagram to HOST:RECORD_PORT and a TCP
# connect to HOST:HTTP_PORT; then a datagram from its own address, the control. Prints what the
# kernel let out ("udp sent", "tcp ok") or refused ("udp refused ENETUNREACH", "tcp ...").
SPOOFER = r"""
import errno, socket, sys
spoof, host = sys.argv[1], sys.argv[2]
IP_FREEBIND = 15
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
try:
    u.bind((spoof, 0)); u.sendto(b"spoofed", (host, %d)); print("udp sent")
except OSError as e:
    print("udp refused", errno.errorcode.get(e.errno, e.errno))
t = socket.socket(); t.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1); t.settimeout(1.5)
try:
    t.bind((spoof, 0)); t.connect((host, %d)); print("tcp ok")
except OSError as e:
    print("tcp", type(e).__name__)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"genuine", (host, %d))
print("genuine sent")
""" % (RECORD_PORT, HTTP_PORT, RECORD_PORT)


@pytest.fixture(scope="module")
def lab(validator, tmp_path_factory):
    record = tmp_path_factory.mktemp("egress") / "datagrams"
    record.touch()
    with netlab.lab(validator, PROFILES,
                    internet_servers=[RECORDER % (RECORD_PORT, str(record))]) as client:
        client.datagrams = record
        yield client


def test_profiles_are_listed(lab):
    body = lab.call("GET", "/v1/egress-profiles", expect=200).body
    names = [p["name"] for p in body["egress_profiles"]]
    assert names == ["none", "open", "lab"], body
    lab_profile = body["egress_profiles"][2]
    assert lab_profile["description"] == "the stand-in internet's web server only"


def test_none_reaches_nothing(lab):
    sb = create(lab, {})
    assert sb["egress_profile"] == "none"
    got = probe(lab, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}", f"udp:{INTERNET}:{UDP_PORT}",
                f"tcp:{UPLINK_HOST}:{HOST_SERVICE_PORT}")
    assert all(v != "ok" for v in got.values()), got
    eg = lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200).body
    assert eg["profile"] == "none" and eg["rules"] == [], eg
    lab.delete_sandbox(sb["id"])


@pytest.mark.attack(cls="egress",
                    tried="from an open sandbox: sbxd's namespace and a host service, the host "
                          "ends of veths, its own loopback, the metadata address, other "
                          "sandboxes, a private range")
def test_open_reaches_the_internet_and_nothing_blocked(lab):
    a = create(lab, {"egress_profile": "open"})
    b = create(lab, {"egress_profile": "open"})
    # b's address: the pool hands out /30s in order, the sandbox end is .2 of its slot.
    eg_b = lab.call("GET", f"/v1/sandboxes/{b['id']}/egress", expect=200).body
    assert eg_b["profile"] == "open"
    got = probe(lab, a["id"], f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{FAR}:{OTHER_PORT}",
                f"udp:{INTERNET}:{UDP_PORT}")
    assert all(v == "ok" for v in got.values()), got
    pool_hosts = [f"10.241.0.{4 * s + 1}" for s in range(4)]
    pool_sandboxes = [f"10.241.0.{4 * s + 2}" for s in range(4)]
    blocked = [f"tcp:{UPLINK_HOST}:{HOST_SERVICE_PORT}",   # sbxd's namespace, a host service
               f"tcp:{pool_hosts[0]}:{HOST_SERVICE_PORT}",  # the host end of a veth
               f"tcp:{pool_hosts[1]}:{HOST_SERVICE_PORT}",
               "tcp:127.0.0.1:7999",                          # its own loopback: nothing there
               "tcp:169.254.169.254:80",                      # metadata
               f"tcp:{pool_sandboxes[0]}:{HTTP_PORT}",        # a sandbox (a or b)
               f"tcp:{pool_sandboxes[1]}:{HTTP_PORT}",
               "tcp:10.0.0.1:80"]                             # private, not exempt
    got = probe(lab, a["id"], *blocked)
    assert all(v != "ok" for v in got.values()), got
    eg = lab.call("GET", f"/v1/sandboxes/{a['id']}/egress", expect=200).body
    denied = eg["denied"]
    for reason in ("host", "metadata", "other_sandbox", "private"):
        assert denied.get(reason, 0) > 0, (reason, eg)
    # The same denials in the metrics, by sandbox and under the same reasons (sbxd reads the
    # counters every 5 s).
    want = {f'sbx_egress_denied_total{{sandbox="{a["id"]}",reason="{reason}"}}'
            for reason in ("host", "metadata", "other_sandbox", "private")}
    deadline = time.monotonic() + 15
    while True:
        text = lab.call("GET", "/metrics", expect=200).content.decode()
        got_series = {l.split()[0]: float(l.split()[-1]) for l in text.splitlines()
                      if l.startswith("sbx_egress_denied_total{")}
        if want <= got_series.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert want <= got_series.keys(), [l for l in text.splitlines() if "egress" in l]
    assert all(got_series[k] > 0 for k in want), got_series
    lab.delete_sandbox(a["id"])
    lab.delete_sandbox(b["id"])


@pytest.mark.attack(cls="egress",
                    tried="reach an address, port and UDP service an allow-list does not list")
def test_allow_list_reaches_exactly_its_rules(lab):
    sb = create(lab, {"egress_profile": "lab"})
    got = probe(lab, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{INTERNET}:{OTHER_PORT}",
                f"tcp:{FAR}:{HTTP_PORT}", f"udp:{INTERNET}:{UDP_PORT}")
    assert got[f"tcp:{INTERNET}:{HTTP_PORT}"] == "ok", got
    assert all(v != "ok" for k, v in got.items() if k != f"tcp:{INTERNET}:{HTTP_PORT}"), got
    eg = lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200).body
    assert eg["denied"]["not_allowed"] > 0, eg
    lab.delete_sandbox(sb["id"])


@pytest.mark.attack(cls="egress",
                    tried="send from a forged source address (IP_FREEBIND, no capability): "
                          "another pool address and an internet address, UDP and TCP")
def test_spoofed_sources_are_dropped(lab):
    """A sandbox has no CAP_NET_RAW or CAP_NET_ADMIN, so the kernel refuses to route a packet
    from an address it does not have (ENETUNREACH, even bound with IP_FREEBIND); the veth's
    source check in sbxd's nftables (reason `spoofed`, net_egress_root_test) is the second line,
    for a packet that would get out anyway. Either way, none reaches the stand-in internet."""
    sb = create(lab, {"egress_profile": "open"})
    try:
        for spoof in ("10.241.0.250", FAR):
            r = lab.run(sb["id"], ["/usr/bin/python3", "-c", SPOOFER, spoof, INTERNET],
                        max_seconds=60)
            out = r.stdout.decode()
            assert "genuine sent" in out, (out, r.stderr)
            assert "tcp ok" not in out, out
            if "udp sent" in out:  # the kernel let it out: nftables must have counted it
                eg = lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200).body
                assert eg["denied"].get("spoofed", 0) > 0, (out, eg)
        # The genuine datagrams arrive (the path is open); no forged one does. Bounded wait.
        deadline = time.monotonic() + 10
        while lab.datagrams.read_text().count("genuine") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = lab.datagrams.read_text()
        assert seen.count("genuine") == 2, seen
        assert "spoofed" not in seen, seen
    finally:
        lab.delete_sandbox(sb["id"])


def test_nothing_sbxd_holds_with_egress_is_inheritable(lab):
    """With egress on, sbxd holds libnftables' netlink socket for its whole life (made without
    SOCK_CLOEXEC by the library; net/nft.cc marks it) and its own netlink, conntrack and
    resolver sockets: none is inheritable, looked at all along a create, a flow out and a
    delete (fd_watch.py; test_descriptors.py does the same without egress)."""
    with FdWatch(lab.daemon_pid) as watch:
        sb = create(lab, {"egress_profile": "open"})
        try:
            assert probe(lab, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}") == {
                f"tcp:{INTERNET}:{HTTP_PORT}": "ok"}
            lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200)
        finally:
            lab.delete_sandbox(sb["id"])
    assert watch.samples > 0, "no look at sbxd's descriptors"
    assert sorted(watch.seen) == [], f"inheritable descriptors in sbxd ({watch.samples} looks)"


def test_narrowing_at_create_and_widening_refused(lab):
    narrow = {"allow": [{"cidr": f"{FAR}/32", "ports": str(HTTP_PORT), "protocol": "tcp"}]}
    sb = create(lab, {"egress_profile": "open", "egress": narrow})
    got = probe(lab, sb["id"], f"tcp:{FAR}:{HTTP_PORT}", f"tcp:{INTERNET}:{HTTP_PORT}",
                f"tcp:{FAR}:{OTHER_PORT}")
    assert got == {f"tcp:{FAR}:{HTTP_PORT}": "ok",
                   f"tcp:{INTERNET}:{HTTP_PORT}": got[f"tcp:{INTERNET}:{HTTP_PORT}"],
                   f"tcp:{FAR}:{OTHER_PORT}": got[f"tcp:{FAR}:{OTHER_PORT}"]}, got
    assert got[f"tcp:{INTERNET}:{HTTP_PORT}"] != "ok" and got[f"tcp:{FAR}:{OTHER_PORT}"] != "ok", got
    eg = lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200).body
    assert eg["narrowed"] == [{"cidr": f"{FAR}/32", "ports": str(HTTP_PORT), "protocol": "tcp"}] or \
        eg["narrowed"][0]["cidr"] == f"{FAR}/32", eg
    lab.delete_sandbox(sb["id"])

    before = {s["id"] for s in lab.list_sandboxes()}
    for body, field in [
        ({"egress_profile": "lab", "egress": {"allow": [{"cidr": "198.18.0.0/16"}]}}, "egress"),
        ({"egress_profile": "nope"}, "egress_profile"),
        ({"egress_profile": "none", "egress": {"allow": [{"cidr": f"{FAR}/32"}]}}, "egress"),
        ({"egress_profile": "open", "egress": {"allow": [{"cidr": "1.2.3.4/32", "ports": "70000"}]}},
         "egress"),
    ]:
        r = lab.call("POST", "/v1/sandboxes", json_body=body, expect=400)
        assert r.body["error"]["details"]["field"] == field, (body, r.body)
    # Nothing half-created.
    assert {s["id"] for s in lab.list_sandboxes()} == before


@pytest.mark.attack(cls="egress",
                    tried="direct-IP TCP and UDP under a domain rule, even to the name's own "
                          "address")
def test_domain_rules_narrow_open_and_admit_nothing_by_address(lab):
    """A domain rule admits connections only by name (sbxd's resolver and Host/SNI check): an
    address alone, even the one the name would resolve to, reaches nothing through it."""
    narrow = {"allow": [{"domain": "www.example.org", "ports": HTTP_PORT}]}
    sb = create(lab, {"egress_profile": "open", "egress": narrow})
    got = probe(lab, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}", f"udp:{INTERNET}:{UDP_PORT}")
    assert all(v != "ok" for v in got.values()), got
    eg = lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200).body
    assert eg["narrowed"] == [{"domain": "www.example.org", "ports": str(HTTP_PORT),
                               "protocol": "tcp"}], eg
    lab.delete_sandbox(sb["id"])
    # `lab` allows one address: a name may resolve anywhere, so no domain lies within it.
    before = {s["id"] for s in lab.list_sandboxes()}
    for body, needle in [
        ({"egress_profile": "lab", "egress": {"allow": [{"domain": "www.example.org"}]}},
         "egress.allow[0]"),
        ({"egress_profile": "open", "egress": {"allow": [{"domain": "x.org", "protocol": "udp"}]}},
         "egress.allow[0].protocol"),
        ({"egress_profile": "open", "egress": {"allow": [{"domain": "*.*.org"}]}},
         "egress.allow[0].domain"),
    ]:
        r = lab.call("POST", "/v1/sandboxes", json_body=body, expect=400)
        assert needle in r.body["error"]["message"], (body, r.body)
    assert {s["id"] for s in lab.list_sandboxes()} == before


@pytest.mark.attack(cls="tenancy",
                    tried="a tenant allowed only `lab` asks for `open` (create, build, listing); a "
                          "tenant allowed nothing but `none` asks for `lab`")
def test_a_tenant_uses_only_the_egress_profiles_it_is_given(lab):
    def tenant(name, profiles):
        t = lab.call("POST", "/v1/admin/tenants",
                     json_body={"name": name, "egress_profiles": profiles}, expect=201).body["tenant"]
        assert t["egress_profiles"] == profiles, t
        tok = lab.call("POST", f"/v1/admin/tenants/{t['id']}/tokens",
                       json_body={"name": "t", "scopes": ["read", "sandboxes", "sessions", "templates"]},
                       expect=201).body["token"]["token"]
        c = SbxClient(lab.base_url, tok, lab.validator)
        c.created_sandboxes = lab.created_sandboxes  # the lab's cleanup checks them
        return t["id"], c

    lab_only_id, lab_only = tenant("lab-only", ["lab"])
    nothing_id, nothing = tenant("nothing", [])
    try:
        # What each is offered: its own list, and `none`.
        names = lambda c: [p["name"] for p in c.call("GET", "/v1/egress-profiles", expect=200)
                           .body["egress_profiles"]]
        assert names(lab_only) == ["none", "lab"]
        assert names(nothing) == ["none"]
        assert names(lab) == ["none", "open", "lab"]
        # A profile it is not given is refused as one the deployment lacks, listing only its own.
        for c, profile, available in ((lab_only, "open", "lab, none"), (nothing, "lab", "none"),
                                      (nothing, "open", "none")):
            r = c.call("POST", "/v1/sandboxes", json_body={"egress_profile": profile}, expect=400)
            err = r.body["error"]
            assert err["details"]["field"] == "egress_profile", err
            assert f"unknown profile '{profile}' (available: {available})" in err["message"], err
            r = c.call("POST", "/v1/templates", json_body={
                "name": "b", "source": {"build": {"dockerfile": "FROM x\n",
                                                  "sandbox": {"egress_profile": profile}}}},
                expect=400)
            assert r.body["error"]["details"]["field"] == "source.build.sandbox.egress_profile", r.body
        assert lab_only.call("GET", "/v1/sandboxes", expect=200).body["sandboxes"] == []
        # What it is given works, to the byte of its rules.
        sb = create(lab_only, {"egress_profile": "lab"})
        got = probe(lab_only, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{FAR}:{OTHER_PORT}")
        assert got[f"tcp:{INTERNET}:{HTTP_PORT}"] == "ok" and got[f"tcp:{FAR}:{OTHER_PORT}"] != "ok", got
        sb_none = create(nothing, {})
        assert sb_none["egress_profile"] == "none"
        # Taken away: new creates are refused, the running sandbox keeps what it had.
        lab.call("PATCH", f"/v1/admin/tenants/{lab_only_id}", json_body={"egress_profiles": []},
                 expect=200)
        lab_only.call("POST", "/v1/sandboxes", json_body={"egress_profile": "lab"}, expect=400)
        assert probe(lab_only, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}")[f"tcp:{INTERNET}:{HTTP_PORT}"] == "ok"
        # Given back in full (null: every profile).
        lab.call("PATCH", f"/v1/admin/tenants/{lab_only_id}", json_body={"egress_profiles": None},
                 expect=200)
        assert names(lab_only) == ["none", "open", "lab"]
        lab_only.delete_sandbox(sb["id"])
        nothing.delete_sandbox(sb_none["id"])
    finally:
        for t in (lab_only_id, nothing_id):
            lab.call("DELETE", f"/v1/admin/tenants/{t}", expect=(202, 404))
        lab_only.close()
        nothing.close()


def test_a_microvm_gets_the_same_rules_through_its_tap(lab):
    """The microvm runtime's NIC is a tap in the place of a veth's host end (docs/microvm.md,
    "Networking"): the same profile admits and refuses the same traffic, names resolve through
    sbxd's resolver, and a port is reached on the guest's own address."""
    mv = next(r for r in lab.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
    if not mv["available"]:
        from conftest import skip_or_fail
        skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
    assert mv["capabilities"]["egress_policy"] is True, mv
    sb = lab.create_sandbox({"runtime": "microvm", "egress_profile": "lab", "resources": {"memory_mib": 256}},
                            timeout=300)["sandbox"]
    sid = sb["id"]
    got = probe(lab, sid, f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{FAR}:{OTHER_PORT}",
                f"tcp:{UPLINK_HOST}:{HOST_SERVICE_PORT}", "tcp:169.254.169.254:80")
    assert got[f"tcp:{INTERNET}:{HTTP_PORT}"] == "ok", got
    assert all(v != "ok" for k, v in got.items() if k != f"tcp:{INTERNET}:{HTTP_PORT}"), got
    eg = lab.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body
    assert eg["profile"] == "lab" and eg["denied"].get("metadata", 0) > 0, eg
    r = lab.run(sid, ["sh", "-c", "cat /etc/resolv.conf; ip -brief addr 2>/dev/null || cat /proc/net/if_inet6"])
    assert b"nameserver" in r.stdout, r
    # A server in the VM on the wildcard address, reached through sbxd's port route.
    from port_helpers import start_server
    import requests
    start_server(lab, sid, 8000, "0.0.0.0")
    resp = requests.get(f"{lab.base_url}/v1/sandboxes/{sid}/ports/8000/headers",
                        headers={"X-Sbx-Traffic-Token": sb["traffic_token"]}, timeout=60)
    assert resp.status_code == 200, (resp.status_code, resp.text[:300])
    lab.delete_sandbox(sid)

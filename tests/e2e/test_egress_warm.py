"""Networked creates served by the warm pool (issue 16, Performance: "warm pool hits for networked
profiles too"). With egress on, each warm pool has a network-ready twin (egress.warm_pool): its
members run on a veth no sandbox has claimed (no nftables elements: nothing passes), and a
networked create takes one and gets its rules there and then (Instance::AttachEgress). Runs in
netlab.py's lab (sbxd in a namespace the test makes, a stand-in internet behind it with a DNS
server the test controls; nothing leaves the machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

import netlab  # noqa: E402
from netlab import HTTP_PORT, INTERNET, OTHER_PORT, UDP_PORT, probe  # noqa: E402
from test_egress_dns import DNS_SERVER, dns_probe  # noqa: E402
from test_egress_pool import veth_aliases  # noqa: E402

PROFILES = f"""
[egress.profiles.lab]
description = "the stand-in internet's web server only"
allow = [{{cidr = "{INTERNET}/32", ports = "{HTTP_PORT}", protocol = "tcp"}}]

[egress.profiles.names]
description = "one name"
allow = [{{domain = "allowed.test", ports = "{HTTP_PORT}"}}]
"""

LOG = Path(f"/tmp/sbxt-dnsw-{secrets.token_hex(3)}.log")
NET_POOL = 2
REFILL_S = 60


@pytest.fixture(scope="module")
def lab(validator):
    LOG.write_text("")
    try:
        with netlab.lab(validator, PROFILES,
                        ["--egress-dns-upstream", INTERNET, "--warm-pool", "base=1",
                         "--egress-warm-pool", str(NET_POOL)],
                        [DNS_SERVER.replace("@LOG@", str(LOG))]) as client:
            yield client
    finally:
        LOG.unlink(missing_ok=True)


def ready(api, egress: str) -> float:
    text = api.call("GET", "/metrics", validate=False, expect=200).text
    for line in text.splitlines():
        if line.startswith("sbx_warm_pool_ready{") and f'egress="{egress}"' in line:
            return float(line.split()[-1])
    return -1.0


def wait_ready(api, egress: str, n: int) -> None:
    deadline = time.monotonic() + REFILL_S
    while ready(api, egress) < n:
        assert time.monotonic() < deadline, f"the {egress} pool did not reach {n}"
        time.sleep(0.2)


@contextlib.contextmanager
def sandbox(api, body: dict, *, warm: bool):
    """A sandbox deleted however the test ends; `warm`: the create must (not) be a pool hit."""
    created = api.create_sandbox(body, wait=False)
    sid = created["sandbox"]["id"]
    try:
        if warm:
            assert created["operation"]["result"] == {"warm_pool": True}, created["operation"]
            assert created["sandbox"]["state"] == "running", created["sandbox"]
        else:
            assert created["operation"]["result"] is None, created["operation"]
            op = api.wait_operation(created["operation"]["id"])
            assert op["state"] == "succeeded", op
        yield api.get_sandbox(sid)
    finally:
        api.delete_sandbox(sid)


def nft_veths() -> str:
    """sbx's per-sandbox sets and map as nft lists them (veth names in them): libnftables
    through ctypes (no nft command here); this thread is in sbxd's namespace."""
    lib = ctypes.CDLL("libnftables.so.1")
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    out = []
    for cmd in ("list set inet sbx own4", "list set inet sbx own6", "list map inet sbx profile_of",
                "list set inet sbx deny_not_allowed"):
        ctx = lib.nft_ctx_new(0)
        try:
            lib.nft_ctx_buffer_output(ctx)
            assert lib.nft_run_cmd_from_buffer(ctx, cmd.encode()) == 0, cmd
            out.append((lib.nft_ctx_get_output_buffer(ctx) or b"").decode())
        finally:
            lib.nft_ctx_free(ctx)
    return "\n".join(out)


def test_networked_create_is_a_warm_hit_with_exactly_its_rules(lab):
    wait_ready(lab, "networked", NET_POOL)
    pooled = {n for n, a in veth_aliases().items() if a.startswith("pooled_")}
    with sandbox(lab, {"egress_profile": "lab"}, warm=True) as sb:
        sid = sb["id"]
        # Its veth was built ahead (a pooled one) and carries its id now.
        mine = [n for n, a in veth_aliases().items() if a == sid]
        assert len(mine) == 1 and mine[0] in pooled, (mine, pooled)
        eg = lab.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body
        assert eg["profile"] == "lab", eg
        got = probe(lab, sid, f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{INTERNET}:{OTHER_PORT}",
                    f"udp:{INTERNET}:{UDP_PORT}")
        assert got[f"tcp:{INTERNET}:{HTTP_PORT}"] == "ok", got
        assert got[f"tcp:{INTERNET}:{OTHER_PORT}"] != "ok", got
        assert got[f"udp:{INTERNET}:{UDP_PORT}"] != "ok", got
        deadline = time.monotonic() + 10
        while lab.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body["denied"].get(
                "not_allowed", 0) == 0:
            assert time.monotonic() < deadline, "the refusals were not counted"
            time.sleep(0.2)
        assert mine[0] in nft_veths()
    # Deleted: its veth and its nftables elements are gone.
    assert mine[0] not in veth_aliases()
    assert f'"{mine[0]}"' not in nft_veths()
    # The pool refills.
    wait_ready(lab, "networked", NET_POOL)


def test_warm_dns_answers_as_a_cold_ones(lab):
    wait_ready(lab, "networked", NET_POOL)
    specs = ("resolver", "gai:allowed.test", "gai:other.test")
    with sandbox(lab, {"egress_profile": "names"}, warm=True) as warm_sb:
        warm = dns_probe(lab, warm_sb["id"], *specs)
    # Cold: non-default resources are never served by the pool.
    with sandbox(lab, {"egress_profile": "names", "resources": {"memory_mib": 256}},
                 warm=False) as cold_sb:
        cold = dns_probe(lab, cold_sb["id"], *specs)
    assert warm["gai:allowed.test"] == cold["gai:allowed.test"] == INTERNET, (warm, cold)
    assert warm["gai:other.test"] == cold["gai:other.test"] != INTERNET, (warm, cold)
    # Each names its own veth's host end, an address of the egress pool.
    assert warm["resolver"].startswith("10.241.0.") and cold["resolver"].startswith("10.241.0."), (
        warm, cold)


def test_none_create_from_the_same_pool_reaches_nothing(lab):
    wait_ready(lab, "none", 1)
    wait_ready(lab, "networked", NET_POOL)
    before = {n for n, a in veth_aliases().items() if a.startswith("pooled_")}
    with sandbox(lab, {}, warm=True) as sb:
        sid = sb["id"]
        assert not [n for n, a in veth_aliases().items() if a == sid]
        got = probe(lab, sid, f"tcp:{INTERNET}:{HTTP_PORT}", f"udp:{INTERNET}:{UDP_PORT}")
        assert all(v != "ok" for v in got.values()), got
        r = lab.run(sid, ["/usr/bin/python3", "-c",
                          "import socket; print(' '.join(n for _, n in socket.if_nameindex()))"])
        assert r.stdout.decode().split() == ["lo"], r.stdout
        assert dns_probe(lab, sid, "gai:allowed.test")["gai:allowed.test"] != INTERNET
        # No network-ready member was used for it.
        assert {n for n, a in veth_aliases().items() if a.startswith("pooled_")} >= before


def test_a_warm_networked_sandbox_keeps_its_rules_across_a_restart(validator):
    """Adopted after an sbxd restart (SIGTERM: sandboxes keep running), a sandbox the networked
    pool served has the rules its create gave it, by the record its claim wrote; its delete then
    leaves no veth or nftables element. A lab of its own: the restart moves sbxd's port."""
    with netlab.lab(validator, PROFILES, ["--warm-pool", "base=1", "--egress-warm-pool", "1"]) as api:
        wait_ready(api, "networked", 1)
        created = api.create_sandbox({"egress_profile": "lab"}, wait=False)
        assert created["operation"]["result"] == {"warm_pool": True}, created["operation"]
        sid = created["sandbox"]["id"]
        mine = [n for n, a in veth_aliases().items() if a == sid]
        assert len(mine) == 1, veth_aliases()
        again = api.restart()
        assert again.get_sandbox(sid)["state"] == "running"
        assert again.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body["profile"] == "lab"
        got = probe(again, sid, f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{INTERNET}:{OTHER_PORT}")
        assert got[f"tcp:{INTERNET}:{HTTP_PORT}"] == "ok", got
        assert got[f"tcp:{INTERNET}:{OTHER_PORT}"] != "ok", got
        again.delete_sandbox(sid)
        assert mine[0] not in veth_aliases()
        assert f'"{mine[0]}"' not in nft_veths()

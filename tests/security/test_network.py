"""The network: sbxd's API and host loopback services from inside, raw sockets, configuration."""

from __future__ import annotations

import secrets
import socket

import pytest

from secutil import attack, run_script, sh


@pytest.fixture(scope="module")
def network_attack(sclient, target, sbxd):
    port = int(sbxd.url.rsplit(":", 1)[1])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = "sbxsec-" + secrets.token_hex(6)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        abstract.bind("\0" + name)
        abstract.listen(8)
        abstract.setblocking(False)
        out = run_script(sclient, target["id"], "network", port, listener.getsockname()[1], name)[1]
        accepted = []
        for s in (listener, abstract):
            try:
                accepted.append(s.accept()[0])
            except BlockingIOError:
                pass
        for c in accepted:
            c.close()
        return out, len(accepted)
    finally:
        listener.close()
        abstract.close()


@pytest.mark.parametrize("key", ["sbxd_v4", "sbxd_v6"])
@attack("network", "connect to sbxd's API port on 127.0.0.1 and ::1")
def test_sbxd_api_unreachable(network_attack, key):
    out, accepted = network_attack
    assert out[key] == "ECONNREFUSED", f"{key}: expected ECONNREFUSED, got {out[key]}"


@pytest.mark.parametrize("key", ["listener_v4", "listener_v4_other_loopback", "abstract_unix"])
@attack("network", "connect to a TCP listener on host 127.0.0.1 (and via 127.0.0.2) and to a host "
                   "abstract unix socket")
def test_host_listeners_unreachable(network_attack, key):
    out, accepted = network_attack
    assert out[key] == "ECONNREFUSED", f"{key}: expected ECONNREFUSED, got {out[key]}"
    assert accepted == 0, "a host listener accepted a connection from the sandbox"


@attack("network", "look for an interface or route out of the sandbox (/proc/net/dev, /proc/net/route)")
def test_only_loopback(network_attack):
    out, _ = network_attack
    assert out["interfaces"] == ["lo"], f"interfaces besides lo: {out['interfaces']}"
    assert out["ipv4_routes"] == [], f"IPv4 routes in the sandbox: {out['ipv4_routes']}"
    assert out["ipv6_routes_not_lo"] == [], f"IPv6 routes not on lo: {out['ipv6_routes_not_lo']}"


@attack("network", "take lo down, add an address, add a default route (SIOCSIFFLAGS, SIOCSIFADDR, "
                   "SIOCADDRT) as sandbox root")
def test_network_config_denied(sclient, target):
    # The network namespace belongs to the host's user namespace: sandbox root's capabilities
    # do not count in it.
    out = run_script(sclient, target["id"], "net_admin")[1]
    for key in ("lo_down", "add_address", "add_default_route"):
        assert out[key] == "EPERM", f"{key}: expected EPERM, got {out[key]}"
    assert out["ipv4_routes"] == [], f"a route appeared: {out['ipv4_routes']}"
    res = sh(sclient, target["id"], "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); "
                                    "s.listen(); socket.create_connection(s.getsockname()); print('lo ok')\"")
    assert res.stdout == b"lo ok\n", (res.stdout, res.stderr)


@pytest.fixture(scope="module")
def socket_attack(sclient, target):
    return run_script(sclient, target["id"], "sockets")[1]


@pytest.mark.parametrize("key", ["af_packet_raw", "af_packet_dgram", "af_inet_raw_icmp", "af_inet_raw_raw",
                                 "af_inet6_raw"])
@attack("raw-socket", "open AF_PACKET and AF_INET/AF_INET6 SOCK_RAW sockets (sniff or forge traffic)")
def test_raw_sockets(socket_attack, key):
    assert socket_attack[key] == "EPERM", f"{key}: expected EPERM, got {socket_attack[key]}"


@pytest.mark.parametrize("key", ["ip_link_add", "ip_addr_add", "ip_route_add"])
@attack("network", "configure the network namespace: ip link add, ip addr add, ip route add")
def test_network_config(socket_attack, key):
    # ip(8) exits 2 when the kernel refuses the request (here: no CAP_NET_ADMIN, EPERM).
    assert socket_attack[key] == 2, f"{key}: ip exited {socket_attack[key]}"

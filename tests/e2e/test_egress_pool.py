"""Networked creates served from the netns pool (issue 16, Performance): the pool keeps network
namespaces whose veth, addresses and routes are built ahead (no nftables elements: they pass
nothing), and a networked create claims one. Runs in netlab.py's lab (sbxd in a namespace
the test makes, a stand-in internet behind it; nothing leaves the machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

import netlab  # noqa: E402
from netlab import HTTP_PORT, INTERNET, OTHER_PORT, create, probe  # noqa: E402,F401
from test_egress import PROFILES  # noqa: E402


@pytest.fixture(scope="module")
def lab(validator):
    with netlab.lab(validator, PROFILES) as client:
        yield client

# A TCP connect from the namespace it runs in: prints "ok" or the error's name.
CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close(); print("ok")
except Exception as e:
    print(type(e).__name__)
"""


def sbxd_pid(api) -> int:
    """sbxd's PID: of the processes holding the API's listening socket in this (the lab's)
    namespace, the one whose parent is none of them. sbxd's short-lived clones hold the
    socket too (a launch child copies sbxd's descriptors until it closes them; a user
    namespace's holder shares sbxd's table until its maps are written), and `ss` may name one
    of them first."""
    port = int(api.base_url.rsplit(":", 1)[1].split("/")[0])
    out = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    assert pids, out

    def parent(pid: int) -> int:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return -1  # gone meanwhile: a clone that was killed
        m = re.search(r"^PPid:\s+(\d+)", status, re.M)
        return int(m.group(1)) if m else -1

    parents = {p: parent(p) for p in pids}
    roots = [p for p, pp in parents.items() if pp not in pids and pp != -1]
    assert len(roots) == 1, (out, roots)
    return roots[0]


def veth_aliases() -> dict[str, str]:
    """sbx's veths in the lab's namespace (this thread is in it): name -> alias."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    links = {}
    for line in out.splitlines():
        m = re.match(r"\d+: (sbxv[0-9a-f]+)@", line)
        if m:
            alias = re.search(r"alias (\S+)", line)
            links[m.group(1)] = alias.group(1) if alias else ""
    return links


def wait_pooled(minimum: int) -> dict[str, str]:
    deadline = time.monotonic() + 20
    while True:
        pooled = {n: a for n, a in veth_aliases().items() if a.startswith("pooled_")}
        if len(pooled) >= minimum or time.monotonic() > deadline:
            return pooled
        time.sleep(0.1)


def test_networked_create_from_the_pool_reaches_exactly_its_rules(lab):
    # The first networked create starts the pool's networked filler (after the start-up sweep).
    first = create(lab, {"egress_profile": "lab"})
    pooled = wait_pooled(1)
    assert pooled, veth_aliases()
    for name, alias in pooled.items():
        assert alias == f"pooled_{name}"

    # An unclaimed pooled veth passes nothing: enter each pooled namespace sbxd holds (by its
    # fd) that has an eth0, and try the destination the lab profile allows.
    pid = sbxd_pid(lab)
    tried = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if not os.readlink(path).startswith("net:["):
                continue
        except OSError:
            continue
        links = subprocess.run(["nsenter", f"--net={path}", "ip", "-o", "link", "show", "eth0"],
                               capture_output=True, text=True)
        if links.returncode != 0:
            continue  # a loopback-only namespace, or the fd went meanwhile
        r = subprocess.run(["nsenter", f"--net={path}", "/usr/bin/python3", "-c", CONNECT,
                            INTERNET, str(HTTP_PORT)], capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() != "ok", (path, r.stdout, r.stderr)
        tried += 1
    assert tried >= 1, "no pooled networked namespace found in sbxd"

    sb = create(lab, {"egress_profile": "lab"})
    after = veth_aliases()
    claimed = [n for n, a in after.items() if a == sb["id"]]
    assert len(claimed) == 1, after
    assert claimed[0] in pooled, (claimed, pooled)  # built ahead, not at create
    got = probe(lab, sb["id"], f"tcp:{INTERNET}:{HTTP_PORT}", f"tcp:{INTERNET}:{OTHER_PORT}")
    assert got == {f"tcp:{INTERNET}:{HTTP_PORT}": "ok",
                   f"tcp:{INTERNET}:{OTHER_PORT}": got[f"tcp:{INTERNET}:{OTHER_PORT}"]}, got
    assert got[f"tcp:{INTERNET}:{OTHER_PORT}"] != "ok", got
    eg = lab.call("GET", f"/v1/sandboxes/{sb['id']}/egress", expect=200).body
    assert eg["denied"]["not_allowed"] > 0, eg
    for s in (first, sb):
        lab.delete_sandbox(s["id"])
    # Deleted: its veth is gone; the pool's own stay.
    assert claimed[0] not in veth_aliases()

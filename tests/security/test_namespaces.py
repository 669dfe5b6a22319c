"""Namespaces: making or joining them from inside, and the ones the sandbox must live in (user
namespace with a per-sandbox uid range, time namespace)."""

from __future__ import annotations

import os
import secrets

import pytest

import secutil
from secutil import attack, run_script

USERNS_MIN_BASE = 524288
# 65535: the last uid of the 65536 claimed is the agent's, never mapped inside (userns.h).
USERNS_SIZE = 65535


@pytest.fixture(scope="module")
def ns_attack(sclient, target):
    return run_script(sclient, target["id"], "ns_escape")[1]


@pytest.mark.parametrize("key", ["unshare_user", "unshare_mnt", "unshare_net", "setns_net_agent", "setns_mnt_self",
                                 "clone_newuser", "clone_newns", "clone_newpid"])
@attack("namespaces", "unshare(CLONE_NEWUSER/NEWNS/NEWNET), setns into the agent's and its own "
                      "namespaces, clone(CLONE_NEWUSER/NEWNS/NEWPID)")
def test_namespace_calls_denied(ns_attack, key):
    assert ns_attack[key] == "EPERM", f"{key}: expected EPERM, got {ns_attack[key]}"
    if key == "setns_net_agent":
        # The agent is not dumpable: even a handle on its namespaces is refused.
        assert ns_attack["open_agent_netns"] == "EACCES", ns_attack["open_agent_netns"]


@attack("namespaces", "clone3(CLONE_NEWUSER), whose flags a classic BPF filter cannot inspect")
def test_clone3(ns_attack):
    # The filter answers clone3 with ENOSYS so that libc falls back to clone, which it checks.
    assert ns_attack["clone3_newuser"] == "ENOSYS", ns_attack["clone3_newuser"]


@attack("namespaces", "unshare -U -r (the util-linux command)")
def test_unshare_command(ns_attack):
    assert ns_attack["unshare_cmd_exit"] == 1, f"unshare -U -r exited {ns_attack['unshare_cmd_exit']}"


@pytest.fixture(scope="module")
def identities(sclient, target, bystander):
    name = "sbxsec-owner-" + secrets.token_hex(4)
    mine = run_script(sclient, target["id"], "identity", name)[1]
    other = run_script(sclient, bystander["sandbox"]["id"], "identity")[1]
    return mine, other, name


@attack("userns", "sandbox root is host root unless a user namespace maps it to an unprivileged "
                  "per-sandbox uid range")
def test_user_namespace_maps(identities):
    mine, other, _ = identities
    for who, ident in (("target", mine), ("bystander", other)):
        assert len(ident["uid_map"]) == 1 and len(ident["gid_map"]) == 1, f"{who}: {ident['uid_map']}"
        inside, base, count = (int(x) for x in ident["uid_map"][0])
        assert inside == 0 and count == USERNS_SIZE and base >= USERNS_MIN_BASE, \
            f"{who}: uid_map is {ident['uid_map'][0]}, want '0 <base >= {USERNS_MIN_BASE}> {USERNS_SIZE}'"
        gid_base = secutil.uid_map_base(ident["gid_map"])
        assert gid_base >= USERNS_MIN_BASE, f"{who}: sandbox gid 0 is host gid {gid_base}: {ident['gid_map']}"
    a, b = secutil.uid_map_base(mine["uid_map"]), secutil.uid_map_base(other["uid_map"])
    assert abs(a - b) >= USERNS_SIZE, \
        f"two sandboxes' uid ranges overlap ({a}, {b}): their roots could signal and ptrace each other"
    assert mine["ns_user"] != other["ns_user"], "two sandboxes share a user namespace"
    assert mine["ns_user"] != os.readlink("/proc/self/ns/user"), "the sandbox is in the host's user namespace"


@attack("userns", "a file created by sandbox root: who owns it on the host")
def test_file_owner_on_host(identities, target):
    mine, _, name = identities
    assert mine["file_uid_inside"] == 0
    # /proc/<pid>/root of a sandbox process is the sandbox's root as the host sees it.
    pid = secutil.sandbox_process(target["id"])
    st = os.stat(f"/proc/{pid}/root/{name}")
    base = secutil.uid_map_base(mine["uid_map"])
    assert st.st_uid == base and base >= USERNS_MIN_BASE, \
        f"sandbox root's file is owned by host uid {st.st_uid} (uid_map base {base})"


@attack("timens", "the sandbox shares the host's time namespace")
def test_time_namespace(identities):
    mine, other, _ = identities
    host = os.readlink("/proc/self/ns/time")
    assert mine["ns_time"] and mine["ns_time"] != host, \
        f"the sandbox's time namespace is the host's ({host})"
    assert mine["ns_time"] != other["ns_time"], "two sandboxes share a time namespace"

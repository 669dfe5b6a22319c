"""cgroup escapes (CVE-2022-0492: mount a v1 hierarchy, set release_agent, run it as host root)."""

from __future__ import annotations

import pytest

from secutil import attack, run_script


@pytest.fixture(scope="module")
def cgroup_attack(sclient, target):
    return run_script(sclient, target["id"], "cgroup_escape")[1]


@pytest.mark.parametrize("key", ["mount_cgroup_v1", "mount_cgroup_v1_memory", "mount_cgroup2"])
@attack("cgroup", "mount cgroupfs (v1 rdma and memory hierarchies, cgroup2) to reach release_agent")
def test_mount_cgroupfs(cgroup_attack, key):
    assert cgroup_attack[key] == "EPERM", f"{key}: expected EPERM, got {cgroup_attack[key]}"


@attack("cgroup", "unshare(CLONE_NEWCGROUP) to re-root the cgroup view")
def test_unshare_cgroupns(cgroup_attack):
    assert cgroup_attack["unshare_cgroupns"] == "EPERM", cgroup_attack["unshare_cgroupns"]


@attack("cgroup", "learn the host cgroup paths from /proc/self/cgroup")
def test_cgroup_paths_hidden(cgroup_attack):
    lines = cgroup_attack["proc_self_cgroup"]
    assert lines, "empty /proc/self/cgroup"
    # hierarchy-id:controllers:path; the cgroup namespace's root is the sandbox's own cgroup.
    assert all(line.split(":", 2)[2] == "/" for line in lines), \
        f"/proc/self/cgroup shows host cgroup paths: {lines}"


@attack("cgroup", "find and write any cgroup.procs, tasks or release_agent file")
def test_no_cgroupfs_visible(cgroup_attack):
    assert cgroup_attack["cgroup_mounts"] == [], f"cgroupfs mounted in the sandbox: {cgroup_attack['cgroup_mounts']}"
    assert cgroup_attack["cgroup_files_found"] == [], cgroup_attack["cgroup_files_found"]
    assert cgroup_attack["write_sys_cgroup_procs"] == "ENOENT", cgroup_attack["write_sys_cgroup_procs"]
    assert cgroup_attack["write_release_agent"] == "ENOENT", cgroup_attack["write_release_agent"]

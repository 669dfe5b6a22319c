"""File-system escapes: the mount table, host files, host binaries, device nodes, setuid."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

import secutil
from secutil import attack, run_script, sh

MOUNT_CALLS = ["mount_tmpfs", "mount_proc", "mount_sysfs", "mount_bind_root", "remount_usr_rw",
               "make_root_shared", "umount_proc", "umount_shadow_mask", "pivot_root"]
NEW_MOUNT_API = ["fsopen", "fspick", "fsconfig", "fsmount", "open_tree", "move_mount", "mount_setattr"]


@pytest.fixture(scope="module")
def mount_attack(sclient, target, sbxd):
    marker = "sbxsec-" + secrets.token_hex(6)
    res, out = run_script(sclient, target["id"], "mounts", marker)
    return marker, out


@pytest.mark.parametrize("call", MOUNT_CALLS)
@attack("mount", "mount(2)/umount2/pivot_root from sandbox root (tmpfs, proc, sysfs, bind of /, "
                 "remount /usr rw, make / shared, unmount /proc or the /etc/shadow mask)")
def test_mount_syscalls_denied(mount_attack, call, sbxd):
    marker, out = mount_attack
    assert out[call] == "EPERM", f"{call}: expected EPERM, got {out[call]}"
    _assert_mount_tables_clean(marker, out, sbxd)


@pytest.mark.parametrize("call", NEW_MOUNT_API)
@attack("mount", "the new mount API: fsopen/fspick/fsconfig/fsmount/open_tree/move_mount/mount_setattr")
def test_new_mount_api_denied(mount_attack, call, sbxd):
    marker, out = mount_attack
    assert out[call] == "EPERM", f"{call}: expected EPERM, got {out[call]}"
    _assert_mount_tables_clean(marker, out, sbxd)


def _assert_mount_tables_clean(marker, out, sbxd):
    assert out["marker_in_own_mountinfo"] is False, "a mount named by the attack exists in the sandbox"
    assert (out["usr_mount_options"] or "").split(",")[0] == "ro", \
        f"/usr is no longer read-only in the sandbox: {out['usr_mount_options']}"
    host = secutil.mountinfo_mentioning(marker, pids=("self", "1", str(sbxd.proc.pid)))
    assert host == [], f"the attack's mount reached the host: {host}"


# ---- host files -------------------------------------------------------------------------------

@pytest.fixture
def canaries(sbxd):
    """Files with random content on the host, where a sandbox escape would look first: /root,
    /var/tmp and sbxd's own state directory (the parent of every sandbox's directory)."""
    tag = secrets.token_hex(6)
    made = {}
    vardir = Path(f"/var/tmp/sbxsec-{tag}")
    paths = [Path(f"/root/sbxsec-canary-{tag}"), vardir / "canary", sbxd.state_dir / f"sbxsec-canary-{tag}"]
    try:
        vardir.mkdir(mode=0o755)
        for p in paths:
            content = secrets.token_hex(24)
            p.write_text(content)
            os.chmod(p, 0o644)
            made[str(p)] = content
        yield made
        for p, content in made.items():
            assert Path(p).read_text() == content, f"the host canary {p} changed"
    finally:
        for p in paths:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        shutil.rmtree(vardir, ignore_errors=True)


@attack("host-files", "read host canaries via /proc/<pid>/root, /proc/self/root, /proc/<pid>/cwd and "
                      "directory fds with `..` walks, `..` from /, absolute and relative symlinks, "
                      "the chroot-fchdir escape, and open_by_handle_at (shocker)")
def test_host_files_unreachable(sclient, target, canaries):
    res, out = run_script(sclient, target["id"], "fs_escape", *canaries)
    for content in canaries.values():
        assert content.encode() not in res.stdout and content.encode() not in res.stderr, \
            "a host canary's content came out of the sandbox"
    reads = out["reads"]
    assert len(reads) >= 6 * len(canaries), f"too few read attempts ran: {sorted(reads)}"
    assert out["chroot_escape_error"] is None, out["chroot_escape_error"]
    assert {k for k in reads if k.endswith(":chroot_escape")}, "the chroot escape did not try to read"
    # Through the agent's /proc/1/{root,cwd} the walk stops earlier: the agent is not dumpable,
    # so its /proc entries are closed to sandbox processes (EACCES); every other path simply
    # has no such file in the sandbox's root (ENOENT).
    wrong = {k: v for k, v in reads.items()
             if v["outcome"] != ("EACCES" if k.split(":", 1)[1].startswith("proc_1_") else "ENOENT")}
    assert not wrong, f"reads of host paths that did not fail as expected: {wrong}"
    assert out["name_to_handle_at"] == "EPERM", out["name_to_handle_at"]
    assert out["open_by_handle_at"] == "EPERM", out["open_by_handle_at"]


@attack("host-files", "read the host's /etc/shadow and ssh host keys through the /etc view")
def test_etc_secrets_masked(sclient, target):
    host_shadow = Path("/etc/shadow")
    if not host_shadow.exists() or host_shadow.stat().st_size == 0:
        pytest.fail("this host has no non-empty /etc/shadow; the test cannot show the mask works")
    res = sh(sclient, target["id"],
             "wc -c < /etc/shadow; for k in /etc/ssh/ssh_host_*_key; do [ -e \"$k\" ] && wc -c < \"$k\"; done; "
             "echo x > /etc/shadow 2>/dev/null; echo write=$?")
    assert res.exit == secutil.CLEAN_EXIT, (res.exit, res.stderr)
    lines = res.stdout.decode().split()
    assert lines[0] == "0", f"/etc/shadow is readable in the sandbox: {lines[0]} bytes"
    assert all(n == "0" for n in lines[1:-1]), f"ssh host keys readable: {lines}"
    assert lines[-1] == "write=2" or lines[-1] == "write=1", lines
    assert host_shadow.stat().st_size > 0


# ---- host binaries (runc CVE-2019-5736) ---------------------------------------------------------

@attack("exe-overwrite", "open /proc/1/exe (the agent) and /proc/self/exe for writing, write and "
                         "truncate them, rename over a host binary in /usr")
def test_exe_overwrite(sclient, target, sbxd):
    agent_host = sbxd.binary.parent / "sbx-agent"
    python_host = os.path.realpath("/usr/bin/python3")
    before = {p: secutil.sha256(p) for p in (agent_host, python_host, "/usr/bin/env")}
    res, out = run_script(sclient, target["id"], "exe_overwrite")
    after = {p: secutil.sha256(p) for p in before}
    assert after == before, f"a host binary changed: {before} -> {after}"
    # The agent is not dumpable: from inside, /proc/1/exe cannot even be resolved or read, let
    # alone opened for writing.
    assert out["agent_exe"] is None and out["agent_sha256_before"] == "EACCES", out
    assert out["agent_sha256_after"] == "EACCES", out
    for mode in ("wronly", "rdwr_trunc"):
        assert out[f"open_agent_exe_{mode}"] == "EACCES", f"open(/proc/1/exe, {mode}): {out}"
    # Seen from the host, every agent of this sbxd still runs from its sealed memfd, a copy of
    # the host binary (the seals would refuse a write even to a process that got the file open).
    agents = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != sbxd.proc.pid:
                continue
            exe = os.readlink(d / "exe")
        except (OSError, ValueError, IndexError):
            continue
        if exe.startswith("/memfd:sbx-agent"):
            agents.append(d)
    assert agents, "no agent of this sbxd found running from its memfd"
    for d in agents:
        assert secutil.sha256(d / "exe") == before[agent_host], f"{d}/exe is not a copy of {agent_host}"
    # python3 is running (ETXTBSY) and on the read-only /usr view (EROFS): either refuses.
    assert out["open_self_exe_wronly"] in ("ETXTBSY", "EROFS"), out["open_self_exe_wronly"]
    assert out["open_python_on_usr_wronly"] in ("ETXTBSY", "EROFS"), out["open_python_on_usr_wronly"]
    assert out["open_usr_bin_env_wronly"] == "EROFS", out["open_usr_bin_env_wronly"]
    assert out["rename_usr_bin_env"] == "EROFS", out["rename_usr_bin_env"]


# ---- devices --------------------------------------------------------------------------------------

EXPECTED_DEV = ["fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                "tty", "urandom", "zero"]


@attack("devices", "mknod char 1:3 and 1:1 (/dev/mem), block 8:0 (the host disk) in /tmp, /root "
                   "and /dev; the mknod command")
def test_device_nodes(sclient, target):
    res, out = run_script(sclient, target["id"], "devices")
    for key in ("mknod_char_1_3_tmp", "mknod_char_1_1_root", "mknod_block_8_0_root", "mknod_block_8_0_dev"):
        # Landlock refuses device nodes everywhere (EACCES) before the kernel's capability check
        # (CAP_MKNOD in the host's user namespace, which sandbox root lacks: EPERM) is reached.
        assert out[key] == "EACCES", f"{key}: expected EACCES, got {out[key]}"
    assert out["mknod_cmd"] == 1, f"mknod(1) exit {out['mknod_cmd']}"
    assert out["dev_entries"] == EXPECTED_DEV, f"/dev holds more than the fixed set: {out['dev_entries']}"


# ---- setuid -------------------------------------------------------------------------------------

@attack("setuid", "sandbox root makes a setuid-root copy of id(1); an unprivileged session runs it")
def test_sandbox_made_setuid_binary(sclient, target):
    prep = sh(sclient, target["id"],
              "cp /usr/bin/id /sbxsec-suid-id && chown 0:0 /sbxsec-suid-id && chmod 4755 /sbxsec-suid-id "
              "&& stat -c '%a %u' /sbxsec-suid-id")
    assert prep.exit == secutil.CLEAN_EXIT and prep.stdout == b"4755 0\n", \
        f"could not prepare the setuid binary (the attack would prove nothing): {prep.exit} {prep.stdout!r} {prep.stderr!r}"
    res = sh(sclient, target["id"], "/sbxsec-suid-id -u; /sbxsec-suid-id -ru", user="nobody")
    assert res.exit == secutil.CLEAN_EXIT, (res.exit, res.stderr)
    assert res.stdout == b"65534\n65534\n", f"the setuid binary changed the user: {res.stdout!r}"


@attack("setuid", "an unprivileged session runs the host's setuid-root su; its effective uid is read "
                  "from /proc while it waits for a password")
def test_host_setuid_binary(sclient, target):
    su = "/usr/bin/su"
    st = os.stat(su)
    if not (st.st_mode & 0o4000 and st.st_uid == 0):
        pytest.fail(f"{su} is not setuid root on this host; the test cannot show anything")
    # su waits on stdin (a pipe that stays open) for the password; meanwhile its credentials
    # show whether the setuid bit took effect: Uid: real effective saved fs.
    script = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['/usr/bin/su', 'root', '-c', 'id -u'], stdin=subprocess.PIPE,"
        " stdout=subprocess.PIPE, stderr=subprocess.STDOUT)\n"
        "uid = None\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        st = open(f'/proc/{p.pid}/status').read()\n"
        "        exe = __import__('os').readlink(f'/proc/{p.pid}/exe')\n"
        "    except OSError:\n"
        "        break\n"
        "    if exe == '/usr/bin/su':\n"
        "        uid = [l for l in st.splitlines() if l.startswith('Uid:')][0]\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "out = p.communicate(timeout=20)[0]  # closes stdin: su reads EOF as the password\n"
        "print('UID', uid)\n"
        "print('RC', p.returncode)\n"
        "print('OUT', out.decode(errors='replace').replace('\\n', ' '))\n")
    res = sclient.run(target["id"], ["python3", "-c", script], user="nobody", max_seconds=60)
    assert res.exit == secutil.CLEAN_EXIT, (res.exit, res.stderr)
    lines = dict(line.split(" ", 1) for line in res.stdout.decode().splitlines() if " " in line)
    assert lines.get("UID", "").split() == ["Uid:", "65534", "65534", "65534", "65534"], \
        f"su ran with other credentials than nobody's: {res.stdout!r}"
    assert lines.get("RC") != "0" and "0" not in lines.get("OUT", "").split(), \
        f"su ran a command as root: {res.stdout!r}"

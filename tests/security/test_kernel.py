"""Kernel interfaces beyond a sandbox's business: keyrings, bpf, perf, io_uring, userfaultfd,
modules, kexec, reboot, the kernel log, sysrq and host sysctls."""

from __future__ import annotations

import os
import secrets

import pytest

import secutil
from secutil import attack, run_script

# (result key, attack class, what it tries). Every call must fail with EPERM: the seccomp filter
# (src/runtime/ns/seccomp.cc) or a dropped capability refuses it. Arguments are chosen so that a
# call that got past both would fail harmlessly with another errno (see attacks/kernel_surface.py).
DENIED = [
    ("keyctl_get_keyring_id", "keyring", "keyctl(KEYCTL_GET_KEYRING_ID, session keyring)"),
    ("keyctl_join_session", "keyring", "keyctl(KEYCTL_JOIN_SESSION_KEYRING)"),
    ("add_key", "keyring", "add_key(\"user\") into the session keyring"),
    ("request_key", "keyring", "request_key(\"user\")"),
    ("bpf_map_create", "bpf", "bpf(BPF_MAP_CREATE)"),
    ("bpf_prog_load", "bpf", "bpf(BPF_PROG_LOAD)"),
    ("perf_event_open", "perf", "perf_event_open on any CPU"),
    ("io_uring_setup", "io_uring", "io_uring_setup(8 entries)"),
    ("userfaultfd", "userfaultfd", "userfaultfd(0)"),
    ("init_module", "kernel-modules", "init_module"),
    ("finit_module", "kernel-modules", "finit_module"),
    ("delete_module", "kernel-modules", "delete_module"),
    ("kexec_load", "kexec", "kexec_load"),
    ("kexec_file_load", "kexec", "kexec_file_load"),
    ("reboot", "reboot", "reboot(2)"),
    ("syslog_size_buffer", "kernel-log", "syslog(SYSLOG_ACTION_SIZE_BUFFER) (klogctl)"),
    ("syslog_read_all", "kernel-log", "syslog(SYSLOG_ACTION_READ_ALL) (klogctl)"),
    ("syslog_clear", "kernel-log", "syslog(SYSLOG_ACTION_CLEAR) (klogctl)"),
    ("acct", "host-admin", "acct(2): process accounting to a sandbox file"),
    ("swapon", "host-admin", "swapon(2)"),
    ("personality_read_implies_exec", "personality", "personality(READ_IMPLIES_EXEC)"),
]


@pytest.fixture(scope="module")
def kernel_attack(sclient, target):
    return run_script(sclient, target["id"], "kernel_surface")[1]


def _case(key, cls, tried):
    return pytest.param(key, marks=attack(cls, tried), id=key)


@pytest.mark.parametrize("key", [_case(*d) for d in DENIED])
def test_kernel_interface_denied(kernel_attack, key):
    assert kernel_attack[key] == "EPERM", f"{key}: expected EPERM, got {kernel_attack[key]}"


@attack("kernel-log", "open /proc/kmsg (needs CAP_SYSLOG) and /dev/kmsg (absent)")
def test_kernel_log_files(kernel_attack):
    # Owned by host root, which sandbox root is not (EACCES before any CAP_SYSLOG check).
    assert kernel_attack["open_proc_kmsg"] == "EACCES", kernel_attack["open_proc_kmsg"]
    assert kernel_attack["open_dev_kmsg"] == "ENOENT", kernel_attack["open_dev_kmsg"]


@attack("sysrq", "write 'h' to /proc/sysrq-trigger")
def test_sysrq_trigger(kernel_attack):
    # Host root's file, closed to sandbox root (EACCES; a read-only self-bind covers it too); a
    # kernel built without CONFIG_MAGIC_SYSRQ has no file.
    expected = "EACCES" if os.path.exists("/proc/sysrq-trigger") else "ENOENT"
    assert kernel_attack["open_sysrq_trigger"] == expected, \
        f"open(/proc/sysrq-trigger, O_WRONLY): expected {expected}, got {kernel_attack['open_sysrq_trigger']}"
    assert "write_sysrq_trigger" not in kernel_attack, kernel_attack


SYSCTLS = {
    "core_pattern": "/proc/sys/kernel/core_pattern",
    "ip_forward": "/proc/sys/net/ipv4/ip_forward",
}


@pytest.fixture(scope="module")
def sysctl_attack(sclient, target):
    evil = "|/tmp/sbxsec-" + secrets.token_hex(4) + " %p"
    before = {k: secutil.read_text(p) for k, p in SYSCTLS.items()}
    try:
        out = run_script(sclient, target["id"], "sysctl", evil)[1]
    finally:
        after = {k: secutil.read_text(p) for k, p in SYSCTLS.items()}
        for k, p in SYSCTLS.items():
            if after[k] != before[k]:  # undo what a successful attack did to this host
                with open(p, "w") as f:
                    f.write(before[k])
    return out, before, after


@pytest.mark.parametrize("key", ["core_pattern", "drop_caches", "ip_forward", "hostname"])
@attack("sysctl", "write kernel.core_pattern (a pipe to a program), vm.drop_caches, "
                  "net.ipv4.ip_forward, kernel.hostname through /proc/sys")
def test_sysctl_write(sysctl_attack, key):
    out, before, after = sysctl_attack
    # /proc/sys is also a read-only mount (EROFS), but the permission check comes first: its
    # files belong to host root, whose ids are not mapped into the sandbox (EACCES).
    assert out[f"open_{key}"] == "EACCES", f"open {key} for writing: expected EACCES, got {out[f'open_{key}']}"
    if key in SYSCTLS:
        assert after[key] == before[key], f"host {key} changed: {before[key]!r} -> {after[key]!r}"


@attack("host-events", "netlink families that broadcast host events (socket() of every protocol "
                       "0..31), and NETLINK_KOBJECT_UEVENT group 1 listened to while another "
                       "sandbox is created and deleted")
def test_netlink_families(sclient, target):
    import threading

    def neighbour():
        sb = sclient.create_sandbox({"labels": {"security": "uevent-neighbour"}})["sandbox"]
        sclient.delete_sandbox(sb["id"])

    import base64
    session = sclient.create_session(target["id"], ["python3", "-c", secutil.script("netlink_events"), "6"])
    out_bytes = b""
    t = None
    with sclient.attach(session) as stream:
        for ev in stream.events():
            if ev.event == "stdout":
                out_bytes += base64.b64decode(ev.data["data_b64"])
                if t is None and b"listening" in out_bytes:  # the guest listens: now the neighbour
                    t = threading.Thread(target=neighbour)
                    t.start()
            elif ev.event == "process_exited":
                assert ev.data["exit_code"] == 0, ev.data
                break
            elif ev.event == "error":
                raise AssertionError(f"attach error: {ev.data}")
    assert t is not None, out_bytes
    t.join(60)
    out_lines = out_bytes.decode(errors="replace").splitlines()
    lines = [line for line in out_lines if line.startswith(secutil.RESULT_PREFIX)]
    assert len(lines) == 1, out_lines
    out = __import__("json").loads(lines[0][len(secutil.RESULT_PREFIX):])
    opened = sorted(int(p) for p, o in out["families"].items() if o == "OK")
    # NETLINK_ROUTE and NETLINK_SOCK_DIAG (about the sandbox's own network namespace) only.
    assert opened == [0, 4], f"netlink families a sandbox may open: {opened}"
    refused = {p: o for p, o in out["families"].items() if o != "OK"}
    assert all(o in ("EPERM", "EPROTONOSUPPORT") for o in refused.values()), refused
    assert out["families"]["15"] == "EPERM" and out["uevent_socket"] == "EPERM", out
    assert not out["uevents"], f"the guest received host/neighbour uevents: {out['uevents']}"


@attack("host-events", "inotify (IN_ACCESS|IN_OPEN) on the shared read-only views /usr/bin and /etc "
                       "while the host and another sandbox run programs: which binaries neighbours use")
def test_inotify_on_shared_views(sclient, target, bystander):
    import base64
    import subprocess
    import threading

    def neighbours():
        # Programs the watcher itself never runs: the host's and the bystander's.
        for _ in range(3):
            subprocess.run(["/usr/bin/cksum", "/etc/hostname"], stdout=subprocess.DEVNULL, check=False)
            sclient.run(bystander["sandbox"]["id"], ["sh", "-c", "tac /etc/hostname >/dev/null; "
                                                                 "cat /etc/os-release >/dev/null"])

    session = sclient.create_session(target["id"], ["python3", "-c", secutil.script("inotify_neighbours"), "4"])
    out_bytes, t = b"", None
    with sclient.attach(session) as stream:
        for ev in stream.events():
            if ev.event == "stdout":
                out_bytes += base64.b64decode(ev.data["data_b64"])
                if t is None and b"watching" in out_bytes:
                    t = threading.Thread(target=neighbours)
                    t.start()
            elif ev.event == "process_exited":
                assert ev.data["exit_code"] == 0, ev.data
                break
            elif ev.event == "error":
                raise AssertionError(f"attach error: {ev.data}")
    assert t is not None, out_bytes
    t.join(60)
    lines = [line for line in out_bytes.decode(errors="replace").splitlines()
             if line.startswith(secutil.RESULT_PREFIX)]
    assert len(lines) == 1, out_bytes
    out = __import__("json").loads(lines[0][len(secutil.RESULT_PREFIX):])
    # Watching is allowed (workloads watch their own files); what neighbours do must not show.
    assert out["watches"] == {"/usr/bin": "OK", "/etc": "OK"}, out["watches"]
    leaked = [n for n in out["seen"] if n in ("cksum", "tac", "os-release", "hostname")]
    assert not leaked, f"the guest saw its neighbours' file accesses through inotify: {out['seen']}"

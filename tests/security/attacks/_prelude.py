# Prepended to every attack script (tests/security/attacks/*.py) before its text is passed to
# `python3 -c` inside a sandbox. Gives raw syscalls through ctypes and a JSON result line.
# Arguments from the test arrive as sys.argv[1:]; sys.argv[0] is "-c".
import ctypes
import errno
import json
import os
import platform
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
ARCH = platform.machine()
ARGS = sys.argv[1:]
RESULT = {}

# Syscall numbers (the filter in src/runtime/ns/seccomp.cc names them; libc has no wrapper for
# most). Only x86_64 and aarch64, the architectures the runtime supports.
_NR = {
    "x86_64": dict(
        mount=165, umount2=166, pivot_root=155, open_tree=428, move_mount=429, fsopen=430,
        fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, unshare=272, setns=308,
        clone=56, clone3=435, keyctl=250, add_key=248, request_key=249, bpf=321,
        perf_event_open=298, io_uring_setup=425, userfaultfd=323, init_module=175,
        finit_module=313, delete_module=176, kexec_load=246, kexec_file_load=320, reboot=169,
        syslog=103, ptrace=101, process_vm_readv=310, settimeofday=164, clock_settime=227,
        adjtimex=159, clock_adjtime=305, open_by_handle_at=304, name_to_handle_at=303, kill=62,
        mknodat=259, acct=163, swapon=167, personality=135),
    "aarch64": dict(
        mount=40, umount2=39, pivot_root=41, open_tree=428, move_mount=429, fsopen=430,
        fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, unshare=97, setns=268,
        clone=220, clone3=435, keyctl=219, add_key=217, request_key=218, bpf=280,
        perf_event_open=241, io_uring_setup=425, userfaultfd=282, init_module=105,
        finit_module=273, delete_module=106, kexec_load=104, kexec_file_load=294, reboot=142,
        syslog=116, ptrace=117, process_vm_readv=270, settimeofday=170, clock_settime=112,
        adjtimex=171, clock_adjtime=266, open_by_handle_at=265, name_to_handle_at=264, kill=129,
        mknodat=33, acct=89, swapon=224, personality=92),
}[ARCH]

AT_FDCWD = -100


def _arg(a):
    if a is None:
        return ctypes.c_void_p(None)
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a  # a ctypes object (buffer, pointer, byref)


def sc(name, *args):
    """Raw syscall: returns ("OK", retval) or (errno name, -1)."""
    ctypes.set_errno(0)
    r = LIBC.syscall(ctypes.c_long(_NR[name]), *[_arg(a) for a in args])
    if r == -1:
        e = ctypes.get_errno()
        return errno.errorcode.get(e, str(e)), -1
    return "OK", r


def try_sc(key, name, *args):
    """Records the outcome of one syscall under RESULT[key] (the errno name, or "OK")."""
    outcome, ret = sc(name, *args)
    RESULT[key] = outcome
    return outcome, ret


def oserr(fn, *a, **kw):
    """Runs a Python call; returns ("OK", value) or (errno name, None)."""
    try:
        return "OK", fn(*a, **kw)
    except OSError as e:
        return (errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__), None


def emit():
    sys.stdout.write("SBXSEC-RESULT " + json.dumps(RESULT, sort_keys=True) + "\n")
    sys.stdout.flush()

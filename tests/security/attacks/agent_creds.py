# Sandbox root against its own agent (PID 1) through everything the kernel decides by
# credentials: signals (every number, and a queued SIGTERM with a forged sender), resource
# limits, scheduling, I/O priority, OOM score and the other writable /proc/1 files. The test
# compares the agent's state read from the host before and after.
import signal
import struct

_NR.update({
    "x86_64": dict(rt_sigqueueinfo=129, prlimit64=302, setpriority=141, sched_setscheduler=144,
                   sched_setaffinity=203, sched_setattr=314, ioprio_set=251, pidfd_open=434,
                   pidfd_send_signal=424),
    "aarch64": dict(rt_sigqueueinfo=138, prlimit64=261, setpriority=140, sched_setscheduler=119,
                    sched_setaffinity=122, sched_setattr=274, ioprio_set=30, pidfd_open=434,
                    pidfd_send_signal=424),
}[ARCH])

R = RESULT
R["signals"] = {}
for sig in range(1, 65):
    R["signals"][str(sig)] = sc("kill", 1, sig)[0]
# rt_sigqueueinfo lets the sender write si_pid: 0 is what a signal from the host looks like.
info = ctypes.create_string_buffer(128)
struct.pack_into("iii", info, 0, signal.SIGTERM, 0, -1)  # si_signo, si_errno, si_code SI_QUEUE
struct.pack_into("ii", info, 16, 0, 0)                   # si_pid 0, si_uid 0
R["sigqueue_term_forged_pid0"] = sc("rt_sigqueueinfo", 1, signal.SIGTERM, info)[0]

o, pidfd = sc("pidfd_open", 1, 0)
R["pidfd_open"] = o
if o == "OK":
    R["pidfd_send_term"] = sc("pidfd_send_signal", pidfd, signal.SIGTERM, None, 0)[0]
    R["pidfd_send_int"] = sc("pidfd_send_signal", pidfd, signal.SIGINT, None, 0)[0]
    os.close(pidfd)

# Resource limits: 0 open files or a tiny address space would stop it serving.
zero = ctypes.create_string_buffer(struct.pack("QQ", 0, 0))
old = ctypes.create_string_buffer(16)
R["prlimit_nofile_0"] = sc("prlimit64", 1, 7, zero, None)[0]        # RLIMIT_NOFILE
R["prlimit_as_0"] = sc("prlimit64", 1, 9, zero, None)[0]            # RLIMIT_AS
R["prlimit_nproc_0"] = sc("prlimit64", 1, 6, zero, None)[0]         # RLIMIT_NPROC
R["prlimit_read"] = sc("prlimit64", 1, 7, None, old)[0]

# Scheduling: starve it of CPU.
R["setpriority_pid1"] = sc("setpriority", 0, 1, 19)[0]              # PRIO_PROCESS
R["setpriority_pgrp1"] = sc("setpriority", 1, 1, 19)[0]             # PRIO_PGRP
R["setpriority_user_root"] = sc("setpriority", 2, 0, 19)[0]         # PRIO_USER: all of uid 0
param = ctypes.create_string_buffer(struct.pack("i", 0))
R["sched_idle"] = sc("sched_setscheduler", 1, 5, param)[0]          # SCHED_IDLE
attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQII", 56, 5, 0, 19, 0, 0, 0, 0, 0, 0))
R["sched_setattr_idle"] = sc("sched_setattr", 1, attr, 0)[0]
mask = ctypes.create_string_buffer(struct.pack("Q", 1))
R["sched_setaffinity"] = sc("sched_setaffinity", 1, 8, mask)[0]
R["ioprio_idle"] = sc("ioprio_set", 1, 1, (3 << 13))[0]             # IOPRIO_WHO_PROCESS, class idle
R["ioprio_user_root"] = sc("ioprio_set", 3, 0, (3 << 13))[0]        # IOPRIO_WHO_USER

# Writable /proc/1 files: the OOM score first (a memory bomb then takes the agent).
R["proc_writes"] = {}
for name, value in [("oom_score_adj", b"1000"), ("oom_adj", b"15"), ("task/1/oom_score_adj", b"1000"),
                    ("autogroup", b"19"), ("timerslack_ns", b"1000000000"), ("comm", b"pwned"),
                    ("clear_refs", b"1"), ("coredump_filter", b"0x7f"), ("attr/current", b"x"),
                    ("loginuid", b"0"), ("setgroups", b"deny"), ("uid_map", b"0 0 1"),
                    ("mem", b"x"), ("environ", b"x")]:
    o, fd = oserr(os.open, f"/proc/1/{name}", os.O_WRONLY)
    if fd is not None:
        o = "opened:" + oserr(os.write, fd, value)[0]
        os.close(fd)
    R["proc_writes"][name] = o
emit()

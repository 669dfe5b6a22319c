# Kernel interfaces a sandbox must not reach. Arguments are chosen so that a call the filter
# did NOT stop fails harmlessly (bad magic, bad flags, bad fd) instead of doing damage: the
# expected result is EPERM everywhere; anything else means the call reached the kernel.
zero = ctypes.create_string_buffer(256)
KEY_SPEC_SESSION_KEYRING = -3
try_sc("keyctl_get_keyring_id", "keyctl", 0, KEY_SPEC_SESSION_KEYRING, 0)
try_sc("keyctl_join_session", "keyctl", 1, "sbxsec")
try_sc("add_key", "add_key", "user", "sbxsec", "secret", 6, KEY_SPEC_SESSION_KEYRING)
try_sc("request_key", "request_key", "user", "sbxsec", None, 0)
try_sc("bpf_map_create", "bpf", 0, zero, 72)
try_sc("bpf_prog_load", "bpf", 5, zero, 144)
try_sc("perf_event_open", "perf_event_open", zero, 0, -1, -1, 0)
try_sc("io_uring_setup", "io_uring_setup", 8, zero)
try_sc("userfaultfd", "userfaultfd", 0)
try_sc("init_module", "init_module", zero, 0, "")
try_sc("finit_module", "finit_module", -1, "", 0)
try_sc("delete_module", "delete_module", "sbxsec_no_such_module", os.O_NONBLOCK)
try_sc("kexec_load", "kexec_load", 0, 0, None, 0xDEAD0000)             # bad flags
try_sc("kexec_file_load", "kexec_file_load", -1, -1, 0, None, 0xDEAD0000)
try_sc("reboot", "reboot", 0xBAD, 0xBAD, 0, None)                         # bad magic
try_sc("syslog_size_buffer", "syslog", 10, None, 0)                       # SYSLOG_ACTION_SIZE_BUFFER
try_sc("syslog_read_all", "syslog", 3, zero, 256)                         # SYSLOG_ACTION_READ_ALL
try_sc("syslog_clear", "syslog", 5, None, 0)                              # SYSLOG_ACTION_CLEAR
try_sc("acct", "acct", "/tmp/sbxsec-acct")
try_sc("swapon", "swapon", "/tmp/sbxsec-swap", 0)
try_sc("personality_read_implies_exec", "personality", 0x0400000)
RESULT["open_proc_kmsg"] = oserr(os.open, "/proc/kmsg", os.O_RDONLY)[0]
RESULT["open_dev_kmsg"] = oserr(os.open, "/dev/kmsg", os.O_RDONLY)[0]
o, fd = oserr(os.open, "/proc/sysrq-trigger", os.O_WRONLY)
RESULT["open_sysrq_trigger"] = o
if fd is not None:
    RESULT["write_sysrq_trigger"] = oserr(os.write, fd, b"h")[0]   # 'h' only prints help
emit()

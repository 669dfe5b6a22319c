# Making or joining namespaces: a new user namespace hands back every capability (the path to
# many kernel bugs); setns into another namespace would leave the sandbox's.
import signal
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
try_sc("unshare_user", "unshare", CLONE_NEWUSER)
try_sc("unshare_mnt", "unshare", CLONE_NEWNS)
try_sc("unshare_net", "unshare", CLONE_NEWNET)
# The agent is not dumpable: its /proc/1/ns entries are closed to sandbox processes. The
# setns is tried anyway, with the process's own net namespace when that open fails.
o, fd = oserr(os.open, "/proc/1/ns/net", os.O_RDONLY)
RESULT["open_agent_netns"] = o
if fd is None:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
try_sc("setns_net_agent", "setns", fd, 0)
fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
try_sc("setns_mnt_self", "setns", fd, 0)
for key, flags in (("clone_newuser", CLONE_NEWUSER), ("clone_newns", CLONE_NEWNS),
                   ("clone_newpid", CLONE_NEWPID)):
    outcome, ret = try_sc(key, "clone", flags | signal.SIGCHLD, 0, 0, 0, 0)
    if outcome == "OK":
        if ret == 0:
            os._exit(0)  # the child of a clone that should not have happened
        os.waitpid(ret, 0)
clone_args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, 0)
outcome, ret = try_sc("clone3_newuser", "clone3", clone_args, 88)
if outcome == "OK":
    if ret == 0:
        os._exit(0)
    os.waitpid(ret, 0)
RESULT["unshare_cmd_exit"] = os.system("unshare -U -r true 2>/dev/null") >> 8
emit()

# Signals and ptrace towards processes outside the sandbox (their host pids, which the test
# passes in argv) and towards the sandbox's own PID 1 (the agent).
import signal
RESULT["host_pids"] = {}
for p in ARGS:
    pid = int(p)
    RESULT["host_pids"][p] = {
        "exists_in_proc": os.path.exists(f"/proc/{pid}"),
        "kill0": sc("kill", pid, 0)[0],
        "sigkill": sc("kill", pid, signal.SIGKILL)[0],
    }
PTRACE_TRACEME, PTRACE_ATTACH, PTRACE_SEIZE = 0, 16, 0x4206
try_sc("ptrace_attach_agent", "ptrace", PTRACE_ATTACH, 1, 0, 0)
try_sc("ptrace_seize_agent", "ptrace", PTRACE_SEIZE, 1, 0, 0)
# A process of our own, in the same sandbox: still refused (the filter denies ptrace whole).
child = os.fork()
if child == 0:
    import time
    time.sleep(30)
    os._exit(0)
try_sc("ptrace_attach_own_child", "ptrace", PTRACE_ATTACH, child, 0, 0)
buf = ctypes.create_string_buffer(16)
iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 16)
try_sc("process_vm_readv_agent", "process_vm_readv", 1, iov, 1, iov, 1, 0)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
emit()

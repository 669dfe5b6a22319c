# Threads until the kernel refuses one (threads count against pids.max like processes).
# argv: the most threads to try (a bound, so that a missing limit ends the attack too).
import threading
import time
limit = int(ARGS[0])
stop = threading.Event()
started = 0
error = None
threading.stack_size(64 * 1024)
try:
    for _ in range(limit):
        t = threading.Thread(target=stop.wait, args=(30,), daemon=True)
        t.start()
        started += 1
except RuntimeError as e:
    error = str(e)
RESULT["threads_started"] = started
RESULT["error"] = error
with open("/proc/self/status") as f:
    RESULT["threads_in_status"] = int([l for l in f if l.startswith("Threads:")][0].split()[1])
stop.set()
emit()
os._exit(0)

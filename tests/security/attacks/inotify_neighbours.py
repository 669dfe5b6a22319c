# inotify watches on the shared read-only views (/usr/bin, /etc): while the test runs programs
# on the host and in another sandbox, a watch on a view that shares the host's inodes sees
# every binary they open. argv: SECONDS to watch.
import select
import struct
import time

watch_s = float(ARGS[0]) if ARGS else 5.0
IN_ACCESS, IN_OPEN, IN_CLOSE_NOWRITE = 0x1, 0x20, 0x10
fd = LIBC.inotify_init1(0)
R = RESULT
R["watches"] = {}
for d in ("/usr/bin", "/etc"):
    wd = LIBC.inotify_add_watch(fd, d.encode(), IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE)
    R["watches"][d] = "OK" if wd >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
names = set()
print("watching", flush=True)
deadline = time.monotonic() + watch_s
while time.monotonic() < deadline:
    r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    if not r:
        continue
    buf = os.read(fd, 65536)
    i = 0
    while i + 16 <= len(buf):
        _wd, _mask, _cookie, ln = struct.unpack_from("iIII", buf, i)
        names.add(buf[i + 16:i + 16 + ln].rstrip(b"\0").decode(errors="replace"))
        i += 16 + ln
R["seen"] = sorted(names)
emit()

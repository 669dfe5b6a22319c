# Reading host files from inside. argv: absolute host paths of canary files (the test wrote
# them on the host; they must not be reachable). Every attempt records its outcome; a
# successful read records the first bytes it got (the test looks for the canary's content).
import base64
CANARIES = ARGS
reads = {}


def attempt(key, path):
    outcome, data = oserr(lambda: open(path, "rb").read(4096))
    reads[key] = {"path": path, "outcome": outcome}
    if data is not None:
        reads[key]["data_b64"] = base64.b64encode(data[:256]).decode()


pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
RESULT["visible_pids"] = pids
os.makedirs("/tmp/sbxsec-fs/jail", exist_ok=True)
for i, c in enumerate(CANARIES):
    rel = c.lstrip("/")
    attempt(f"{i}:direct", c)
    attempt(f"{i}:dotdot", "/" + "../" * 24 + rel)
    attempt(f"{i}:proc_self_root", "/proc/self/root/" + rel)
    attempt(f"{i}:proc_self_root_dotdot", "/proc/self/root/" + "../" * 24 + rel)
    for pid in pids:
        attempt(f"{i}:proc_{pid}_root", f"/proc/{pid}/root/{rel}")
        attempt(f"{i}:proc_{pid}_cwd", f"/proc/{pid}/cwd/" + "../" * 24 + rel)
        # Any directory fd some sandbox process holds (runc CVE-2024-21626: a leaked host
        # directory fd lets `..` walk out of the root).
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            p = f"/proc/{pid}/fd/{fd}"
            if os.path.isdir(p):
                attempt(f"{i}:proc_{pid}_fd_{fd}", p + "/" + "../" * 24 + rel)
    link = f"/tmp/sbxsec-fs/link{i}"
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(c, link)
    attempt(f"{i}:symlink_abs", link)
    link2 = f"/tmp/sbxsec-fs/rel{i}"
    if os.path.lexists(link2):
        os.unlink(link2)
    os.symlink("../../" * 12 + rel, link2)
    attempt(f"{i}:symlink_dotdot", link2)

# The classic chroot escape (CAP_SYS_CHROOT is kept): chroot into a subdirectory while holding
# a directory fd outside it, fchdir out and walk `..` up. After pivot_root + detach the top is
# the sandbox's root, not the host's. Done in a child so this process keeps its root.
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    out = {}
    try:
        keep = os.open("/", os.O_RDONLY)
        os.chroot("/tmp/sbxsec-fs/jail")
        os.fchdir(keep)
        for _ in range(32):
            os.chdir("..")
        os.chroot(".")
        for i, c in enumerate(CANARIES):
            o, data = oserr(lambda: open(c, "rb").read(4096))
            out[f"{i}:chroot_escape"] = {"path": c, "outcome": o}
            if data is not None:
                out[f"{i}:chroot_escape"]["data_b64"] = base64.b64encode(data[:256]).decode()
        out["chroot_escape_root_entries"] = sorted(os.listdir("/"))
    except OSError as e:
        out["chroot_escape_error"] = errno.errorcode.get(e.errno, str(e.errno))
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
child = b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    child += chunk
os.waitpid(pid, 0)
child_out = json.loads(child)
RESULT["chroot_escape_root_entries"] = child_out.pop("chroot_escape_root_entries", None)
RESULT["chroot_escape_error"] = child_out.pop("chroot_escape_error", None)
reads.update(child_out)
RESULT["reads"] = reads
# Shocker (2014): open a host file by handle, bypassing the path walk.
handle = ctypes.create_string_buffer(128)
ctypes.memmove(handle, ctypes.byref(ctypes.c_uint32(120)), 4)
mount_id = ctypes.c_int(0)
try_sc("name_to_handle_at", "name_to_handle_at", AT_FDCWD, "/etc/hostname", handle,
       ctypes.byref(mount_id), 0)
try_sc("open_by_handle_at", "open_by_handle_at", os.open("/", os.O_RDONLY), handle, os.O_RDONLY)
emit()

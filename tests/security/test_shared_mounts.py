"""Mounts a sandbox shares with the host or other sandboxes: none is writable from inside, and
the masks are each sandbox's own directory (docs/isolation.md §3 steps 11, 13-16 and 24)."""

from __future__ import annotations

import json
import os

import secutil
from secutil import attack

# The sandbox's own writable mounts; every other mount point in its table is shared (the
# template, the host's /usr and /etc, the secret masks) or read-only (/proc's masks and paths).
OWN_WRITABLE = {"/", "/tmp", "/dev", "/dev/shm", "/dev/pts", "/proc"}

_PROBE = r"""
import errno, json, os
out = {}
for line in open("/proc/self/mountinfo"):
    point = line.split()[4].replace("\\040", " ")
    if point in OWN or point in out:
        continue
    try:
        st = os.stat(point)
    except OSError as e:
        out[point] = "stat " + errno.errorcode.get(e.errno, str(e.errno))
        continue
    if os.path.isdir(point):
        tries = [lambda: os.close(os.open(os.path.join(point, "sbxsec-w"), os.O_WRONLY | os.O_CREAT, 0o644)),
                 lambda: os.mkdir(os.path.join(point, "sbxsec-d")),
                 lambda: os.chmod(point, 0o777)]
    elif os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3:
        continue  # /dev/null bound over a /proc file: writes go nowhere
    else:
        tries = [lambda: os.close(os.open(point, os.O_WRONLY | os.O_APPEND)),
                 lambda: os.chmod(point, 0o666)]
    res = []
    for t in tries:
        try:
            t()
            res.append("OK")
        except OSError as e:
            res.append(errno.errorcode.get(e.errno, str(e.errno)))
    out[point] = res
print("RESULT " + json.dumps(out))
"""


def _probe(sclient, sid):
    res = sclient.run(sid, ["python3", "-c", f"OWN = {sorted(OWN_WRITABLE)!r}\n" + _PROBE])
    lines = [l for l in res.stdout.decode(errors="replace").splitlines() if l.startswith("RESULT ")]
    assert res.exit == secutil.CLEAN_EXIT and len(lines) == 1, (res.exit, res.stdout[-1500:], res.stderr[-1500:])
    return json.loads(lines[0][len("RESULT "):])


@attack("mount", "sandbox root creates files and directories in, or chmods, every mount it shares "
                 "with the host or other sandboxes (template views, secret and /proc masks)")
def test_no_shared_mount_is_writable(sclient, target):
    out = _probe(sclient, target["id"])
    assert "/usr" in out and "/etc" in out, f"the probe missed the template views: {sorted(out)}"
    writable = {p: r for p, r in out.items() if not isinstance(r, list) or "OK" in r}
    assert writable == {}, f"shared mounts writable from the sandbox: {writable}"


@attack("mount", "two sandboxes' masked directories (/proc/acpi, /etc/ssl/private) are one "
                 "directory, through which an inotify watch would see the other's accesses")
def test_masks_are_each_sandboxs_own(sclient, target, bystander):
    roots = [f"/proc/{secutil.sandbox_process(sb['id'])}/root"
             for sb in (target, bystander["sandbox"])]
    checked = 0
    for path in ("proc/acpi", "etc/ssl/private"):
        try:
            a, b = (os.stat(os.path.join(r, path)) for r in roots)
        except FileNotFoundError:
            continue  # this host has nothing there to mask
        checked += 1
        assert os.listdir(os.path.join(roots[0], path)) == [], f"/{path} is not empty in the sandbox"
        assert (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino), f"/{path}: both sandboxes see one directory"
        host = os.stat("/" + path)
        assert (a.st_dev, a.st_ino) != (host.st_dev, host.st_ino), f"/{path}: the host's own directory"
    if checked == 0:
        from conftest import skip_or_fail
        skip_or_fail("neither /proc/acpi nor /etc/ssl/private exists on this host")

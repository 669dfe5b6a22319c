# Mount-table attacks: the classic mount(2) family and the new mount API. argv: MARKER, a string
# used as the mount source so that a mount that did happen anywhere can be found by name.
MARKER = ARGS[0]
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_SHARED = 0x1, 0x20, 0x1000, 0x4000, 0x100000
MNT_DETACH = 2
OPEN_TREE_CLONE, AT_RECURSIVE = 1, 0x8000

os.makedirs("/tmp/sbxsec-mnt/old", exist_ok=True)
try_sc("mount_tmpfs", "mount", MARKER, "/mnt", "tmpfs", 0, "size=1m")
try_sc("mount_proc", "mount", MARKER, "/mnt", "proc", 0, None)
try_sc("mount_sysfs", "mount", MARKER, "/mnt", "sysfs", 0, None)
try_sc("mount_bind_root", "mount", "/", "/mnt", None, MS_BIND | MS_REC, None)
try_sc("remount_usr_rw", "mount", None, "/usr", None, MS_REMOUNT | MS_BIND, None)
try_sc("make_root_shared", "mount", None, "/", None, MS_REC | MS_SHARED, None)
try_sc("umount_proc", "umount2", "/proc", MNT_DETACH)
try_sc("umount_shadow_mask", "umount2", "/etc/shadow", MNT_DETACH)
try_sc("pivot_root", "pivot_root", "/tmp/sbxsec-mnt", "/tmp/sbxsec-mnt/old")
try_sc("fsopen", "fsopen", "tmpfs", 0)
try_sc("fspick", "fspick", AT_FDCWD, "/usr", 0)
try_sc("fsconfig", "fsconfig", 3, 6, None, None, 0)   # FSCONFIG_CMD_CREATE on some fd
try_sc("fsmount", "fsmount", 3, 0, 0)
try_sc("open_tree", "open_tree", AT_FDCWD, "/", OPEN_TREE_CLONE | AT_RECURSIVE)
try_sc("move_mount", "move_mount", AT_FDCWD, "/proc", AT_FDCWD, "/mnt", 0)
attr = (ctypes.c_uint64 * 4)(0, MS_RDONLY, 0, 0)  # struct mount_attr: attr_clr = RDONLY
try_sc("mount_setattr", "mount_setattr", AT_FDCWD, "/usr", 0, ctypes.byref(attr), 32)
# What the sandbox's own mount table looks like afterwards.
with open("/proc/self/mountinfo") as f:
    info = f.read()
RESULT["marker_in_own_mountinfo"] = MARKER in info
usr = [l for l in info.splitlines() if l.split()[4] == "/usr"]
RESULT["usr_mount_options"] = usr[0].split()[5] if usr else None
emit()

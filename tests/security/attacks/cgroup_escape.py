# CVE-2022-0492 style: mount a cgroup v1 hierarchy, set release_agent, trigger it. Also: any
# cgroup file reachable at all, and the sandbox's view of its own cgroup paths.
os.makedirs("/tmp/sbxsec-cg", exist_ok=True)
try_sc("mount_cgroup_v1", "mount", "cgroup", "/tmp/sbxsec-cg", "cgroup", 0, "rdma")
try_sc("mount_cgroup_v1_memory", "mount", "cgroup", "/tmp/sbxsec-cg", "cgroup", 0, "memory")
try_sc("mount_cgroup2", "mount", "cgroup2", "/tmp/sbxsec-cg", "cgroup2", 0, None)
try_sc("unshare_cgroupns", "unshare", 0x02000000)  # CLONE_NEWCGROUP
with open("/proc/self/cgroup") as f:
    RESULT["proc_self_cgroup"] = f.read().splitlines()
with open("/proc/self/mountinfo") as f:
    RESULT["cgroup_mounts"] = [l for l in f.read().splitlines()
                               if l.split(" - ")[1].split()[0] in ("cgroup", "cgroup2")]
# Every cgroup control file the sandbox can find outside /proc and the read-only /usr view.
found = []
seen = 0
for top in [d for d in os.listdir("/") if d not in ("proc", "usr")]:
    for dirpath, dirnames, filenames in os.walk("/" + top):
        seen += len(filenames) + len(dirnames)
        if seen > 200000:
            break
        for n in filenames:
            if n in ("cgroup.procs", "release_agent", "notify_on_release", "tasks", "cgroup.kill"):
                found.append(os.path.join(dirpath, n))
RESULT["cgroup_files_found"] = found
for key, path, data in (("write_sys_cgroup_procs", "/sys/fs/cgroup/cgroup.procs", b"1"),
                        ("write_release_agent", "/sys/fs/cgroup/release_agent", b"/tmp/x")):
    o, fd = oserr(os.open, path, os.O_WRONLY)
    RESULT[key] = o if fd is None else oserr(os.write, fd, data)[0]
emit()

# What the sandbox's identity looks like: user namespace maps, namespace ids. argv: a file name
# to create in / as sandbox root (the test looks for its owner on the host).
for n in ("uid_map", "gid_map"):
    with open(f"/proc/self/{n}") as f:
        RESULT[n] = [l.split() for l in f.read().splitlines()]
for n in ("user", "time", "time_for_children", "mnt", "pid", "net"):
    RESULT[f"ns_{n}"] = oserr(os.readlink, f"/proc/self/ns/{n}")[1]
if ARGS:
    with open("/" + ARGS[0], "w") as f:
        f.write("owned by sandbox root\n")
    st = os.stat("/" + ARGS[0])
    RESULT["file_uid_inside"] = st.st_uid
emit()

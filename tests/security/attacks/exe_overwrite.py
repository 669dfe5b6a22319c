# runc CVE-2019-5736 style: overwrite the binary behind /proc/self/exe or /proc/1/exe (the agent)
# so that the host runs attacker code the next time it execs that binary.
import hashlib


def sha256_of(path):
    o, data = oserr(lambda: open(path, "rb").read())
    return hashlib.sha256(data).hexdigest() if data is not None else o


RESULT["agent_sha256_before"] = sha256_of("/proc/1/exe")
RESULT["self_exe"] = os.readlink("/proc/self/exe")
RESULT["agent_exe"] = oserr(os.readlink, "/proc/1/exe")[1]
# The agent's binary is a sealed memfd (a copy of the host file): try to open, write and
# truncate it. Host-backed binaries are only opened for writing (never written: if an open got
# through, the test reports it and the host file stays intact).
for mode_name, flags in (("wronly", os.O_WRONLY), ("rdwr_trunc", os.O_RDWR | os.O_TRUNC)):
    o, fd = oserr(os.open, "/proc/1/exe", flags)
    RESULT[f"open_agent_exe_{mode_name}"] = o
    if fd is not None:
        RESULT[f"write_agent_exe_{mode_name}"] = oserr(os.pwrite, fd, b"\x7fPWNED", 0)[0]
        RESULT[f"truncate_agent_exe_{mode_name}"] = oserr(os.ftruncate, fd, 0)[0]
        os.close(fd)
for key, path in (("self_exe", "/proc/self/exe"), ("python_on_usr", os.path.realpath("/usr/bin/python3")),
                  ("usr_bin_env", "/usr/bin/env")):
    o, fd = oserr(os.open, path, os.O_WRONLY)
    RESULT[f"open_{key}_wronly"] = o
    if fd is not None:
        os.close(fd)
# Replacing a host binary under its name: /usr is a read-only view. (Renamed straight back if
# it ever worked.)
o, _ = oserr(os.rename, "/usr/bin/env", "/usr/bin/env.sbxsec")
RESULT["rename_usr_bin_env"] = o
if o == "OK":
    os.rename("/usr/bin/env.sbxsec", "/usr/bin/env")
RESULT["agent_sha256_after"] = sha256_of("/proc/1/exe")
emit()

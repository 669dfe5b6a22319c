# Fill the writable layer until the file system refuses. argv: PATH to write, MAX_MIB (a bound,
# so that a missing quota still ends the attack instead of filling the host's disk).
path, max_mib = ARGS[0], int(ARGS[1])
block = b"\x5a" * (1 << 20)
written = 0
err = None
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    while written < max_mib << 20:
        n = os.write(fd, block)
        written += n
        if n < len(block):
            continue  # a short write: the next one reports why
    os.fsync(fd)
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
os.close(fd)
RESULT["written_bytes"] = written
RESULT["error"] = err
# Small writes elsewhere fail the same way once the layer is full.
if err:
    o, fd2 = oserr(os.open, path + ".2", os.O_WRONLY | os.O_CREAT, 0o644)
    RESULT["second_file"] = o if fd2 is None else oserr(os.write, fd2, b"x" * (1 << 20))[0]
emit()

# Allocate (and touch) far more memory than the sandbox's limit. argv: MiB to allocate.
total = int(ARGS[0])
chunks = []
for i in range(total // 8):
    chunks.append(b"\xa5" * (8 << 20))   # a filled bytes object: every page is touched
    if i % 8 == 7:
        sys.stdout.write(f"allocated {(i + 1) * 8} MiB\n")
        sys.stdout.flush()
RESULT["allocated_mib"] = total
emit()

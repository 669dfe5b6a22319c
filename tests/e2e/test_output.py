"""Output streaming: volume, binary data, stream separation, retention."""

import hashlib
import random
import time

MIB = 1024 * 1024


def gen_program(seed: int, size: int, stream: str = "stdout", hash_to: str = "stderr") -> str:
    """A python3 program writing `size` deterministic bytes to `stream` and their SHA-256 to `hash_to`."""
    return (
        "import hashlib, random, sys\n"
        f"d = random.Random({seed}).randbytes({size})\n"
        f"out = sys.{stream}.buffer\n"
        "for i in range(0, len(d), 1 << 20):\n"
        "    out.write(d[i:i + (1 << 20)])\n"
        "out.flush()\n"
        f"sys.{hash_to}.write(hashlib.sha256(d).hexdigest() + '\\n')\n"
    )


def test_50mib_stdout_byte_exact(api, sandbox, metrics, record_property):
    size = 50 * MIB
    expected = hashlib.sha256(random.Random(20240601).randbytes(size)).hexdigest()
    t0 = time.monotonic()
    result = api.run(sandbox["id"], ["python3", "-c", gen_program(20240601, size)], max_seconds=300,
                     keep_events=False)
    secs = time.monotonic() - t0
    assert result.exit["exit_code"] == 0, (result.exit, result.stderr[-500:])
    assert result.stderr.decode().strip() == expected, f"the command's own hash: {result.stderr[:200]!r}"
    assert len(result.stdout) == size, f"received {len(result.stdout)} of {size} bytes"
    assert hashlib.sha256(result.stdout).hexdigest() == expected, "50 MiB stdout corrupted in transit"
    rate = size / MIB / secs
    line = f"50 MiB stdout through SSE (session create to process_exited): {secs:.2f} s, {rate:.1f} MiB/s"
    metrics.append(line)
    record_property("stdout_mib_per_s", round(rate, 1))
    print(line)


def test_binary_output_byte_exact(api, sandbox):
    # Every byte value, NULs, and byte sequences that are not valid UTF-8.
    payload = (bytes(range(256)) * 3 + b"\xff\xfe\xc3\x28\xed\xa0\x80\xf0\x28\x8c\x28\xc0\xaf"
               + b"\x00\r\n\x00\x80" + b"\xe2\x82")  # ends inside a multi-byte sequence
    code = ("import sys\n"
            f"d = bytes.fromhex('{payload.hex()}')\n"
            "sys.stdout.buffer.write(d); sys.stdout.flush()\n"
            "sys.stderr.buffer.write(d[::-1]); sys.stderr.flush()\n")
    result = api.run(sandbox["id"], ["python3", "-c", code])
    assert result.exit["exit_code"] == 0, result.exit
    assert result.stdout == payload
    assert result.stderr == payload[::-1]


def test_stdout_stderr_separated_with_offsets(api, sandbox):
    code = ("import sys, time\n"
            "for i in range(30):\n"
            "    sys.stdout.write(f'out{i};'); sys.stdout.flush()\n"
            "    sys.stderr.write(f'err{i};'); sys.stderr.flush()\n"
            "    time.sleep(0.005)\n")
    result = api.run(sandbox["id"], ["python3", "-c", code])  # collect() checks offsets per stream
    assert result.exit["exit_code"] == 0
    assert result.stdout == "".join(f"out{i};" for i in range(30)).encode()
    assert result.stderr == "".join(f"err{i};" for i in range(30)).encode()
    kinds = [e.event for e in result.events]
    assert kinds.count("stdout") >= 2 and kinds.count("stderr") >= 2, \
        f"expected several chunks per stream to check offsets: {kinds}"


def test_large_interleaved_streams(api, sandbox):
    size = 3 * MIB
    code = ("import random, sys\n"
            f"a = random.Random(1).randbytes({size}); b = random.Random(2).randbytes({size})\n"
            "for i in range(0, len(a), 65536):\n"
            "    sys.stdout.buffer.write(a[i:i + 65536]); sys.stdout.flush()\n"
            "    sys.stderr.buffer.write(b[i:i + 65536]); sys.stderr.flush()\n")
    result = api.run(sandbox["id"], ["python3", "-c", code], max_seconds=120)
    assert result.exit["exit_code"] == 0, result.exit
    assert result.stdout == random.Random(1).randbytes(size), "stdout corrupted"
    assert result.stderr == random.Random(2).randbytes(size), "stderr corrupted"


def test_resync_when_last_event_id_is_no_longer_retained(api, sandbox):
    size = 20 * MIB  # more than the 8 MiB retained per stream
    full_expected = random.Random(99).randbytes(size)
    first = api.run(sandbox["id"], ["python3", "-c", gen_program(99, size, hash_to="stderr")],
                    max_seconds=180)
    assert first.exit["exit_code"] == 0
    assert first.stdout == full_expected
    first_id = first.events[0].id
    with api.attach(first.session, last_event_id=first_id) as stream:
        again = api.collect(stream, max_seconds=120)
    kinds = [e.event for e in again.events]
    assert kinds[0] == "resync_required", f"expected resync_required first, got {kinds[:3]}"
    rs = again.events[0].data
    assert isinstance(rs["oldest_available_id"], int) and rs["oldest_available_id"] > first_id + 1, rs
    assert again.events[1].id == rs["oldest_available_id"], (again.events[1].id, rs)
    assert 0 < rs["stdout_offset"] < size, rs
    retained = size - rs["stdout_offset"]
    assert retained <= 9 * MIB, f"retains {retained} bytes of stdout, more than the 8 MiB default"
    assert again.stdout == full_expected[rs["stdout_offset"]:], "continuation after resync is not byte-exact"
    assert again.exit == first.exit

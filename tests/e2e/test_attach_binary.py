"""The binary attach stream (docs/api.md, "attach", binary form): how a client asks for it, its
framing, and that it carries exactly what the SSE form carries (ids, offsets, bytes, resume,
resync, the exit event last), also for a large output read slowly."""

import base64
import hashlib
import json
import random
import struct
import time
from dataclasses import dataclass

from sbx_client import check_error_body
from test_output import MIB, gen_program

BINARY = "application/vnd.sbx.attach+binary"
HEADER = struct.Struct(">B3sIQQ")  # kind, zero, length, id, offset
KINDS = {0: "keepalive", 1: "stdout", 2: "stderr", 3: "resync_required", 4: "error",
         5: "process_exited"}


@dataclass
class Frame:
    kind: str
    id: int
    offset: int
    payload: bytes

    @property
    def data(self):
        """The JSON of a control frame (as SSE's data:)."""
        return json.loads(self.payload)


def open_binary(api, session, *, params=None, headers=None, last_event_id=None, query=True):
    """Opens the binary form (by ?format=binary unless `query` is False: then by Accept)."""
    sid = session["session_id"] if isinstance(session, dict) else session
    tok = session["attach"]["token"] if isinstance(session, dict) else api.token
    params = dict(params or {})
    headers = dict(headers or {})
    if query:
        params.setdefault("format", "binary")
    else:
        headers.setdefault("Accept", BINARY)
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    resp = api.call("GET", f"/v1/sessions/{sid}/attach", headers=headers, token=tok,
                    params=params, stream=True, timeout=120, expect=200)
    return resp


def frames(resp, *, slow: float = 0.0, read_size: int = 1 << 16):
    """Parses the framed body; `slow` sleeps that long after each read (a slow reader)."""
    assert resp.headers.get("Content-Type", "").split(";")[0].strip() == BINARY, resp.headers
    buf = b""
    for chunk in resp.iter_content(chunk_size=read_size):
        buf += chunk
        while len(buf) >= HEADER.size:
            kind, zero, length, ev_id, offset = HEADER.unpack_from(buf)
            assert zero == b"\0\0\0", f"reserved header bytes must be zero: {buf[:24]!r}"
            assert kind in KINDS, f"unknown frame kind {kind}"
            if len(buf) < HEADER.size + length:
                break
            payload = buf[HEADER.size:HEADER.size + length]
            buf = buf[HEADER.size + length:]
            yield Frame(KINDS[kind], ev_id, offset, payload)
        if slow:
            time.sleep(slow)
    assert buf == b"", f"the stream ended inside a frame: {len(buf)} bytes left"


def collect(resp, *, first_id=None, stdout_offset=0, stderr_offset=0, slow=0.0):
    """Reads to the end, checking what `SbxClient.collect` checks of SSE: ids increase by one,
    offsets are contiguous per stream, the exit frame is last."""
    out = {"stdout": bytearray(), "stderr": bytearray()}
    offsets = {"stdout": stdout_offset, "stderr": stderr_offset}
    got, exit_frame = [], None
    prev = first_id - 1 if first_id is not None else None
    try:
        for f in frames(resp, slow=slow):
            assert exit_frame is None, f"frame after process_exited: {f.kind}"
            if f.kind == "keepalive":
                assert f.payload == b"" and f.id == 0 and f.offset == 0, f
                continue
            got.append(f)
            if f.kind in ("resync_required", "error"):
                assert f.id == 0 and f.offset == 0, f
            else:
                assert f.id > 0, f
                if prev is not None:
                    assert f.id == prev + 1, f"ids must increase by one: {prev} then {f.id}"
                prev = f.id
            if f.kind in ("stdout", "stderr"):
                assert f.offset == offsets[f.kind], \
                    f"{f.kind} offset {f.offset} != bytes so far {offsets[f.kind]} (id {f.id})"
                out[f.kind] += f.payload
                offsets[f.kind] += len(f.payload)
            elif f.kind == "resync_required":
                d = f.data
                offsets["stdout"], offsets["stderr"] = d["stdout_offset"], d["stderr_offset"]
                prev = d["oldest_available_id"] - 1
            elif f.kind == "process_exited":
                assert f.offset == 0, f
                exit_frame = f
    finally:
        resp.close()
    return bytes(out["stdout"]), bytes(out["stderr"]), got, exit_frame


def sse_events(api, session, **kw):
    with api.attach(session, **kw) as s:
        return api.collect(s, max_seconds=120)


MIXED = (
    "import sys\n"
    "for i in range(300):\n"
    "    sys.stdout.write(f'out {i}\\n'); sys.stdout.flush()\n"
    "    if i % 7 == 0:\n"
    "        sys.stderr.write(f'err {i}\\n'); sys.stderr.flush()\n"
    "sys.stdout.buffer.write(bytes(range(256)) * 40); sys.exit(3)\n"
)


def test_binary_carries_what_sse_carries(api, sandbox):
    session = api.create_session(sandbox["id"], ["python3", "-c", MIXED])
    stdout, stderr, got, exit_frame = collect(open_binary(api, session))
    assert exit_frame is not None and got[-1] is exit_frame, "process_exited must be the last frame"
    assert exit_frame.data == {"exit_code": 3, "signal": None, "timed_out": False,
                               "oom_killed": False}, exit_frame.data
    lines = stdout[:stdout.index(bytes(range(256)))].decode().splitlines()
    assert lines == [f"out {i}" for i in range(300)]
    assert stdout.endswith(bytes(range(256)) * 40)
    assert stderr.decode().splitlines() == [f"err {i}" for i in range(0, 300, 7)]

    # A replay in SSE: the same events, ids, offsets and bytes; the same exit JSON.
    sse = sse_events(api, session)
    assert [(e.id, e.event) for e in sse.events] == [(f.id, f.kind) for f in got]
    for e, f in zip(sse.events, got):
        if e.event in ("stdout", "stderr"):
            assert e.data["offset"] == f.offset
            assert base64.b64decode(e.data["data_b64"]) == f.payload
    assert sse.exit == exit_frame.data
    assert (sse.stdout, sse.stderr) == (stdout, stderr)


def test_binary_chosen_by_accept_and_format(api, sandbox):
    session = api.create_session(sandbox["id"], ["echo", "hi"])
    # Accept alone picks the binary form.
    stdout, _, got, exit_frame = collect(open_binary(api, session, query=False))
    assert stdout == b"hi\n" and exit_frame is not None
    # format=sse wins over Accept.
    sid = session["session_id"]
    resp = api.call("GET", f"/v1/sessions/{sid}/attach", headers={"Accept": BINARY},
                    params={"format": "sse"}, stream=True, expect=200)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    resp.close()
    # Without either: SSE, as before.
    with api.attach(session) as s:
        r = api.collect(s)
    assert r.stdout == b"hi\n"
    # A format that is neither is a 400 naming the parameter.
    for bad in ("BINARY", "json", ""):
        resp = api.call("GET", f"/v1/sessions/{sid}/attach", params={"format": bad}, expect=400)
        check_error_body(resp, resp.body, "invalid_argument", field="format")


def test_binary_resume_after_id(api, sandbox):
    session = api.create_session(sandbox["id"], ["python3", "-c", MIXED])
    _, _, got, _ = collect(open_binary(api, session))
    output = [f for f in got if f.kind in ("stdout", "stderr")]
    assert len(output) >= 2, [f.kind for f in got]
    cut = output[len(output) // 2]
    want = [(f.id, f.kind, f.offset, f.payload) for f in got if f.id > cut.id]
    # Last-Event-ID as a header, then as last_event_id in the query: the frames after it.
    for kw in ({"last_event_id": cut.id}, {"params": {"last_event_id": str(cut.id)}}):
        resp = open_binary(api, session, **kw)
        rest = [f for f in frames(resp) if f.kind != "keepalive"]
        resp.close()
        assert [(f.id, f.kind, f.offset, f.payload) for f in rest] == want, \
            "a resumed stream differs from the frames after the id"
        assert rest[-1].kind == "process_exited"


def test_binary_resync_then_contiguous(api, sandbox):
    size = 20 * MIB  # more than the 8 MiB retained per stream
    expected = random.Random(7).randbytes(size)
    session = api.create_session(sandbox["id"], ["python3", "-c", gen_program(7, size)])
    stdout, _, got, exit_frame = collect(open_binary(api, session))
    assert stdout == expected and exit_frame.data["exit_code"] == 0
    first_id = got[0].id
    again_out, _, again, exit2 = collect(open_binary(api, session, last_event_id=first_id))
    assert again[0].kind == "resync_required", [f.kind for f in again[:3]]
    rs = again[0].data
    assert set(rs) == {"oldest_available_id", "stdout_offset", "stderr_offset"}, rs
    assert again[1].id == rs["oldest_available_id"] > first_id + 1, (again[1].id, rs)
    assert 0 < rs["stdout_offset"] < size
    assert again_out == expected[rs["stdout_offset"]:], "continuation after resync not exact"
    assert exit2.data == exit_frame.data


def test_binary_large_output_slow_reader_loses_nothing(api, sandbox):
    size = 24 * MIB  # three times what the agent retains: the process must wait for the reader
    expected = random.Random(31).randbytes(size)
    session = api.create_session(sandbox["id"], ["python3", "-c", gen_program(31, size)])
    stdout, stderr, got, exit_frame = collect(open_binary(api, session), slow=0.002)
    assert exit_frame is not None and exit_frame.data["exit_code"] == 0, exit_frame
    assert len(stdout) == size, f"received {len(stdout)} of {size} bytes"
    assert hashlib.sha256(stdout).hexdigest() == hashlib.sha256(expected).hexdigest()
    assert stderr.decode().strip() == hashlib.sha256(expected).hexdigest()
    assert not [f for f in got if f.kind in ("resync_required", "error")]


def test_binary_attach_token_scope(api, sandbox):
    a = api.create_session(sandbox["id"], ["echo", "a"])
    b = api.create_session(sandbox["id"], ["echo", "b"])
    # Another session's attach token, a garbage token, no token: 401 as for SSE; nothing starts.
    for tok in (a["attach"]["token"], "garbage-token", None):
        resp = api.call("GET", f"/v1/sessions/{b['session_id']}/attach", token=tok,
                        params={"format": "binary"})
        assert resp.status_code == 401, f"token {tok!r} on another session: {resp.status_code}"
    assert api.get_session(b["session_id"])["state"] == "created"
    stdout, _, _, exit_frame = collect(open_binary(api, b))
    assert stdout == b"b\n" and exit_frame is not None

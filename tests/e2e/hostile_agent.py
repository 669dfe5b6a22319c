#!/usr/bin/env python3
"""An sbx-agent that a guest has taken over: it speaks the agent protocol
(src/protocol/protocol.h) but answers "processes" and "list" with replies chosen to make sbxd
hold as much as it can (issue 13, finding 6). Started by the fake runtime in place of
sbx-agent (`--agent-path`), with the same arguments. What it sends is read, per request, from
the file `mode` beside this script's `--listen` socket's directory's parent run dir
(HOSTILE_MODE_FILE in the sandbox's env wins), so one daemon serves every case.

Modes (for "processes" and "list"):
  at_limits        a 4 MiB reply inside every bound (sbxd must accept it)
  huge_frame       a response header announcing 16 MiB, then the bytes, slowly
  argv_flood       one process with 1,000,000 empty argv entries in a 4 MiB frame
  deep             400,000 levels of nesting
  long_field       a comm of 1 MiB
  many_entries     5,000 entries
  not_json         4 MiB of garbage
  small            one ordinary entry
"""
import json
import os
import socket
import struct
import sys
import threading

VERSION = 1
HELLO, REQUEST, RESPONSE = 1, 2, 3
MIB = 1 << 20


def frame(ftype: int, payload: bytes) -> bytes:
    return struct.pack(">IBBH", len(payload), VERSION, ftype, 0) + payload


def read_frame(conn: socket.socket):
    head = b""
    while len(head) < 8:
        chunk = conn.recv(8 - len(head))
        if not chunk:
            return None
        head += chunk
    length, _version, ftype, _ = struct.unpack(">IBBH", head)
    body = b""
    while len(body) < length:
        chunk = conn.recv(min(1 << 16, length - len(body)))
        if not chunk:
            return None
        body += chunk
    return ftype, body


def process(pid: int, argv: list[str], comm: str = "x") -> dict:
    return {"pid": pid, "ppid": 1, "pgid": pid, "state": "S", "comm": comm, "argv": argv,
            "argv_truncated": False, "uid": 0, "user": "root", "started_at": None,
            "session_id": None}


def entry(i: int) -> dict:
    name = f"f{i:06d}" + "n" * 200
    return {"name": name, "path": "/d/" + name, "type": "file", "size": i, "mode": 0o644,
            "uid": 0, "gid": 0, "mtime": "2026-01-01T00:00:00.000Z"}


def listing(op: str, items: list) -> bytes:
    key = "processes" if op == "processes" else "entries"
    return json.dumps({"ok": True, key: items, "truncated": False}, separators=(",", ":")).encode()


def reply(op: str, mode: str) -> bytes | None:
    if mode == "at_limits":
        if op == "processes":
            # 120 x 256 x 126-byte argv: ~3.9 MiB, every bound kept.
            return listing(op, [process(100 + i, ["a" * 126] * 256) for i in range(120)])
        one = len(json.dumps(entry(0), separators=(",", ":"))) + 1
        return listing(op, [entry(i) for i in range((4 * MIB - 65536) // (one + 8))])
    if mode == "argv_flood":
        items = [process(7, [""] * 1_000_000)] if op == "processes" else [
            {"name": "", "path": ""} for _ in range(300_000)]
        return listing(op, items)
    if mode == "deep":
        return b'{"ok":true,"processes":[{"argv":' + b"[" * 400_000 + b"]" * 400_000 + b"}]}"
    if mode == "long_field":
        items = [process(7, ["x"], comm="c" * MIB)] if op == "processes" else [
            dict(entry(0), name="n" * MIB)]
        return listing(op, items)
    if mode == "many_entries":
        items = [process(i, []) for i in range(5000)] if op == "processes" else [
            {"name": "a"} for _ in range(10_001)]
        return listing(op, items)
    if mode == "not_json":
        return b"{" + b"\xff" * (4 * MIB - 2)
    if mode == "small":
        return listing(op, [process(7, ["sleep", "9"])] if op == "processes" else [entry(0)])
    return None


def serve(conn: socket.socket, mode_file: str) -> None:
    with conn:
        hello = read_frame(conn)
        req = read_frame(conn)
        if not hello or not req:
            return
        try:
            request = json.loads(req[1])
        except ValueError:
            return
        op = request.get("op")
        conn.sendall(frame(HELLO, json.dumps({"version": VERSION, "role": "agent"}).encode()))
        try:
            with open(mode_file) as f:
                mode = f.read().strip()
        except OSError:
            mode = "small"
        if op == "ping":
            conn.sendall(frame(RESPONSE, b'{"ok":true}'))
            return
        if op in ("processes", "list"):
            if mode == "huge_frame":
                try:
                    conn.sendall(struct.pack(">IBBH", 16 * MIB, VERSION, RESPONSE, 0))
                    for _ in range(16):
                        conn.sendall(b" " * MIB)
                except OSError:
                    pass  # sbxd hangs up on the header: what it should do
                return
            payload = reply(op, mode)
            if payload is not None:
                try:
                    conn.sendall(frame(RESPONSE, payload))
                except OSError:
                    pass
                return
        err = {"ok": False, "error": {"code": "unimplemented", "message": f"hostile agent: {op}"}}
        conn.sendall(frame(RESPONSE, json.dumps(err).encode()))


def main() -> None:
    args = sys.argv[1:]
    listen = args[args.index("--listen") + 1]
    # The file `hostile-mode` in the nearest directory above the sandbox's root (the test puts
    # it in sbxd's state dir): the fake runtime gives the agent no environment of sbxd's.
    mode_file = ""
    d = os.path.abspath(args[args.index("--root") + 1]) if "--root" in args else "/"
    while True:
        if os.path.exists(os.path.join(d, "hostile-mode")):
            mode_file = os.path.join(d, "hostile-mode")
            break
        if d == "/":
            break
        d = os.path.dirname(d)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(listen)
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, mode_file), daemon=True).start()


if __name__ == "__main__":
    main()

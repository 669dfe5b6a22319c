"""Starting tests/e2e/port_server.py in a sandbox (test_ports.py, tests/security/
test_port_tokens.py, bench/port_exposure.py)."""
from __future__ import annotations

import base64
from pathlib import Path

SERVER = (Path(__file__).parent / "port_server.py").read_text()


def start_server(api, sandbox_id: str, port: int, *addrs: str) -> dict:
    """Starts port_server.py in the sandbox and returns once it printed "ready". The attach
    stream is closed then: the process goes on (it ends with the sandbox)."""
    session = api.create_session(sandbox_id, ["python3", "-c", SERVER, str(port), *addrs])
    out = b""
    with api.attach(session) as stream:
        for ev in stream.events():
            if ev.event in ("stdout", "stderr"):
                out += base64.b64decode(ev.data["data_b64"])
                if b"ready" in out:
                    return session
            if ev.event == "process_exited":
                break
    raise AssertionError(f"port server did not start: {out[-2000:]!r}")


def websocket_echo(ws) -> None:
    """Text and a 300 KB binary message through the echo server's WebSocket, then a clean close;
    the socket is closed whatever happens."""
    import os
    from ws_client import OP_BINARY, OP_TEXT
    try:
        ws.send_frame(OP_TEXT, b"hello")
        assert ws.recv() == (OP_TEXT, b"hello")
        big = os.urandom(300_000)
        ws.send_binary(big)
        assert ws.recv() == (OP_BINARY, big)
        ws.close()
    finally:
        ws.sock.close()

"""A minimal WebSocket client (RFC 6455) on the standard library, for the e2e tests: enough to
drive /v1/sessions/{id}/ws (handshake, masked client frames, fragmented server messages,
ping/pong, close). Not a general-purpose client."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
from urllib.parse import urlsplit

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


class HandshakeError(Exception):
    def __init__(self, status: int, headers: dict, body: bytes):
        super().__init__(f"WebSocket handshake refused: {status} {body[:300]!r}")
        self.status, self.headers, self.body = status, headers, body


class WsClient:
    def __init__(self, base_url: str, path: str, token: str | None, timeout: float = 30.0,
                 extra_headers: dict | None = None, ssl_context: ssl.SSLContext | None = None,
                 host: str | None = None):
        """An https:// `base_url` needs `ssl_context` (SbxClient.ssl_context()); `host` is
        the Host header and the TLS server name (default: the URL's host)."""
        u = urlsplit(base_url)
        host = host or u.hostname
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        if u.scheme == "https":
            assert ssl_context is not None, "an https:// URL needs an ssl_context"
            try:
                self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)
            except BaseException:
                self.sock.close()
                raise
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{u.port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        lines += [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ")[1])
        headers = {}
        for line in header_lines:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.headers = headers
        if status != 101:
            length = int(headers.get("content-length", "0"))
            while len(self.buf) < length:
                self._fill()
            body = self.buf[:length]
            self.sock.close()
            raise HandshakeError(status, headers, body)
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        assert headers.get("sec-websocket-accept") == accept, f"bad Sec-WebSocket-Accept: {headers}"
        self.closed = False

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed by the server")
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send_binary(self, data: bytes) -> None:
        self.send_frame(OP_BINARY, data)

    def send_json(self, obj) -> None:
        self.send_frame(OP_TEXT, json.dumps(obj).encode())

    def recv(self) -> tuple[int, bytes]:
        """The next message: (OP_TEXT|OP_BINARY, payload), or (OP_CLOSE, payload) once."""
        message_op, parts = None, []
        while True:
            b0, b1 = self._take(2)
            fin, opcode = b0 & 0x80, b0 & 0x0F
            assert not b1 & 0x80, "server frames must not be masked"
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._take(8))[0]
            payload = self._take(n)
            if opcode == OP_PING:
                self.send_frame(OP_PONG, payload)
                continue
            if opcode == OP_PONG:
                continue
            if opcode == OP_CLOSE:
                if not self.closed:
                    self.send_frame(OP_CLOSE, payload[:2])
                    self.closed = True
                return OP_CLOSE, payload
            if opcode != OP_CONT:
                message_op = opcode
            parts.append(payload)
            if fin:
                return message_op, b"".join(parts)

    def close(self) -> None:
        try:
            if not self.closed:
                self.send_frame(OP_CLOSE, struct.pack("!H", 1000))
                self.closed = True
        except OSError:
            pass
        self.sock.close()

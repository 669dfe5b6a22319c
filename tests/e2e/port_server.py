"""The server the port-exposure tests start inside a sandbox (python3 -c, standard library only):
    python3 -c SOURCE PORT ADDR [ADDR...]     e.g. 8000 127.0.0.1 ::1
Prints "ready" once every address is bound. Routes:
    GET  /headers            {"path", "headers"} as the server saw them
    GET  /peer               {"peer": "ADDR:PORT"}: the connection's far end (which connection
                             of sbxd's carried the request)
    GET  /drop               {"peer"} as a keep-alive answer, then closes the connection without
                             saying so (what a server does to an idle kept connection)
    POST /sum                {"length", "sha256"} of the body (Content-Length or chunked)
    GET  /bytes?n=N          N bytes (a repeating pattern), chunked
    GET  /sse                event "one"; waits for GET /release; event "two"; end
    GET  /release            lets /sse go on
    GET  /silent             reads the request and never answers (for at most 120 s)
    GET  /ws                 WebSocket echo (text and binary), until the client closes
"""
import base64
import hashlib
import json
import socket
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATE = threading.Event()
PATTERN = bytes(range(256)) * 256  # 64 KiB


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A response in one write (flushed after each request and stream piece), without Nagle:
    # otherwise headers and body go in two segments and a direct client waits out its delayed ACK.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/headers":
            return self._json({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        if path in ("/peer", "/drop"):
            self._json({"peer": "%s:%d" % self.client_address[:2]})
            if path == "/drop":
                self.wfile.flush()
                self.close_connection = True
            return
        if path == "/bytes":
            n = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("n", "0"))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while n > 0:
                part = PATTERN[: min(n, len(PATTERN))]
                self._chunk(part)
                n -= len(part)
            self.wfile.write(b"0\r\n\r\n")
            return
        if path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"event: one\ndata: 1\n\n")
            GATE.wait(60)
            self._chunk(b"event: two\ndata: 2\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if path == "/silent":
            threading.Event().wait(120)
            return
        if path == "/release":
            GATE.set()
            return self._json({"released": True})
        if path == "/ws":
            return self._websocket()
        self._json({"error": "no such path", "path": self.path}, 404)

    def do_POST(self):
        h = hashlib.sha256()
        n = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                left = size
                while left:
                    part = self.rfile.read(min(left, 1 << 16))
                    h.update(part)
                    n += len(part)
                    left -= len(part)
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                part = self.rfile.read(min(left, 1 << 16))
                if not part:
                    break
                h.update(part)
                n += len(part)
                left -= len(part)
        self._json({"length": n, "sha256": h.hexdigest()})

    def _websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                break
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack("!H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = r.read(n)
            if n:  # unmask in one big-integer XOR (fast enough for the throughput bench)
                m = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
                data = (int.from_bytes(data, "big") ^ m).to_bytes(n, "big")
            if op == 8:
                self.wfile.write(b"\x88\x02\x03\xe8")
                self.wfile.flush()
                break
            if op == 9:
                continue
            if n < 126:
                out = struct.pack("!BB", 0x80 | op, n)
            elif n < 65536:
                out = struct.pack("!BBH", 0x80 | op, 126, n)
            else:
                out = struct.pack("!BBQ", 0x80 | op, 127, n)
            self.wfile.write(out + data)
            self.wfile.flush()
        self.close_connection = True


class V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def main():
    port = int(sys.argv[1])
    servers = []
    for addr in sys.argv[2:]:
        cls = V6Server if ":" in addr else ThreadingHTTPServer
        cls.daemon_threads = True
        servers.append(cls((addr, port), Handler))
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


main()

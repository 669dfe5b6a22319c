"""sbxd's HTTP front door over raw sockets (issue 13, findings 2 and 3).

Framing (RFC 9112 §6): a corpus of requests whose framing is ambiguous or broken. For each,
the status sbxd answers AND whether the connection stays open: a second request is pipelined
behind every case, and must be answered only when the first was framed unambiguously. A
server that answered `Transfer-Encoding: xchunked` + `Content-Length: 0` and then served the
bytes after it as a second request (the battery's finding) is a request-smuggling target.

Resources per client: the global and per-address connection caps, the reserve that keeps
/healthz and the admin token served at the caps (from another loopback address, 127.0.0.2),
refusals answered at once with 503, the short deadline for a request's header (silent and
trickled), the fd limit (EMFILE) shed without a log line every 50 ms, and sbxd's fd count back
near its start once the idle connections are gone.

Each test starts its own sbxd (conftest's Daemon, runtime `fake`: the HTTP server is the same
whatever the runtime, and the caps are configured small through sbxd's flags).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import Daemon, build_dir, shutdown, skip_or_fail

HEADER_TIMEOUT_S = 2
IO_TIMEOUT_S = 15  # generous: a loaded 2-core machine
PIPELINED = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


# ---- raw HTTP/1.1 over a socket ------------------------------------------------------------------

class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def __repr__(self) -> str:
        return f"<{self.status} {self.headers} {self.body[:200]!r}>"


def parse_responses(data: bytes) -> list[Response]:
    """Every complete response in `data` (bodies by Content-Length or chunked)."""
    out = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out
        head = data[:end].decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        rest = data[end + 4:]
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                eol = rest.find(b"\r\n")
                if eol < 0:
                    return out
                size = int(rest[:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + size + 2:
                    return out
                body += rest[eol + 2:eol + 2 + size]
                rest = rest[eol + 2 + size + 2:]
                if size == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            if len(rest) < n:
                return out
            body, rest = rest[:n], rest[n:]
        out.append(Response(status, headers, body))
        data = rest


def connect(port: int, source: str = "127.0.0.1", timeout: float = IO_TIMEOUT_S) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
    except BaseException:
        s.close()
        raise
    return s


def read_until_closed(s: socket.socket, timeout: float = IO_TIMEOUT_S) -> tuple[bytes, bool]:
    """What the server sends until it closes (True) or `timeout` passes (False)."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False



def healthz_ok(s: socket.socket, what: str = "") -> None:
    """GET /healthz on the connection, answered 200."""
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    r = read_response(s)
    assert r is not None and r.status == 200, what or r


def wait_closed(s: socket.socket, timeout: float) -> tuple[bytes, bool, float]:
    """read_until_closed, and how long the wait took."""
    start = time.monotonic()
    data, closed = read_until_closed(s, timeout=timeout)
    return data, closed, time.monotonic() - start

def read_response(s: socket.socket, timeout: float = IO_TIMEOUT_S) -> Response | None:
    """One response, leaving the connection open; None if it closed first."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = parse_responses(data)
        if got:
            return got[0]
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return None


def exchange(port: int, payload: bytes, source: str = "127.0.0.1") -> tuple[list[Response], bool, bytes]:
    """Sends `payload` from a thread (a large one may block while sbxd answers early) and reads
    until sbxd closes. Returns the responses, whether it closed, and the raw bytes."""
    s = connect(port, source)
    errors: list[BaseException] = []

    def send():
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # sbxd answered and closed before taking it all: what the case may expect
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    t = threading.Thread(target=send, daemon=True)
    try:
        t.start()
        data, closed = read_until_closed(s)
    finally:
        t.join(IO_TIMEOUT_S)
        s.close()
    assert not errors, errors
    return parse_responses(data), closed, data


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(predicate, what: str, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)


def metric(daemon: Daemon, name: str, **labels) -> float:
    """One sample of /metrics (admin token), 0 when the series is absent."""
    port = int(daemon.url.rsplit(":", 1)[1])
    s = connect(port, "127.0.0.9")
    try:
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {daemon.token}\r\n"
                  "Connection: close\r\n\r\n".encode())
        data, _ = read_until_closed(s)
    finally:
        s.close()
    got = parse_responses(data)
    assert got and got[0].status == 200, data[:500]
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in got[0].body.decode().splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def own_sbxd(validator):
    """Starts sbxd (runtime fake, no warm pool) with the given flags; stops it afterwards."""
    started: list[Daemon] = []

    def start(*flags: str) -> tuple[Daemon, int]:
        d = Daemon(extra_args=["--warm-pool", "base=0", *flags])
        d.runtime = "fake"
        started.append(d)
        d.start()
        return d, int(d.url.rsplit(":", 1)[1])

    yield start
    problems = []
    for d in started:
        problems += shutdown(d, validator, [])
    if problems:
        pytest.fail("stopping the test's sbxd: " + "; ".join(problems))


def wait_idle(daemon: Daemon):
    """Until sbxd has closed every connection but the scrape's (it closes asynchronously after
    the clients): the fixture's teardown then talks to it from 127.0.0.1 again."""
    wait_for(lambda: metric(daemon, "sbx_http_connections") <= 1, "sbxd to close the connections")


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


# ---- the framing corpus ------------------------------------------------------------------------
# (name, request bytes, status of the first response, whether the connection stays open).
# POST /healthz is 405 once its body has been read: a request the server framed and answered.

def post(*headers: str, body: bytes = b"", version: str = "1.1") -> bytes:
    head = f"POST /healthz HTTP/{version}\r\nHost: t\r\n" + "".join(h + "\r\n" for h in headers)
    return head.encode() + b"\r\n" + body


SMUGGLED = b"GET /v1/sandboxes HTTP/1.1\r\nHost: t\r\n\r\n"
CHUNKED_OK = b"5\r\nhello\r\n0\r\n\r\n"

CORPUS = [
    # Controls: well-framed requests keep the connection.
    ("get", b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n", 200, True),
    ("content-length", post("Content-Length: 5", body=b"hello"), 405, True),
    ("chunked", post("Transfer-Encoding: chunked", body=CHUNKED_OK), 405, True),
    ("chunked upper case", post("Transfer-Encoding: CHUNKED", body=CHUNKED_OK), 405, True),
    ("chunked with OWS", post("Transfer-Encoding:  chunked \t", body=CHUNKED_OK), 405, True),
    ("small chunk extension", post("Transfer-Encoding: chunked", body=b"5;a=b\r\nhello\r\n0\r\n\r\n"), 405, True),
    ("chunked trailer", post("Transfer-Encoding: chunked", body=b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"), 405, True),
    ("leading empty line", b"\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n", 200, True),
    ("http/1.0 with length", post("Content-Length: 5", "Connection: keep-alive", body=b"hello", version="1.0"), 405, True),
    ("connection close", b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 200, False),
    # The battery's finding: a Transfer-Encoding other than exactly `chunked`, with CL: 0.
    ("xchunked + CL 0", post("Transfer-Encoding: xchunked", "Content-Length: 0", body=SMUGGLED), 400, False),
    ("identity + CL 0", post("Transfer-Encoding: identity", "Content-Length: 0", body=SMUGGLED), 400, False),
    ("gzip + CL 0", post("Transfer-Encoding: gzip", "Content-Length: 0", body=SMUGGLED), 400, False),
    ("chunked, identity + CL 0", post("Transfer-Encoding: chunked, identity", "Content-Length: 0", body=SMUGGLED), 400, False),
    ("CL 0 + xchunked", post("Content-Length: 0", "Transfer-Encoding: xchunked", body=SMUGGLED), 400, False),
    # Transfer-Encoding alone.
    ("xchunked", post("Transfer-Encoding: xchunked", body=SMUGGLED), 400, False),
    ("identity", post("Transfer-Encoding: identity", body=SMUGGLED), 400, False),
    ("chunked, identity", post("Transfer-Encoding: chunked, identity", body=CHUNKED_OK), 400, False),
    ("gzip, chunked", post("Transfer-Encoding: gzip, chunked", body=CHUNKED_OK), 501, False),
    ("gzip then chunked fields", post("Transfer-Encoding: gzip", "Transfer-Encoding: chunked", body=CHUNKED_OK), 501, False),
    ("chunked, chunked", post("Transfer-Encoding: chunked, chunked", body=CHUNKED_OK), 400, False),
    ("chunked twice as fields", post("Transfer-Encoding: chunked", "Transfer-Encoding: chunked", body=CHUNKED_OK), 400, False),
    ("chunked with parameter", post("Transfer-Encoding: chunked;x=1", body=CHUNKED_OK), 400, False),
    ("empty element", post("Transfer-Encoding: , chunked", body=CHUNKED_OK), 400, False),
    ("empty value", post("Transfer-Encoding:", body=CHUNKED_OK), 400, False),
    ("garbage coding", post("Transfer-Encoding: chun\"ked", body=CHUNKED_OK), 400, False),
    ("chunked in HTTP/1.0", post("Transfer-Encoding: chunked", body=CHUNKED_OK, version="1.0"), 400, False),
    # Transfer-Encoding with Content-Length, both orders.
    ("chunked + CL", post("Transfer-Encoding: chunked", "Content-Length: 5", body=CHUNKED_OK), 400, False),
    ("CL + chunked", post("Content-Length: 5", "Transfer-Encoding: chunked", body=CHUNKED_OK), 400, False),
    # Content-Length.
    ("duplicate CL, same value", post("Content-Length: 5", "Content-Length: 5", body=b"hello"), 400, False),
    ("duplicate CL, different", post("Content-Length: 5", "Content-Length: 6", body=b"hello!"), 400, False),
    ("CL list", post("Content-Length: 5, 5", body=b"hello"), 400, False),
    ("CL negative", post("Content-Length: -1", body=b"hello"), 400, False),
    ("CL plus sign", post("Content-Length: +5", body=b"hello"), 400, False),
    ("CL hex", post("Content-Length: 0x5", body=b"hello"), 400, False),
    ("CL overflow", post("Content-Length: 99999999999999999999999", body=b"hello"), 400, False),
    ("CL empty", post("Content-Length:", body=b"hello"), 400, False),
    ("CL too large", post("Content-Length: 1099511627776", body=b"hello"), 413, False),
    # Header lines.
    ("obs-fold", post("X-A: a", " b", "Content-Length: 0"), 400, False),
    ("obs-fold with tab", post("X-A: a", "\tb", "Content-Length: 0"), 400, False),
    ("folded Transfer-Encoding", post("Transfer-Encoding:", " chunked", body=CHUNKED_OK), 400, False),
    ("whitespace before first field", b"POST /healthz HTTP/1.1\r\n Host: t\r\nContent-Length: 0\r\n\r\n", 400, False),
    ("space before colon", post("Content-Length : 0"), 400, False),
    ("tab before colon", post("Content-Length\t: 0"), 400, False),
    ("NUL in value", post("X-A: a\x00b", "Content-Length: 0"), 400, False),
    ("CR in value", post("X-A: a\rb", "Content-Length: 0"), 400, False),
    ("bare LF line end", b"POST /healthz HTTP/1.1\r\nHost: t\nContent-Length: 0\r\n\r\n", 400, False),
    ("empty field name", post(": x", "Content-Length: 0"), 400, False),
    ("bad char in name", post("X(A): 1", "Content-Length: 0"), 400, False),
    ("no Host", b"GET /healthz HTTP/1.1\r\n\r\n", 400, False),
    ("two Hosts", b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, False),
    ("header block too large", b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: " + b"a" * 20000 + b"\r\n\r\n", 431, False),
    # Versions.
    ("HTTP/2.0", b"GET /healthz HTTP/2.0\r\nHost: t\r\n\r\n", 400, False),  # Beast: bad version
    ("HTTP/1.2", b"GET /healthz HTTP/1.2\r\nHost: t\r\n\r\n", 400, False),
    ("bad version", b"GET /healthz HTTP/1.x\r\nHost: t\r\n\r\n", 400, False),
    # Chunks.
    ("chunk extension 8 KiB", post("Transfer-Encoding: chunked", body=b"5;a=" + b"b" * 8192 + b"\r\nhello\r\n0\r\n\r\n"), 400, False),
    ("chunk extension 8 MiB", post("Transfer-Encoding: chunked", body=b"5;a=" + b"b" * (8 << 20) + b"\r\nhello\r\n0\r\n\r\n"), 400, False),
    ("chunk size garbage", post("Transfer-Encoding: chunked", body=b"zz\r\nhello\r\n0\r\n\r\n"), 400, False),
    ("chunk size overflow", post("Transfer-Encoding: chunked", body=b"fffffffffffffffff1\r\nhello\r\n0\r\n\r\n"), 400, False),
    ("chunk size negative", post("Transfer-Encoding: chunked", body=b"-5\r\nhello\r\n0\r\n\r\n"), 400, False),
    ("chunk size 0x prefix", post("Transfer-Encoding: chunked", body=b"0x5\r\nhello\r\n0\r\n\r\n"), 400, False),
    ("chunk data too long", post("Transfer-Encoding: chunked", body=b"5\r\nhello!\r\n0\r\n\r\n"), 400, False),
    ("chunk line bare LF", post("Transfer-Encoding: chunked", body=b"5\nhello\r\n0\r\n\r\n"), 400, False),
]


@pytest.fixture(scope="module")
def framing_sbxd(validator):
    d = Daemon(extra_args=["--warm-pool", "base=0", "--header-timeout-s", str(HEADER_TIMEOUT_S)])
    d.runtime = "fake"
    try:
        d.start()
        yield d, int(d.url.rsplit(":", 1)[1])
    finally:
        problems = shutdown(d, validator, [])
        if problems:
            pytest.fail("stopping the framing sbxd: " + "; ".join(problems))


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 30
    assert len({c[0] for c in CORPUS}) == len(CORPUS), "case names must be unique"


@pytest.mark.parametrize("name,payload,status,stays_open", CORPUS, ids=[c[0] for c in CORPUS])
def test_framing(framing_sbxd, name, payload, status, stays_open):
    daemon, port = framing_sbxd
    responses, closed, raw = exchange(port, payload + PIPELINED)
    assert closed, f"{name}: sbxd did not close the connection within {IO_TIMEOUT_S}s; got {raw[:500]!r}"
    assert responses, f"{name}: no response; got {raw[:500]!r}"
    first = responses[0]
    assert first.status == status, f"{name}: expected {status}, got {first!r}"
    if stays_open:
        assert first.headers.get("connection", "").lower() != "close" or name == "connection close", first
        if name == "connection close":
            assert len(responses) == 1, f"{name}: answered after Connection: close: {responses!r}"
        else:
            assert len(responses) == 2, f"{name}: the pipelined request was not answered: {responses!r}"
            assert responses[1].status == 200, responses
    else:
        # Anything after a refused request is never read as a request (request smuggling).
        assert len(responses) == 1, f"{name}: the bytes after the refused request were served: {responses!r}"
        if status >= 400:
            assert first.headers.get("connection", "").lower() == "close", \
                f"{name}: a refusal must say Connection: close: {first!r}"
            err = json.loads(first.body)["error"]
            assert err["code"] and err["message"], err
    assert daemon.proc.poll() is None, f"sbxd died on {name}"


# ---- deadlines ---------------------------------------------------------------------------------

def test_silent_connection_closed_after_header_deadline(own_sbxd):
    daemon, port = own_sbxd("--header-timeout-s", str(HEADER_TIMEOUT_S))
    s = connect(port)
    try:
        data, closed, took = wait_closed(s, 30)
    finally:
        s.close()
    # The keep-alive idle timeout (75 s) must not apply before a first request.
    assert closed, "a connection that sent nothing was still open after 30 s"
    assert took >= HEADER_TIMEOUT_S * 0.5, f"closed after {took:.2f}s, before the deadline"
    assert data == b"", f"a silent connection gets no response: {data!r}"


def test_slowloris_header_trickle_closed(own_sbxd):
    daemon, port = own_sbxd("--header-timeout-s", str(HEADER_TIMEOUT_S))
    s = connect(port)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        start = time.monotonic()
        closed = False
        data = b""
        # One header byte every 200 ms: each read is quick, the header never completes.
        for i in range(150):  # 30 s at most
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            s.settimeout(0.2)
            try:
                chunk = s.recv(65536)
                if not chunk:
                    closed = True
                    break
                data += chunk
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
                break
        took = time.monotonic() - start
        if not closed:
            more, closed = read_until_closed(s, timeout=1)
            data += more
    finally:
        s.close()
    assert closed, f"a trickled header was still being read after {took:.1f}s"
    got = parse_responses(data)
    assert all(r.status == 408 for r in got), got
    assert daemon.proc.poll() is None


def test_keepalive_connection_waits_idle_timeout_then_header_deadline(own_sbxd):
    """Between requests the idle timeout applies (longer than the header deadline); once the
    next request's first byte is in, the header deadline does."""
    daemon, port = own_sbxd("--header-timeout-s", str(HEADER_TIMEOUT_S), "--idle-timeout-s", "30")
    s = connect(port)
    try:
        healthz_ok(s)
        time.sleep(HEADER_TIMEOUT_S * 2)
        healthz_ok(s, "an idle keep-alive connection was closed by the header deadline")
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # and then nothing
        data, closed = read_until_closed(s, timeout=25)
        assert closed, "a started header was not cut off by the header deadline"
        assert [x.status for x in parse_responses(data)] == [408], data
    finally:
        s.close()


def test_idle_keepalive_connection_closed_after_idle_timeout(own_sbxd):
    """A kept connection with no next request is closed once the idle timeout passes, silently
    (nothing of a request came, so nothing is answered), and not before."""
    daemon, port = own_sbxd("--header-timeout-s", "10", "--idle-timeout-s", "2")
    s = connect(port)
    try:
        for _ in range(3):  # the deadline moves with each request
            healthz_ok(s)
        data, closed, took = wait_closed(s, 20)
    finally:
        s.close()
    assert closed, "an idle keep-alive connection was still open 20 s after its last request"
    assert took >= 1.0, f"closed after {took:.2f}s, before the idle timeout"
    assert data == b"", f"an idle connection gets no response: {data!r}"
    assert daemon.proc.poll() is None


def test_header_in_several_reads_on_a_kept_connection(own_sbxd):
    """A next request whose header comes in pieces, within the header deadline, is served; the
    deadline counts from its first byte, whatever the pauses between the pieces."""
    daemon, port = own_sbxd("--header-timeout-s", str(HEADER_TIMEOUT_S), "--idle-timeout-s", "30")
    s = connect(port)
    try:
        healthz_ok(s)
        for piece in (b"GET /healthz HT", b"TP/1.1\r\nHo", b"st: t\r\n", b"\r\n"):
            s.sendall(piece)
            time.sleep(0.2)
        r = read_response(s)
        assert r is not None and r.status == 200, r
        # And the same pieces spread past the deadline: 408.
        s.sendall(b"GET /healthz HT")
        time.sleep(HEADER_TIMEOUT_S + 1)
        try:
            s.sendall(b"TP/1.1\r\nHost: t\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, closed = read_until_closed(s, timeout=15)
        assert closed, "a header past its deadline left the connection open"
        assert [x.status for x in parse_responses(data)] == [408], data
    finally:
        s.close()


# ---- connection caps ---------------------------------------------------------------------------

def held(port: int, source: str) -> socket.socket:
    """A keep-alive connection that made one request and now idles (the header deadline does not
    apply between requests, so it stays until the test closes it)."""
    s = connect(port, source)
    try:
        healthz_ok(s, f"held connection from {source}")
    except BaseException:
        s.close()
        raise
    return s


def fill_reserve(port: int, sources: list[str]) -> list[socket.socket]:
    """Silent connections that sbxd holds (not refused): the scrape just before may still hold
    a reserve slot for a moment, and a connection that came in during it got a 503 at once."""
    out = []
    try:
        for src in sources:
            for _ in range(20):
                s = connect(port, src)
                s.settimeout(0.2)
                try:
                    refused = s.recv(1) != b""
                except socket.timeout:
                    refused = False
                except ConnectionResetError:
                    refused = True
                if not refused:
                    out.append(s)
                    break
                s.close()
            else:
                raise AssertionError(f"sbxd kept refusing a reserve connection from {src}")
    except BaseException:
        close_all(out)
        raise
    return out


def request(port: int, source: str, target: str = "/v1/sandboxes", token: str | None = None):
    hdr = f"Authorization: Bearer {token}\r\n" if token else ""
    return exchange(port, f"GET {target} HTTP/1.1\r\nHost: t\r\n{hdr}\r\n".encode() + PIPELINED, source)


def assert_shed(responses, closed, raw, what):
    assert closed, f"{what}: the refused connection was not closed: {raw[:300]!r}"
    assert len(responses) == 1, f"{what}: {responses!r}"
    r = responses[0]
    assert r.status == 503, f"{what}: expected 503, got {r!r}"
    assert r.headers.get("retry-after", "").isdigit(), r
    assert r.headers.get("connection", "").lower() == "close", r
    assert json.loads(r.body)["error"]["code"] == "unavailable", r


CAP_FLAGS = ("--max-connections", "30", "--max-connections-per-ip", "20",
             "--reserved-connections", "4", "--header-timeout-s", str(HEADER_TIMEOUT_S))


def test_per_address_cap(own_sbxd):
    daemon, port = own_sbxd(*CAP_FLAGS)
    socks = []
    try:
        socks += [held(port, "127.0.0.1") for _ in range(20)]
        rejected_before = metric(daemon, "sbx_http_connections_rejected_total", reason="max_connections_per_ip")
        # Over its cap, 127.0.0.1 gets only what the reserve serves: /healthz and the admin.
        assert_shed(*request(port, "127.0.0.1"), "unauthenticated request over the per-address cap")
        responses, closed, raw = request(port, "127.0.0.1", "/healthz")
        assert closed and [r.status for r in responses] == [200], raw[:300]
        responses, closed, raw = request(port, "127.0.0.1", token=daemon.token)
        assert closed and [r.status for r in responses] == [200], raw[:300]
        # Another address is not affected: it still gets the API itself (401: no token).
        responses, closed, raw = request(port, "127.0.0.2")
        assert [r.status for r in responses] == [401, 200], raw[:300]
        # Past the address's share of the reserve, a connection is refused at once, unread.
        wait_for(lambda: metric(daemon, "sbx_http_connections") <= 21,
                 "the reserve's connections released")
        silent = [connect(port, "127.0.0.1") for _ in range(2)]
        socks += silent
        s = connect(port, "127.0.0.1")
        socks.append(s)
        data, closed = read_until_closed(s)
        assert_shed(parse_responses(data), closed, data, "connection past the reserve")
        rejected_after = metric(daemon, "sbx_http_connections_rejected_total", reason="max_connections_per_ip")
        assert rejected_after >= rejected_before + 2, (rejected_before, rejected_after)
        assert metric(daemon, "sbx_http_connections") >= 21
    finally:
        close_all(socks)
    wait_idle(daemon)
    assert daemon.proc.poll() is None


def test_global_cap_keeps_healthz_and_admin(own_sbxd):
    daemon, port = own_sbxd(*CAP_FLAGS)
    socks = []
    try:
        socks += [held(port, "127.0.0.1") for _ in range(20)]
        socks += [held(port, "127.0.0.3") for _ in range(10)]
        # At the global cap: 127.0.0.2 has no connection, yet only the reserve is left.
        assert_shed(*request(port, "127.0.0.2"), "unauthenticated request at the global cap")
        responses, closed, raw = request(port, "127.0.0.2", "/healthz")
        assert closed and [r.status for r in responses] == [200], raw[:300]
        assert responses[0].headers.get("connection", "").lower() == "close"
        responses, closed, raw = request(port, "127.0.0.2", token=daemon.token)
        assert closed and [r.status for r in responses] == [200], raw[:300]
        assert json.loads(responses[0].body)["sandboxes"] == []
        # A wrong token is not the operator.
        assert_shed(*request(port, "127.0.0.2", token="nope"), "wrong token at the global cap")
        assert metric(daemon, "sbx_http_connections_rejected_total", reason="max_connections") >= 2
        # Four silent connections take the reserve (two per address); the next is refused at once.
        wait_for(lambda: metric(daemon, "sbx_http_connections") <= 31,
                 "the reserve's connections released")
        socks += fill_reserve(port, ["127.0.0.4", "127.0.0.4", "127.0.0.5", "127.0.0.5"])
        s = connect(port, "127.0.0.6")
        socks.append(s)
        data, closed = read_until_closed(s)
        assert_shed(parse_responses(data), closed, data, "connection past the reserve")
        # The reserve's silent connections are cut at the header deadline, and the reserve
        # serves again.
        def healthz_served():
            responses, _, _ = request(port, "127.0.0.7", "/healthz")
            return [r.status for r in responses] == [200]
        wait_for(healthz_served, "/healthz once the reserve's silent connections timed out",
                 timeout=HEADER_TIMEOUT_S + 20, interval=0.5)
    finally:
        close_all(socks)
    wait_idle(daemon)
    assert daemon.proc.poll() is None


def test_bad_cap_flags_refused(tmp_path):
    sbxd = build_dir() / "bin" / "sbxd"  # (a Daemon() would make a state directory for nothing)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for flags, words in [
        (["--max-connections", str(soft)], "RLIMIT_NOFILE"),
        (["--max-connections", "10", "--max-connections-per-ip", "11"], "--max-connections-per-ip 11"),
        (["--header-timeout-s", "0"], "--header-timeout-s 0"),
    ]:
        r = subprocess.run([str(sbxd), "--runtime", "fake", "--state-dir", str(tmp_path / "s"),
                            "--listen", "127.0.0.1:0", *flags], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, (flags, r.stdout, r.stderr)
        assert words in r.stderr, (flags, r.stderr)
        assert not (tmp_path / "s").exists(), "refused before touching the state dir"


# ---- file descriptors --------------------------------------------------------------------------

def test_fd_count_returns_after_idle_connections(own_sbxd):
    daemon, port = own_sbxd(*CAP_FLAGS)
    pid = daemon.proc.pid
    time.sleep(0.5)
    start = fd_count(pid)
    socks = []
    try:
        # More than the caps allow, from several addresses: silent (closed by sbxd at the header
        # deadline) and refused (closed at once).
        for i in range(120):
            socks.append(connect(port, f"127.0.0.{10 + i % 6}"))
        wait_for(lambda: fd_count(pid) <= start + 5,
                 f"sbxd's fds back near {start} while the clients still hold their sockets "
                 f"(now {fd_count(pid)})", timeout=HEADER_TIMEOUT_S + 30, interval=0.25)
        # Keep-alive connections that made a request: closed by the client.
        close_all(socks)
        # The fds above allow 5 connections still counted: the 30 below need the whole cap.
        wait_for(lambda: metric(daemon, "sbx_http_connections") <= 1,
                 "sbxd still counts the closed connections")
        socks = [held(port, f"127.0.0.{20 + i % 3}") for i in range(30)]
        assert fd_count(pid) >= start + 25
    finally:
        close_all(socks)
    wait_for(lambda: fd_count(pid) <= start + 5,
             f"sbxd's fds back near {start} after the clients closed (now {fd_count(pid)})")
    assert metric(daemon, "sbx_http_connections") <= 1  # the scrape itself


def _log_lines(daemon: Daemon, needle: str) -> int:
    return sum(needle in line for line in daemon.log_path.read_text(errors="replace").splitlines())


def test_fd_exhaustion_is_shed_without_a_log_storm(own_sbxd):
    if os.geteuid() != 0:
        skip_or_fail("lowering another process's RLIMIT_NOFILE needs root")
    daemon, port = own_sbxd("--max-connections", "2000", "--max-connections-per-ip", "2000",
                            "--reserved-connections", "4", "--header-timeout-s", "20")
    pid = daemon.proc.pid
    time.sleep(0.5)
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    socks = []
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (fd_count(pid) + 10, old[1]))
        refused = 0
        for _ in range(60):
            s = connect(port, "127.0.0.1")
            socks.append(s)
            s.settimeout(0.2)
            try:
                data = s.recv(4096)
                if data.startswith(b"HTTP/1.1 503"):
                    refused += 1
            except (socket.timeout, ConnectionResetError):
                pass
        assert refused > 0, "nothing was refused at the fd limit"
        # The operator still gets an answer, from the reserve the spare descriptors keep.
        responses, closed, raw = request(port, "127.0.0.2", "/healthz")
        assert [r.status for r in responses] == [200], raw[:300]
        time.sleep(2)
        lines = _log_lines(daemon, "Too many open files")
        assert lines <= 3, f"{lines} log lines about the fd limit in ~3 s (a log storm)"
        assert daemon.proc.poll() is None
    finally:
        close_all(socks)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
    responses, _, raw = request(port, "127.0.0.1", "/healthz")
    assert responses and responses[0].status == 200, raw[:300]
    wait_idle(daemon)

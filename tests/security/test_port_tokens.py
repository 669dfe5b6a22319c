"""Port exposure's credentials (docs/api.md "Ports", docs/threat-model.md): who may reach a
server in a sandbox through sbxd. A missing or wrong traffic token, another sandbox's token, an
attach token, and a token in the query are all refused; a public sandbox needs none; sbxd's
credentials never reach the server in the sandbox, and nothing a client writes in the rest of
the path or in a header can add a header line upstream."""

from __future__ import annotations

import base64
import socket
import sys
from pathlib import Path

import pytest
import requests

from secutil import attack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from port_helpers import start_server  # noqa: E402


@pytest.fixture(scope="module")
def two(session_sandboxes, sbxd):
    """Two sandboxes, each with the echo server on port 8000; and a public third."""
    c = session_sandboxes.client
    a = session_sandboxes.create({"labels": {"security": "ports-a"}})
    b = session_sandboxes.create({"labels": {"security": "ports-b"}})
    pub = session_sandboxes.create({"labels": {"security": "ports-public"}, "public_ports": True})
    for sb in (a, b, pub):
        start_server(c, sb["id"], 8000, "127.0.0.1")
    http = requests.Session()
    http.trust_env = False
    yield {"a": a, "b": b, "public": pub, "http": http, "url": sbxd.url, "client": c}
    http.close()


def get(two, sid, headers=None, rest="/headers"):
    return two["http"].get(f"{two['url']}/v1/sandboxes/{sid}/ports/8000{rest}",
                           headers=headers or {}, timeout=30)


@attack("ports", "reach a sandbox's port without any token")
def test_missing_token_is_401(two):
    r = get(two, two["a"]["id"])
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "unauthenticated"
    assert "X-Sbx-Traffic-Token" in r.json()["error"]["message"]


@attack("ports", "reach a sandbox's port with a made-up traffic token")
def test_wrong_token_is_403(two):
    for bad in ("stt1.wrong", "", "x" * 5000, two["a"]["traffic_token"][:-1]):
        r = get(two, two["a"]["id"], {"X-Sbx-Traffic-Token": bad})
        assert r.status_code in (401, 403), (bad[:20], r.text)


@attack("ports", "use sandbox B's traffic token on sandbox A's port")
def test_other_sandboxs_token_is_403(two):
    r = get(two, two["a"]["id"], {"X-Sbx-Traffic-Token": two["b"]["traffic_token"]})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "permission_denied"
    r = get(two, two["a"]["id"], {"e2b-traffic-access-token": two["b"]["traffic_token"]})
    assert r.status_code == 403, r.text
    # Its own works.
    assert get(two, two["b"]["id"], {"X-Sbx-Traffic-Token": two["b"]["traffic_token"]}).status_code == 200


@attack("ports", "use a traffic token as a management token, and a session's attach token on a port")
def test_traffic_token_opens_nothing_else(two):
    tok = two["a"]["traffic_token"]
    r = two["http"].get(f"{two['url']}/v1/sandboxes/{two['a']['id']}",
                        headers={"Authorization": f"Bearer {tok}"}, timeout=30)
    assert r.status_code == 401, r.text
    r = two["http"].get(f"{two['url']}/v1/sandboxes/{two['a']['id']}",
                        headers={"X-Sbx-Traffic-Token": tok}, timeout=30)
    assert r.status_code == 401, r.text
    session = two["client"].create_session(two["a"]["id"], ["true"])
    attach = session["attach"]["token"]
    r = get(two, two["a"]["id"], {"Authorization": f"Bearer {attach}"})
    assert r.status_code == 401, r.text
    r = get(two, two["a"]["id"], rest=f"/headers?token={tok}")
    assert r.status_code == 401, r.text


@attack("ports", "reach a public sandbox's port, and with a wrong token")
def test_public_ports_need_no_token(two):
    assert two["public"]["public_ports"] is True
    assert get(two, two["public"]["id"]).status_code == 200
    # A wrong token does not make a public port private, nor is it passed on.
    r = get(two, two["public"]["id"], {"X-Sbx-Traffic-Token": two["a"]["traffic_token"]})
    assert r.status_code == 200, r.text
    assert "x-sbx-traffic-token" not in r.json()["headers"]
    # Public is per sandbox: A stays closed.
    assert get(two, two["a"]["id"]).status_code == 401


@attack("ports", "read sbxd's credentials from the server side of a port")
def test_credentials_not_passed_on(two, sbxd):
    r = get(two, two["a"]["id"], {"X-Sbx-Traffic-Token": two["a"]["traffic_token"],
                                  "e2b-traffic-access-token": two["a"]["traffic_token"],
                                  "Authorization": f"Bearer {sbxd.token}",
                                  "Proxy-Authorization": "Basic eDp5"})
    assert r.status_code == 200, r.text
    seen = r.json()["headers"]
    text = repr(seen)
    assert two["a"]["traffic_token"] not in text and sbxd.token not in text, seen
    assert "proxy-authorization" not in seen


@attack("ports", "inject a header line upstream through the rest of the path or a header value")
def test_no_header_injection(two):
    sid, tok = two["a"]["id"], two["a"]["traffic_token"]
    host, port = two["url"].rsplit("/", 1)[1].split(":")
    # Encoded CR LF in the path is passed on encoded, never decoded into the head.
    r = get(two, sid, {"X-Sbx-Traffic-Token": tok}, rest="/headers%0d%0aX-Injected:%201")
    assert r.status_code == 404, r.text  # the server saw one odd path, not a new header
    assert "x-injected" not in r.json()
    # Raw CR/LF, NUL or a space in the target, and an obs-fold header: refused by sbxd's parser.
    for line in (f"GET /v1/sandboxes/{sid}/ports/8000/headers\rX-Injected: 1 HTTP/1.1",
                 f"GET /v1/sandboxes/{sid}/ports/8000/head ers HTTP/1.1",
                 f"GET /v1/sandboxes/{sid}/ports/8000/headers\x00 HTTP/1.1"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(f"{line}\r\nHost: x\r\nX-Sbx-Traffic-Token: {tok}\r\n\r\n".encode("latin-1"))
            head = s.recv(4096).split(b"\r\n", 1)[0]
            assert head.split(b" ")[1] == b"400", (line, head)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall((f"GET /v1/sandboxes/{sid}/ports/8000/headers HTTP/1.1\r\nHost: x\r\n"
                   f"X-Sbx-Traffic-Token: {tok}\r\nX-A: 1\r\n X-Injected: 1\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            more = s.recv(65536)
            assert more, data
            data += more
        status = data.split(b" ", 2)[1]
        if status == b"200":  # folded into X-A's value at most, never a header of its own
            while not data.rstrip().endswith(b"}"):
                data += s.recv(65536)
            import json
            seen = json.loads(data.split(b"\r\n\r\n", 1)[1].split(b"\r\n", 1)[-1]
                              if b"chunked" in data.lower() else data.split(b"\r\n\r\n", 1)[1])
            assert "x-injected" not in seen["headers"], seen
        else:
            assert status == b"400", data[:300]

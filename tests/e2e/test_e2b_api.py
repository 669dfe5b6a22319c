"""The E2B-compatible API on the wire (docs/e2b.md): the answers the official SDKs read as
meanings, checked with plain HTTP so that a regression names the request. The SDKs themselves
run in tests/e2b; this file holds the bad input and the edges they do not reach: missing and
wrong keys and tokens, unknown sandboxes and templates, malformed Connect envelopes, unknown
RPCs, the envd of a paused sandbox, and the port relay of the code interpreter's port."""
from __future__ import annotations

import json
import struct
import time

import base64

import pytest
import requests

import images
from conftest import ns_runtime_only

pytestmark = ns_runtime_only("envd needs a sandbox's agent")


def sbx_id(e2b_id: str) -> str:
    """sbx's id of a sandbox E2B names with `-` for the `_` (docs/e2b.md)."""
    return e2b_id.replace("sbx-", "sbx_", 1)


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def frames(body: bytes) -> list[tuple[int, dict]]:
    out = []
    while body:
        flags, n = struct.unpack(">BI", body[:5])
        out.append((flags, json.loads(body[5:5 + n])))
        body = body[5 + n:]
    return out


class E2b:
    def __init__(self, url: str, key: str):
        self.url = url
        self.key = key
        self.http = requests.Session()
        self.made: list[str] = []

    def cp(self, method: str, path: str, body=None, key: str | None = "__default__", **kw):
        headers = {} if key is None else {"X-API-KEY": self.key if key == "__default__" else key}
        return self.http.request(method, self.url + path, json=body, headers=headers, timeout=90, **kw)

    def create(self, **fields) -> dict:
        r = self.cp("POST", "/sandboxes", {"templateID": "base", "timeout": 120, **fields})
        assert r.status_code == 201, r.text
        sb = r.json()
        self.made.append(sb["sandboxID"])
        return sb

    def envd(self, sb: dict, method: str, path: str, *, token: str | None = "__default__",
             port: int = 49983, **kw):
        headers = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": str(port),
                   **kw.pop("headers", {})}
        if token is not None:
            headers["X-Access-Token"] = sb["envdAccessToken"] if token == "__default__" else token
        return self.http.request(method, self.url + path, headers=headers, timeout=60, **kw)

    def close(self):
        """Kills what the test made and waits until each is gone (E2B's kill answers at once;
        the delete finishes in the background)."""
        for sid in self.made:
            self.cp("DELETE", f"/sandboxes/{sid}")
        deadline = time.monotonic() + 60
        for sid in self.made:
            while time.monotonic() < deadline:
                r = self.http.get(f"{self.url}/v1/sandboxes/{sbx_id(sid)}",
                                  headers={"Authorization": f"Bearer {self.key}"}, timeout=30)
                if r.status_code == 404 or r.json().get("state") == "deleted":
                    break
                time.sleep(0.05)


@pytest.fixture
def e2b(sbxd):
    c = E2b(sbxd.url, sbxd.token)
    yield c
    c.close()


def error_body(r: requests.Response, status: int) -> dict:
    assert r.status_code == status, f"{r.status_code} {r.text}"
    body = r.json()
    # The SDKs read `code` from the body: kill() returns False only for {"code": 404}.
    assert body["code"] == status and isinstance(body["message"], str) and body["message"], body
    return body


def test_control_plane_keys(e2b):
    error_body(e2b.cp("GET", "/v2/sandboxes", key=None), 401)
    error_body(e2b.cp("GET", "/v2/sandboxes", key="not-a-key"), 401)
    error_body(e2b.cp("POST", "/sandboxes", {"templateID": "base"}, key="wrong"), 401)
    # The Bearer form of sbx's own API is not E2B's: X-API-KEY only.
    r = e2b.http.get(e2b.url + "/v2/sandboxes", headers={"Authorization": f"Bearer {e2b.key}"})
    error_body(r, 401)


def test_create_shapes_and_bad_bodies(e2b):
    sb = e2b.create(metadata={"suite": "wire"}, envVars={"A": "1"})
    assert sb["envdVersion"] and sb["envdAccessToken"].startswith("set1.")
    for k in ("sandboxID", "templateID", "clientID", "alias"):
        assert isinstance(sb[k], str), k
    # An unknown template: 404 naming it (the SDK raises it with the message).
    assert "nope" in error_body(e2b.cp("POST", "/sandboxes", {"templateID": "nope"}), 404)["message"]
    error_body(e2b.cp("POST", "/v2/sandboxes", {"templateID": "base", "timeout": "x"}), 400)
    error_body(e2b.cp("POST", "/v2/sandboxes", {"templateID": "base", "autoPause": True}), 400)
    error_body(e2b.cp("POST", "/v2/sandboxes", {"templateID": "base",
                                                "network": {"allowOut": ["10.0.0.1"]}}), 400)
    error_body(e2b.cp("POST", "/v2/sandboxes", {"templateID": "base", "extra": 1}), 400)
    r = e2b.http.post(e2b.url + "/sandboxes", data=b"{not json",
                      headers={"X-API-KEY": e2b.key, "Content-Type": "application/json"})
    error_body(r, 400)
    r = e2b.http.post(e2b.url + "/sandboxes", data=b"[" * 100000,
                      headers={"X-API-KEY": e2b.key, "Content-Type": "application/json"})
    assert r.status_code in (400, 413), r.text
    # Chunked bodies (what the SDKs send) are read like any other.
    r = e2b.http.post(e2b.url + "/sandboxes", headers={"X-API-KEY": e2b.key},
                      data=iter([b'{"templateID":', b'"base","timeout":30}']))
    assert r.status_code == 201, r.text
    e2b.made.append(r.json()["sandboxID"])


def test_list_filters_and_info(e2b):
    a = e2b.create(metadata={"suite": "list", "who": "a b&c"})
    e2b.create(metadata={"suite": "list", "who": "other"})
    # The SDK percent-encodes keys and values once more inside the metadata parameter.
    from urllib.parse import quote, urlencode
    md = urlencode({quote("who"): quote("a b&c"), "suite": "list"})
    r = e2b.cp("GET", "/v2/sandboxes", params={"metadata": md, "state": "running,paused"})
    assert r.status_code == 200, r.text
    assert [s["sandboxID"] for s in r.json()] == [a["sandboxID"]]
    listed = r.json()[0]
    for k in ("startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion",
              "clientID", "templateID", "state"):
        assert k in listed, k
    error_body(e2b.cp("GET", "/v2/sandboxes", params={"state": "gone"}), 400)
    info = e2b.cp("GET", f"/sandboxes/{a['sandboxID']}")
    assert info.status_code == 200 and info.json()["metadata"]["who"] == "a b&c", info.text
    # E2B's name has `-` for the id's `_` (host names, wildcard certificates); sbx's own
    # spelling is taken too, on every route.
    assert a["sandboxID"].startswith("sbx-"), a
    assert e2b.cp("GET", f"/sandboxes/{sbx_id(a['sandboxID'])}").json() == info.json()
    error_body(e2b.cp("GET", "/sandboxes/sbx_doesnotexist00000000"), 404)
    # Not even an sbx id: unknown all the same.
    error_body(e2b.cp("GET", "/sandboxes/not-an-id"), 404)
    error_body(e2b.cp("DELETE", "/sandboxes/not-an-id"), 404)


def test_kill_pause_connect_states(e2b):
    sb = e2b.create()
    sid = sb["sandboxID"]
    assert e2b.cp("POST", f"/sandboxes/{sid}/timeout", {"timeout": 600}).status_code == 204
    error_body(e2b.cp("POST", f"/sandboxes/{sid}/timeout", {"timeout": 0}), 400)
    error_body(e2b.cp("POST", f"/sandboxes/{sid}/timeout", {}), 400)
    assert e2b.cp("POST", f"/sandboxes/{sid}/pause").status_code == 204
    # pause() returns False for a paused one: 409 with the code in the body.
    error_body(e2b.cp("POST", f"/sandboxes/{sid}/pause"), 409)
    # envd of a paused sandbox: 502, which the SDKs read as "not running".
    error_body(e2b.envd(sb, "GET", "/health"), 502)
    r = e2b.cp("POST", f"/sandboxes/{sid}/connect", {"timeout": 60})
    assert r.status_code == 201 and r.json()["sandboxID"] == sid, r.text
    assert e2b.envd(sb, "GET", "/health").status_code == 204
    r = e2b.cp("POST", f"/v2/sandboxes/{sid}/connect", {})
    assert r.status_code == 200, r.text
    error_body(e2b.cp("POST", f"/sandboxes/{sid}/resume", {}), 409)
    assert e2b.cp("DELETE", f"/sandboxes/{sid}").status_code == 204
    error_body(e2b.cp("DELETE", f"/sandboxes/{sid}"), 404)
    error_body(e2b.cp("GET", f"/sandboxes/{sid}"), 404)
    error_body(e2b.cp("POST", f"/sandboxes/{sid}/connect", {}), 404)
    # envd of a killed sandbox: 502 as E2B's proxy answers (isRunning() False), never 404,
    # which the SDKs would read as a missing file.
    error_body(e2b.envd(sb, "GET", "/health"), 502)
    error_body(e2b.cp("GET", f"/sandboxes/{sid}/metrics"), 404)


def test_unsupported_routes_say_so(e2b):
    sb = e2b.create()
    for path in (f"/sandboxes/{sb['sandboxID']}/metrics", f"/sandboxes/{sb['sandboxID']}/logs"):
        error_body(e2b.cp("GET", path), 501)
    error_body(e2b.cp("GET", "/sandboxes/x/y/z"), 404)


def test_envd_tokens(e2b):
    a, b = e2b.create(), e2b.create()
    assert e2b.envd(a, "GET", "/health").status_code == 204
    error_body(e2b.envd(a, "GET", "/health", token=None), 401)
    error_body(e2b.envd(a, "GET", "/health", token="set1.wrong"), 401)
    # One sandbox's token opens that sandbox only.
    error_body(e2b.envd(a, "GET", "/health", token=b["envdAccessToken"]), 401)
    # ...and never the control plane or sbx's own API.
    error_body(e2b.cp("GET", "/v2/sandboxes", key=a["envdAccessToken"]), 401)
    r = e2b.http.get(e2b.url + "/v1/sandboxes",
                     headers={"Authorization": f"Bearer {a['envdAccessToken']}"})
    assert r.status_code == 401, r.text
    # An RPC refused for its token says so in Connect's form.
    r = e2b.envd(a, "POST", "/filesystem.Filesystem/Stat", token="nope", json={"path": "/"})
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated", r.text
    r = e2b.envd(a, "POST", "/process.Process/Start", token="nope",
                 data=envelope(b'{"process":{"cmd":"true"}}'),
                 headers={"Content-Type": "application/connect+json"})
    # A stream's error is in its end-of-stream frame, with HTTP 200 (a status loses the code).
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/connect+json")
    (flags, end), = frames(r.content)
    assert flags == 2 and end["error"]["code"] == "unauthenticated", end


def test_connect_protocol_bad_input(e2b):
    sb = e2b.create()
    stream = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    cases = [
        (b"", "invalid_argument"),
        (b"\x00\x00\x00", "invalid_argument"),
        (envelope(b'{"process":{"cmd":"true"}}', flags=1), "invalid_argument"),
        (envelope(b'{"process":'), "invalid_argument"),
        (envelope(b"[1,2]"), "invalid_argument"),
        (struct.pack(">BI", 0, 0x7fffffff) + b"{}", "invalid_argument"),
        (envelope(b"{}") + envelope(b"{}"), "invalid_argument"),
    ]
    for body, code in cases:
        r = e2b.envd(sb, "POST", "/process.Process/Start", data=body, headers=stream)
        assert r.status_code == 200, (body[:20], r.status_code, r.text)
        fr = frames(r.content)
        assert fr[-1][0] == 2 and fr[-1][1]["error"]["code"] == code, (body[:20], fr)
    unary = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    r = e2b.envd(sb, "POST", "/process.Process/NoSuchMethod", data=b"{}", headers=unary)
    assert r.status_code == 501 and r.json()["code"] == "unimplemented", r.text
    r = e2b.envd(sb, "POST", "/nosuch.Service/Call", data=b"{}", headers=unary)
    assert r.status_code == 501 and r.json()["code"] == "unimplemented", r.text
    r = e2b.envd(sb, "POST", "/filesystem.Filesystem/Stat", data=b"{",
                 headers=unary)
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    r = e2b.envd(sb, "POST", "/filesystem.Filesystem/Stat", data=b'{"path":"/"}',
                 headers={"Content-Type": "application/proto"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    r = e2b.envd(sb, "GET", "/filesystem.Filesystem/Stat", headers=unary)
    assert r.status_code in (400, 405) and "code" in r.json(), r.text
    error_body(e2b.envd(sb, "GET", "/nosuchroute"), 404)
    error_body(e2b.envd(sb, "GET", "/health", headers={"E2b-Sandbox-Port": "99999"}), 400)
    for sid in ("sbx_doesnotexist00000000", "not-an-id"):
        r = e2b.http.get(e2b.url + "/health", headers={"E2b-Sandbox-Id": sid, "X-Access-Token": "x"})
        error_body(r, 502)


def test_other_ports_go_to_the_port_relay(e2b, api):
    """The code interpreter's port (49999) and any other: the sandbox's own server, reached with
    the envd token (or the traffic token) as the SDKs send them."""
    sb = e2b.create()
    sid = sb["sandboxID"]
    # A server on 49999 inside the sandbox, started with sbx's own session API (a session's
    # process starts when it is attached).
    ses = api.create_session(sbx_id(sid), ["python3", "-m", "http.server", "49999", "--bind", "127.0.0.1"])
    attach = api.attach(ses)
    try:
        deadline = time.monotonic() + 20
        while True:
            r = e2b.envd(sb, "GET", "/", port=49999)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and b"Directory listing" in r.content, r.text[:200]
        r = e2b.envd(sb, "GET", "/", port=49999, token=None,
                     headers={"E2B-Traffic-Access-Token": sb["trafficAccessToken"]})
        assert r.status_code == 200, r.text[:200]
        r = e2b.envd(sb, "GET", "/", port=49999, token=None)
        assert r.status_code == 401, r.text[:200]
        other = e2b.create()
        r = e2b.envd(sb, "GET", "/", port=49999, token=other["envdAccessToken"])
        assert r.status_code == 401, r.text[:200]
    finally:
        attach.close()


def test_gzip_upload_inflates_in_bounded_pieces(e2b):
    """`files.write(.., gzip=True)`: a small body that inflates 1000:1 (64 MiB of zeros) is
    written whole and exactly, and a body that is not gzip, or stops short, is refused."""
    import gzip
    import hashlib
    sb = e2b.create()
    raw = b"\0" * (64 << 20) + b"end"
    body = gzip.compress(raw, 9)
    assert len(body) < 200 << 10
    hdr = {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
    r = e2b.envd(sb, "POST", "/files", params={"path": "/tmp/bomb"}, data=body, headers=hdr)
    assert r.status_code == 200 and r.json()[0]["path"] == "/tmp/bomb", r.text
    got = e2b.envd(sb, "GET", "/files", params={"path": "/tmp/bomb"})
    assert got.status_code == 200 and int(got.headers["Content-Length"]) == len(raw)
    assert hashlib.sha256(got.content).digest() == hashlib.sha256(raw).digest()
    error_body(e2b.envd(sb, "POST", "/files", params={"path": "/tmp/x"}, data=b"not gzip",
                        headers=hdr), 400)
    error_body(e2b.envd(sb, "POST", "/files", params={"path": "/tmp/x"}, data=body[:len(body) // 2],
                        headers=hdr), 400)


def test_what_envd_makes_belongs_to_the_templates_user(e2b, api, tmp_path):
    """envd gives new files and directories to its user; sbx to the template's default user
    (code-interpreter-v1's `user`), so code running as that user can change what its client
    uploaded. A named user (?username=, Basic auth) wins; root stays root."""
    layout = tmp_path / "layout"
    images.write_layout(layout, [images.busybox_layer().dir("home").dir("home/app", 0o755, 1000, 1000)
                                 .bytes()], user="app", workdir="/home/app")
    archive = images.docker_archive(layout, tmp_path / "img.tar")
    op = api.call("POST", "/v1/templates:import", params={"name": "e2b-user", "tag": "latest"},
                  data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                  expect=202).body
    assert api.wait_operation(op["operation"]["id"], timeout=120)["state"] == "succeeded"
    try:
        sb = e2b.create(templateID="e2b-user")
        sid = sbx_id(sb["sandboxID"])
        octet = {"Content-Type": "application/octet-stream"}

        def owners(*paths: str) -> list[str]:
            r = api.run(sid, ["stat", "-c", "%U", *paths])
            assert r.exit and r.exit.get("exit_code") == 0, (r.stdout, r.stderr)
            return r.stdout.decode().split()

        r = e2b.envd(sb, "POST", "/files", params={"path": "/home/app/new/dir/f.txt"}, data=b"hi",
                     headers=octet)
        assert r.status_code == 200, r.text
        assert owners("/home/app/new", "/home/app/new/dir", "/home/app/new/dir/f.txt") == ["app"] * 3
        # The user can change it: what an agent's code does next with the file it was given.
        r = api.run(sid, ["sh", "-c", "echo more >> /home/app/new/dir/f.txt && touch /home/app/new/dir/g"])
        assert r.exit and r.exit.get("exit_code") == 0, (r.stdout, r.stderr)
        r = e2b.envd(sb, "POST", "/filesystem.Filesystem/MakeDir", json={"path": "/home/app/a/b"})
        assert r.status_code == 200, r.text
        assert owners("/home/app/a", "/home/app/a/b") == ["app", "app"]
        # EntryInfo names them as envd does, from the sandbox's own /etc/passwd and /etc/group.
        assert r.json()["entry"]["owner"] == "app", r.json()
        r = e2b.envd(sb, "POST", "/filesystem.Filesystem/ListDir", json={"path": "/home/app/new"})
        assert r.status_code == 200, r.text
        assert [(e["name"], e["owner"]) for e in r.json()["entries"]] == [("dir", "app")], r.json()
        r = e2b.envd(sb, "POST", "/filesystem.Filesystem/Stat", json={"path": "/"})
        assert (r.json()["entry"]["owner"], r.json()["entry"]["group"]) == ("root", "root"), r.json()
        # Named users: the query's, then Basic auth's.
        r = e2b.envd(sb, "POST", "/files", params={"path": "/home/app/byroot", "username": "root"},
                     data=b"x", headers=octet)
        assert r.status_code == 200, r.text
        basic = {"Authorization": "Basic " + base64.b64encode(b"root:").decode()}
        r = e2b.envd(sb, "POST", "/filesystem.Filesystem/MakeDir", json={"path": "/home/app/rootdir"},
                     headers=basic)
        assert r.status_code == 200, r.text
        assert owners("/home/app/byroot", "/home/app/rootdir") == ["root", "root"]
        r = e2b.envd(sb, "POST", "/files", params={"path": "/home/app/x", "username": "nobody-here"},
                     data=b"x", headers=octet)
        assert r.status_code in (400, 401), r.text
    finally:
        for sid_ in list(e2b.made):
            e2b.cp("DELETE", f"/sandboxes/{sid_}")
        e2b.close()
        e2b.made.clear()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = api.call("DELETE", "/v1/templates/e2b-user", expect=None)
            if r.status_code != 409:
                break
            time.sleep(0.2)

"""Port exposure (docs/api.md, "Ports"): a server listening in a sandbox reached through sbxd by
path (/v1/sandboxes/{id}/ports/{port}/...) and by Host name ({port}-{id}.sbx.test), for plain
HTTP with bodies streamed both ways, Server-Sent Events event by event, and WebSocket; on the
sandbox's loopback (127.0.0.1 and ::1) as well as 0.0.0.0, with the `none` profile (no veth);
and the bad input: port out of range, nothing listening, unknown and stopped sandboxes.
Traffic goes only to 127.0.0.1 (sbxd) and, from sbxd, into the sandbox's own namespace."""
from __future__ import annotations

import hashlib
import os

import pytest
import requests

import time

from conftest import PORTS_DOMAIN, Daemon, shutdown
from sbx_client import SbxClient
from port_helpers import start_server, websocket_echo
from ws_client import WsClient


class Ports:
    def __init__(self, sbxd, sandbox: dict):
        self.base = sbxd.url
        self.sandbox = sandbox
        self.token = sandbox["traffic_token"]
        self.http = requests.Session()
        self.http.trust_env = False

    def url(self, port, rest="") -> str:
        return f"{self.base}/v1/sandboxes/{self.sandbox['id']}/ports/{port}{rest}"

    def get(self, port, rest="", headers=None, token=True, **kw):
        h = dict(headers or {})
        if token:
            h.setdefault("X-Sbx-Traffic-Token", self.token)
        return self.http.get(self.url(port, rest), headers=h, timeout=30, **kw)

    def post(self, port, rest="", data=None, headers=None, **kw):
        h = {"X-Sbx-Traffic-Token": self.token, **(headers or {})}
        return self.http.post(self.url(port, rest), data=data, headers=h, timeout=60, **kw)


@pytest.fixture
def served(sbxd, api, sandbox):
    start_server(api, sandbox["id"], 8000, "0.0.0.0")
    p = Ports(sbxd, sandbox)
    yield p
    p.http.close()


def error_of(resp) -> dict:
    assert resp.headers.get("Content-Type", "").startswith("application/json"), resp.text[:300]
    return resp.json()["error"]


def test_get_reaches_the_server_with_the_rest_of_the_path(served):
    r = served.get(8000, "/headers?a=1&b=%2F")
    assert r.status_code == 200, r.text
    seen = r.json()
    assert seen["path"] == "/headers?a=1&b=%2F"
    # sbxd's own credentials never reach the server.
    assert "x-sbx-traffic-token" not in seen["headers"]
    assert "authorization" not in seen["headers"]
    assert seen["headers"].get("x-forwarded-for") == "127.0.0.1"
    assert seen["headers"].get("x-forwarded-proto") == "http"


def test_management_token_also_opens_the_port_and_is_not_passed_on(served, sbxd):
    r = served.get(8000, "/headers", token=False, headers={"Authorization": f"Bearer {sbxd.token}"})
    assert r.status_code == 200, r.text
    assert "authorization" not in r.json()["headers"]
    # An Authorization that is not sbxd's is the application's own: it goes on, with the
    # traffic token as sbxd's credential.
    r = served.get(8000, "/headers", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert r.status_code == 200, r.text
    assert r.json()["headers"]["authorization"] == "Basic dXNlcjpwdw=="


def test_e2b_header_is_accepted(served):
    r = served.get(8000, "/headers", token=False, headers={"e2b-traffic-access-token": served.token})
    assert r.status_code == 200, r.text
    assert "e2b-traffic-access-token" not in r.json()["headers"]


def test_large_bodies_stream_both_ways(served):
    # Upload: chunked (a generator) and with a Content-Length, 24 MiB each.
    blob = os.urandom(1 << 20) * 24
    digest = hashlib.sha256(blob).hexdigest()

    def pieces():
        for i in range(0, len(blob), 1 << 20):
            yield blob[i:i + (1 << 20)]

    r = served.post(8000, "/sum", data=pieces())
    assert r.status_code == 200, r.text
    assert r.json() == {"length": len(blob), "sha256": digest}
    r = served.post(8000, "/sum", data=blob)
    assert r.status_code == 200, r.text
    assert r.json() == {"length": len(blob), "sha256": digest}
    # Download: 40 MiB chunked from the server, read as it comes.
    n = 40 << 20
    with served.get(8000, f"/bytes?n={n}", stream=True) as r:
        assert r.status_code == 200
        h, got = hashlib.sha256(), 0
        for part in r.iter_content(1 << 16):
            h.update(part)
            got += len(part)
    pattern = bytes(range(256)) * 256
    assert got == n
    assert h.hexdigest() == hashlib.sha256(pattern * (n // len(pattern))).hexdigest()


def test_sse_events_arrive_one_by_one(served):
    # The server writes event one, then waits until /release: event one must reach the client
    # while the server is still waiting (nothing holds it back), without any timing.
    with served.get(8000, "/sse", stream=True) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = r.iter_lines(chunk_size=1, decode_unicode=True)
        first = [next(lines), next(lines)]
        assert first == ["event: one", "data: 1"]
        rel = served.get(8000, "/release")
        assert rel.status_code == 200
        rest = [line for line in lines if line]
        assert rest == ["event: two", "data: 2"]


def test_websocket_echo(served, sbxd):
    websocket_echo(WsClient(sbxd.url, f"/v1/sandboxes/{served.sandbox['id']}/ports/8000/ws", None,
                            extra_headers={"X-Sbx-Traffic-Token": served.token}))


def test_host_name_form(served, sbxd):
    host = f"8000-{served.sandbox['id']}.{PORTS_DOMAIN}"
    r = served.http.get(f"{sbxd.url}/headers?x=1", timeout=30,
                        headers={"Host": host, "X-Sbx-Traffic-Token": served.token})
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/headers?x=1"
    assert r.json()["headers"]["host"] == host
    # Any case, and a port in the Host header.
    r = served.http.get(f"{sbxd.url}/headers", timeout=30,
                        headers={"Host": host.upper() + ":80", "X-Sbx-Traffic-Token": served.token})
    assert r.status_code == 200, r.text
    # The id's `_` as `-` (a host name's form, and a wildcard certificate's).
    dashed = f"8000-{served.sandbox['id'].replace('_', '-')}.{PORTS_DOMAIN}"
    r = served.http.get(f"{sbxd.url}/headers", timeout=30,
                        headers={"Host": dashed, "X-Sbx-Traffic-Token": served.token})
    assert r.status_code == 200 and r.json()["headers"]["host"] == dashed, r.text
    bad = served.http.get(f"{sbxd.url}/x", timeout=30,
                          headers={"Host": f"99999-{served.sandbox['id']}.{PORTS_DOMAIN}"})
    assert bad.status_code == 400 and error_of(bad)["details"]["field"] == "port"


def test_loopback_only_servers_and_the_none_profile(sbxd, api):
    sb = api.create_sandbox({"egress_profile": "none"})["sandbox"]
    start_server(api, sb["id"], 8101, "127.0.0.1")
    start_server(api, sb["id"], 8102, "::1")
    p = Ports(sbxd, sb)
    try:
        for port in (8101, 8102):
            r = p.get(port, "/headers")
            assert r.status_code == 200, (port, r.text)
    finally:
        p.http.close()


def test_bad_ports_and_nothing_listening(served, api):
    for port in ("0", "65536", "http", "-1", "08"):
        r = served.get(port, "/x")
        assert r.status_code == 400, (port, r.text)
        assert error_of(r)["details"]["field"] == "port"
    r = served.get(8999, "/x")
    assert r.status_code == 502, r.text
    err = error_of(r)
    assert err["code"] == "port_unreachable" and "8999" in err["message"]


def test_unknown_and_paused_sandboxes(served, api, sbxd):
    r = served.http.get(f"{sbxd.url}/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/ports/8000/",
                        headers={"X-Sbx-Traffic-Token": served.token}, timeout=30)
    assert r.status_code == 404, r.text
    sid = served.sandbox["id"]
    op = api.call("POST", f"/v1/sandboxes/{sid}/pause", expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    r = served.get(8000, "/headers")
    assert r.status_code == 409, r.text
    assert error_of(r)["code"] == "sandbox_not_running"
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    assert served.get(8000, "/headers").status_code == 200


def test_connections_to_the_server_are_kept_and_reused(served, api):
    """sbxd keeps its connection to the server between requests (api/upstream_pool.h): the
    server sees one peer for a run of requests, bodies included; a connection the server
    closed is not used again; a pause drops them all."""
    def peer():
        r = served.get(8000, "/peer")
        assert r.status_code == 200, r.text
        return r.json()["peer"]

    first = peer()
    assert peer() == first and peer() == first
    body = os.urandom(100_000)
    r = served.post(8000, "/sum", data=body)
    assert r.status_code == 200 and r.json()["sha256"] == hashlib.sha256(body).hexdigest(), r.text
    assert peer() == first, "a request with a body leaves the connection reusable"
    # The server closes it after answering, without a word: the next request is served all the
    # same, on a new connection.
    r = served.get(8000, "/drop")
    assert r.status_code == 200 and r.json()["peer"] == first
    second = peer()
    assert second != first
    assert peer() == second
    # A streamed answer (chunked, longer than sbxd sends in one piece) ends cleanly too.
    r = served.get(8000, "/bytes?n=1000000")
    assert r.status_code == 200 and len(r.content) == 1_000_000
    assert peer() == second
    # A client that goes away in the middle of an answer takes that connection with it.
    with served.http.get(served.url(8000, "/bytes?n=50000000"), stream=True, timeout=30,
                         headers={"X-Sbx-Traffic-Token": served.token}) as r:
        assert r.status_code == 200
        next(r.iter_content(1 << 16))
    served.http.close()  # the client's own connection to sbxd, mid-answer
    third = peer()
    assert third != second
    assert peer() == third
    sid = served.sandbox["id"]
    op = api.call("POST", f"/v1/sandboxes/{sid}/pause", expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    assert peer() != third, "a pause drops the kept connections"


def test_traffic_token_survives_a_restart(restartable):
    client = restartable.start()
    restartable.track(client)
    sb = client.create_sandbox({})["sandbox"]
    token = sb["traffic_token"]
    assert token and sb["public_ports"] is False
    start_server(client, sb["id"], 8000, "0.0.0.0")
    created = client.created_sandboxes
    client = restartable.restart()
    client.created_sandboxes = created
    restartable.track(client)
    assert client.get_sandbox(sb["id"])["traffic_token"] == token
    p = Ports(restartable.daemon, sb)
    try:
        assert p.get(8000, "/headers").status_code == 200
        assert p.get(8000, "/headers", token=False).status_code == 401
    finally:
        p.http.close()
    op = client.delete_sandbox(sb["id"])
    assert op["state"] == "succeeded", op


def test_cli_prints_the_urls(served, sbxd):
    import subprocess
    from conftest import build_dir
    sid = served.sandbox["id"]
    out = subprocess.run([str(build_dir() / "bin" / "sbx"), "--url", sbxd.url, "--token", sbxd.token,
                          "port", sid, "8000"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    port = sbxd.url.rsplit(":", 1)[1]
    assert out.stdout.splitlines() == [f"{sbxd.url}/v1/sandboxes/{sid}/ports/8000/",
                                       f"http://8000-{sid.replace('_', '-')}.{PORTS_DOMAIN}:{port}/"]
    bad = subprocess.run([str(build_dir() / "bin" / "sbx"), "--url", sbxd.url, "--token", sbxd.token,
                          "port", sid, "70000"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2


def test_idle_relays_end_instead_of_hanging(validator):
    """ports.idle_timeout_s: a server that reads the request and never answers gets the client
    a 502 once nothing has moved for that long (never a hang), and a stream that stops moving
    ends; a stream that keeps moving is not cut."""
    d = Daemon(extra_args=["--warm-pool", "base=0", "--ports-idle-timeout-s", "2"])
    d.start()
    client = SbxClient(d.url, d.token, validator)
    problems = []
    try:
        sb = client.create_sandbox({})["sandbox"]
        start_server(client, sb["id"], 8000, "0.0.0.0")
        p = Ports(d, sb)
        try:
            began = time.monotonic()
            r = p.get(8000, "/silent")
            took = time.monotonic() - began
            assert r.status_code == 502, r.text
            assert error_of(r)["code"] == "port_unreachable", r.text
            assert took < 25, took  # ended by the 2 s idle bound, not the client's 30 s timeout
            # /sse sends "one", then waits for /release that never comes: the stream is cut
            # without its last chunk (a truncated body, never a clean end the client could take
            # for the whole answer).
            body, truncated = b"", False
            began = time.monotonic()
            with p.get(8000, "/sse", stream=True) as r:
                assert r.status_code == 200
                try:
                    for piece in r.iter_content(chunk_size=None):
                        body += piece
                except requests.exceptions.ChunkedEncodingError:
                    truncated = True
            assert truncated and time.monotonic() - began < 25, body
            assert b"event: one" in body and b"event: two" not in body, body
            # Moving bytes keep a relay alive past the bound: 8 MiB trickled over ~3 s.
            r = p.get(8000, "/bytes?n=8388608")
            assert r.status_code == 200 and len(r.content) == 8388608
            assert p.get(8000, "/headers").status_code == 200
        finally:
            p.http.close()
        assert client.delete_sandbox(sb["id"])["state"] == "succeeded"
    finally:
        client.close()
        problems += shutdown(d, validator, list(client.created_sandboxes))
    assert not problems, problems

"""Attacks through the E2B-compatible API (docs/e2b.md): another tenant's API key on every
control-plane route that names a sandbox, one sandbox's envd token on another's envd, and the
envd token where a management token is wanted. Each must fail as for a sandbox that does not
exist (control plane: 404 {code: 404}) or as an invalid credential (envd: 401), and the victim's
sandbox and files must be as they were."""

from __future__ import annotations

import json
import struct
import time

import pytest

from sbx_client import SbxClient
from secutil import attack

SCOPES = ["read", "sandboxes", "sessions", "files", "templates", "admin"]
SECRET = b"the victim's file"


def _sbx_id(e2b_id: str) -> str:
    return e2b_id.replace("sbx-", "sbx_", 1)


def _envelope(payload: dict) -> bytes:
    data = json.dumps(payload).encode()
    return struct.pack(">BI", 0, len(data)) + data


@pytest.fixture(scope="module")
def lab(sbxd, sclient, validator):
    admin = sclient
    made = []

    def tenant(name):
        t = admin.call("POST", "/v1/admin/tenants", json_body={"name": name}, expect=201).body["tenant"]
        tok = admin.call("POST", f"/v1/admin/tenants/{t['id']}/tokens",
                         json_body={"name": name, "scopes": SCOPES}, expect=201).body["token"]
        made.append(t["id"])
        return tok["token"], SbxClient(sbxd.url, tok["token"], validator)

    a_key, a = tenant("e2b-victim")
    b_key, b = tenant("e2b-attacker")

    def create(key):
        r = a.session.post(sbxd.url + "/sandboxes", headers={"X-API-KEY": key},
                        json={"templateID": "base", "timeout": 600, "metadata": {"who": key[-6:]}},
                        timeout=90)
        assert r.status_code == 201, r.text
        return r.json()

    victim, mine = create(a_key), create(b_key)
    a.call("PUT", f"/v1/sandboxes/{_sbx_id(victim['sandboxID'])}/files", params={"path": "/tmp/secret"},
           data=SECRET, headers={"Content-Type": "application/octet-stream"}, expect=(200, 201, 204))
    yield {"url": sbxd.url, "a": a, "b": b, "a_key": a_key, "b_key": b_key, "victim": victim,
           "mine": mine}
    for t in made:
        admin.call("DELETE", f"/v1/admin/tenants/{t}", expect=202)
    deadline = time.monotonic() + 60
    for t in made:
        while admin.call("GET", f"/v1/admin/tenants/{t}").status_code != 404:
            assert time.monotonic() < deadline, f"tenant {t}'s sandboxes not deleted in 60 s"
            time.sleep(0.1)
    a.close()
    b.close()


def _victim_intact(lab):
    sb = lab["a"].get_sandbox(_sbx_id(lab["victim"]["sandboxID"]))
    assert sb["state"] == "running", sb["state"]
    r = lab["a"].session.get(f"{lab['url']}/v1/sandboxes/{sb['id']}/files",
                          params={"path": "/tmp/secret"},
                          headers={"Authorization": f"Bearer {lab['a_key']}"}, timeout=30)
    assert r.status_code == 200 and r.content == SECRET, (r.status_code, r.content[:100])


CONTROL_PLANE = [
    ("GET", "/sandboxes/{id}", None),
    ("DELETE", "/sandboxes/{id}", None),
    ("POST", "/sandboxes/{id}/timeout", {"timeout": 1}),
    ("POST", "/sandboxes/{id}/refreshes", {"duration": 1}),
    ("POST", "/sandboxes/{id}/pause", {}),
    ("POST", "/sandboxes/{id}/resume", {}),
    ("POST", "/sandboxes/{id}/connect", {"timeout": 1}),
    ("POST", "/v2/sandboxes/{id}/connect", {}),
    ("GET", "/sandboxes/{id}/metrics", None),
    ("GET", "/sandboxes/{id}/logs", None),
]


@attack("tenancy", "use another tenant's sandbox id on an E2B control-plane route")
@pytest.mark.parametrize("method,path,body", CONTROL_PLANE, ids=[f"{m} {p}" for m, p, _ in CONTROL_PLANE])
def test_another_tenants_sandbox_is_404(lab, method, path, body):
    url = lab["url"] + path.format(id=lab["victim"]["sandboxID"])
    r = lab["b"].session.request(method, url, headers={"X-API-KEY": lab["b_key"]}, json=body, timeout=60)
    assert r.status_code == 404 and r.json()["code"] == 404, (r.status_code, r.text)
    _victim_intact(lab)


@attack("tenancy", "list sandboxes through the E2B API with another tenant's key")
def test_another_tenants_sandboxes_are_not_listed(lab):
    for path in ("/sandboxes", "/v2/sandboxes"):
        r = lab["b"].session.get(lab["url"] + path, headers={"X-API-KEY": lab["b_key"]},
                              params={"state": "running,paused"} if "v2" in path else None)
        assert r.status_code == 200, r.text
        ids = {s["sandboxID"] for s in r.json()}
        assert lab["victim"]["sandboxID"] not in ids and lab["mine"]["sandboxID"] in ids, ids


ENVD = [
    ("GET", "/health", {}, None),
    ("GET", "/files?path=/tmp/secret", {}, None),
    ("POST", "/files?path=/tmp/secret", {"Content-Type": "application/octet-stream"}, b"overwritten"),
    ("POST", "/filesystem.Filesystem/Stat", {"Content-Type": "application/json"},
     json.dumps({"path": "/tmp/secret"}).encode()),
    ("POST", "/filesystem.Filesystem/Remove", {"Content-Type": "application/json"},
     json.dumps({"path": "/tmp/secret"}).encode()),
    ("POST", "/process.Process/List", {"Content-Type": "application/json"}, b"{}"),
    ("POST", "/process.Process/Start", {"Content-Type": "application/connect+json"},
     _envelope({"process": {"cmd": "/bin/rm", "args": ["-f", "/tmp/secret"]}})),
]


def _refused(r) -> bool:
    if r.headers.get("Content-Type", "").startswith("application/connect+json"):
        body = r.content
        flags, n = struct.unpack(">BI", body[:5])
        return flags == 2 and json.loads(body[5:5 + n])["error"]["code"] == "unauthenticated"
    return r.status_code == 401


@attack("tenancy", "use one sandbox's envd token (or none) on another sandbox's envd")
@pytest.mark.parametrize("method,path,headers,body", ENVD, ids=[f"{m} {p}" for m, p, _, _ in ENVD])
@pytest.mark.parametrize("token", ["other", "none", "api_key", "traffic"])
def test_envd_needs_the_sandboxs_own_token(lab, method, path, headers, body, token):
    h = {"E2b-Sandbox-Id": lab["victim"]["sandboxID"], "E2b-Sandbox-Port": "49983", **headers}
    cred = {"other": lab["mine"]["envdAccessToken"], "none": None, "api_key": lab["a_key"],
            "traffic": lab["victim"]["trafficAccessToken"]}[token]
    if cred is not None:
        h["X-Access-Token"] = cred
    r = lab["b"].session.request(method, lab["url"] + path, headers=h, data=body, timeout=60)
    assert _refused(r), (r.status_code, r.content[:200])
    _victim_intact(lab)


@attack("tenancy", "use an envd token as a management token (E2B API key, sbx bearer)")
def test_envd_token_is_not_a_management_token(lab):
    tok = lab["victim"]["envdAccessToken"]
    r = lab["b"].session.get(lab["url"] + "/v2/sandboxes", headers={"X-API-KEY": tok})
    assert r.status_code == 401, r.text
    r = lab["b"].session.delete(f"{lab['url']}/v1/sandboxes/{_sbx_id(lab['victim']['sandboxID'])}",
                             headers={"Authorization": f"Bearer {tok}"})
    assert r.status_code == 401, r.text
    _victim_intact(lab)

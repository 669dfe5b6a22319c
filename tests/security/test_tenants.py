"""Cross-tenant attacks (docs/tenancy.md): tenant B, with a token holding every scope
(its tenant's admin included), goes after tenant A's sandbox, session, operation, tenant and
token on every route of openapi.yaml that names one (tests/e2e/cross_tenant.py). Each route is
one case of the report: it must answer 404 `not_found`, exactly as for an object that does not
exist, and A's objects must be as they were."""

from __future__ import annotations

import time

import pytest

import cross_tenant
from sbx_client import SbxClient
from secutil import attack

SCOPES = ["read", "sandboxes", "sessions", "files", "templates", "admin"]


@pytest.fixture(scope="module")
def tenants(sbxd, sclient, validator):
    admin = sclient

    def tenant(name):
        t = admin.call("POST", "/v1/admin/tenants", json_body={"name": name}, expect=201).body["tenant"]
        tok = admin.call("POST", f"/v1/admin/tenants/{t['id']}/tokens",
                         json_body={"name": name, "scopes": SCOPES}, expect=201).body["token"]
        return t["id"], tok, SbxClient(sbxd.url, tok["token"], validator)

    a_id, a_tok, a = tenant("victim")
    b_id, _, b = tenant("attacker")
    sb = a.create_sandbox({"labels": {"security": "tenant-a"}})["sandbox"]
    a.call("PUT", f"/v1/sandboxes/{sb['id']}/files", params={"path": "/tmp/mine"}, data=b"mine",
           headers={"Content-Type": "application/octet-stream"}, expect=(200, 201, 204))
    ses = a.create_session(sb["id"], ["sleep", "600"], stdin=True)
    ses_id = ses.get("session_id") or ses["session"]["id"]
    # A finished operation of A's to aim at (a pause, then a wake).
    op = a.call("POST", f"/v1/sandboxes/{sb['id']}/pause", json_body={}, expect=202).body["operation"]
    a.wait_operation(op["id"])
    a.wait_operation(a.call("POST", f"/v1/sandboxes/{sb['id']}/wake", json_body={},
                            expect=202).body["operation"]["id"])
    ids = {"sandbox_id": sb["id"], "session_id": ses_id, "operation_id": op["id"],
           "tenant_id": a_id, "token_id": a_tok["id"]}
    yield {"a": a, "b": b, "ids": ids, "session_state": a.get_session(ses_id)["state"]}
    # Deleting the tenants deletes their sandboxes; the suite's end checks nothing is left.
    for t in (a_id, b_id):
        admin.call("DELETE", f"/v1/admin/tenants/{t}", expect=202)
    # A tenant's row goes once its sandboxes are deleted: then nothing of it runs.
    deadline = time.monotonic() + 60
    for t in (a_id, b_id):
        while admin.call("GET", f"/v1/admin/tenants/{t}").status_code != 404:
            assert time.monotonic() < deadline, f"tenant {t}'s sandboxes not deleted in 60 s"
            time.sleep(0.1)
    a.close()
    b.close()


@attack("tenancy", "use another tenant's object id on a route that names one")
@pytest.mark.parametrize("method,path", cross_tenant.routes(),
                         ids=[f"{m} {p}" for m, p in cross_tenant.routes()])
def test_another_tenants_object_is_404(tenants, method, path):
    a, b, ids = tenants["a"], tenants["b"], tenants["ids"]
    url, kwargs = cross_tenant.request(method, path, ids)
    r = b.call(method, url, **kwargs)
    assert r.status_code == 404, f"{method} {url}: {r.status_code} {r.body}"
    assert r.body["error"]["code"] == "not_found", r.body
    # Nothing of A's changed.
    sb = a.get_sandbox(ids["sandbox_id"])
    assert sb["state"] == "running", sb
    assert a.get_session(ids["session_id"])["state"] == tenants["session_state"]
    got = a.call("GET", f"/v1/sandboxes/{ids['sandbox_id']}/files", params={"path": "/tmp/mine"},
                 expect=200)
    assert got.content == b"mine"
    t = a.call("GET", f"/v1/admin/tenants/{ids['tenant_id']}", expect=200).body["tenant"]
    assert t["name"] == "victim" and t["state"] == "active"
    tok = a.call("GET", f"/v1/admin/tokens/{ids['token_id']}", expect=200).body["token"]
    assert tok["revoked_at"] is None

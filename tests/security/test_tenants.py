"""Cross-tenant attacks (docs/tenancy.md): tenant B, with a token holding every scope
(its tenant's admin included), goes after tenant A's sandbox, session, operation, tenant and
token on every route of openapi.yaml that names one (tests/e2e/cross_tenant.py). Each route is
one case of the report: it must answer 404 `not_found`, exactly as for an object that does not
exist, and A's objects must be as they were."""

from __future__ import annotations

import json
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
    if method != "HEAD":  # a HEAD's answer has no body
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


@pytest.fixture(scope="module")
def a_template(tenants, tmp_path_factory):
    """A template of A's own ("secret-tpl"), and its release digest."""
    import images  # tests/e2e: image archives written with skopeo
    work = tmp_path_factory.mktemp("tenant-templates")
    images.write_layout(work / "layout", [images.busybox_layer().file("marker", "a\n").bytes()],
                        env=["PATH=/bin"])
    data = images.docker_archive(work / "layout", work / "a.tar").read_bytes()
    a = tenants["a"]
    op = a.call("POST", "/v1/templates:import", params={"name": "secret-tpl"}, data=data,
                headers={"Content-Type": "application/x-tar"}, expect=202).body["operation"]
    done = a.wait_operation(op["id"], timeout=120)
    assert done["state"] == "succeeded", done
    return done["result"]["template"]["digest"]


# (method, path, body, status): B naming A's template by its name or its digest. Every answer is
# what a template that does not exist gets.
TEMPLATE_ATTACKS = [
    ("GET", "/v1/templates/secret-tpl", None, 404),
    ("DELETE", "/v1/templates/secret-tpl", None, 404),
    ("DELETE", "/v1/templates/secret-tpl:latest", None, 404),
    ("PUT", "/v1/templates/stolen:1", {"from": "secret-tpl"}, 404),
    ("PUT", "/v1/templates/stolen:2", {"from": "secret-tpl@DIGEST"}, 404),
    ("POST", "/v1/sandboxes", {"template": "secret-tpl"}, 422),
    ("POST", "/v1/sandboxes", {"template": "secret-tpl@DIGEST"}, 422),
    ("POST", "/v1/templates",
     {"name": "built", "source": {"build": {"dockerfile": "FROM secret-tpl\nENV X=1\n"}}}, 202),
    ("POST", "/v1/templates",
     {"name": "built", "source": {"build": {"dockerfile": "FROM secret-tpl@DIGEST\n"}}}, 202),
]


@attack("tenancy", "reach another tenant's template by its name or digest: read, delete, tag "
                   "from it, create from it, build FROM it")
@pytest.mark.parametrize("method,path,body,status", TEMPLATE_ATTACKS,
                         ids=[f"{m} {p} #{i}" for i, (m, p, _, _) in enumerate(TEMPLATE_ATTACKS)])
def test_another_tenants_template_does_not_exist(tenants, a_template, method, path, body, status):
    a, b = tenants["a"], tenants["b"]
    if body is not None:
        body = json.loads(json.dumps(body).replace("DIGEST", a_template))
    r = b.call(method, path, json_body=body, expect=status)
    if status == 202:
        # A build: it fails as FROM a name that does not exist.
        op = b.wait_operation(r.body["operation"]["id"], timeout=120)
        assert op["state"] == "failed" and op["error"]["code"] == "template_not_found", op
        assert "secret-tpl" not in op["error"]["message"].split("available:")[-1], op
    elif status == 422:
        err = r.body["error"]
        assert err["code"] == "template_not_found", err
        assert "secret-tpl" not in err["message"].split("available:")[-1], err
    else:
        assert r.body["error"]["code"] == "not_found", r.body
    # Nothing of A's changed, and B sees none of it.
    t = a.call("GET", "/v1/templates/secret-tpl", expect=200).body
    assert t["tags"] == {"latest": a_template} and t["shared"] is False, t
    listed = b.call("GET", "/v1/templates", expect=200).body["templates"]
    assert all(x["name"] not in ("secret-tpl", "stolen", "built") for x in listed), listed

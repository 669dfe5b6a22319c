"""Tenants, scoped management tokens, quotas, rate limits, the audit log and expired sandboxes
(docs/tenancy.md). One sbxd of its own: its tenants, rates and quotas must not leak into the
other suites. Cross-tenant access is checked on every route of the OpenAPI document that
names an object, so that a new route cannot be forgotten."""
from __future__ import annotations

import concurrent.futures
import json
import time

import pytest
import cross_tenant
import tenancy_lab
from sbx_client import SbxClient

ALL_SCOPES = tenancy_lab.ALL_SCOPES
Lab = tenancy_lab.TenancyLab


@pytest.fixture(scope="module")
def lab(validator):
    lab = Lab(validator)
    try:
        yield lab
    finally:
        problems = lab.close()
        assert not problems, problems


def wait_running(client: SbxClient, created: dict) -> dict:
    op = client.wait_operation(created["operation"]["id"], timeout=120)
    assert op["state"] == "succeeded", op
    return client.get_sandbox(created["sandbox"]["id"])


def test_tokens_are_shown_once_scoped_revoked_and_expire(lab):
    ten = lab.tenant("alpha")
    tok = lab.token(ten, ["read", "sandboxes"])
    listed = lab.admin.call("GET", f"/v1/admin/tenants/{ten}/tokens", expect=200).body["tokens"]
    assert [t["id"] for t in listed] == [tok["id"]]
    assert "token" not in listed[0] and tok["token"] not in json.dumps(listed)
    c = lab.client(tok["token"])
    assert c.call("GET", "/v1/sandboxes", expect=200).body["sandboxes"] == []
    # A scope it lacks: 403 naming it; the admin's list shows nothing of this tenant's.
    r = c.call("POST", "/v1/templates:gc", expect=403)
    assert r.body["error"]["code"] == "missing_scope"
    assert r.body["error"]["details"]["scope"] == "templates", r.body
    r = c.call("GET", "/v1/admin/tenants", expect=403)
    assert r.body["error"]["details"]["scope"] == "admin"
    # No token may grant what it does not hold.
    admin_of_alpha = lab.client(lab.token(ten, ["admin"])["token"])
    ro = lab.token(ten, ["read"], by=admin_of_alpha)
    reader = lab.client(ro["token"])
    r = lab.client(lab.token(ten, ["read", "sandboxes"])["token"])
    # Revocation: the next request is 401.
    lab.admin.call("DELETE", f"/v1/admin/tokens/{ro['id']}", expect=200)
    r = reader.call("GET", "/v1/sandboxes", expect=401)
    assert r.body["error"]["code"] == "unauthenticated"
    # Expiry.
    short = lab.client(lab.token(ten, ["read"], expires_in_s=1)["token"])
    deadline = time.monotonic() + 10
    while short.call("GET", "/v1/sandboxes").status_code == 200:
        assert time.monotonic() < deadline, "an expired token still works"
        time.sleep(0.2)
    assert short.call("GET", "/v1/sandboxes", expect=401).body["error"]["message"] == "token expired"
    # Malformed and unknown tokens, each 401 and nothing more.
    good = tok["token"]
    for bad in ("sbxm1_", good[:-1], good + "x", good.replace("sbxm1_", "sbxm2_"),
                good[:6] + "a" * 20 + good[26:], "sbxm1_" + "A" * 20 + good[26:],
                "x" * 5000, good.upper()):
        r = lab.admin.call("GET", "/v1/sandboxes", token=bad, expect=401)
        assert r.body["error"]["code"] == "unauthenticated", bad
    # A bad scope name or body: 400 naming the field.
    r = lab.admin.call("POST", f"/v1/admin/tenants/{ten}/tokens",
                       json_body={"name": "x", "scopes": ["root"]}, expect=400)
    assert "root" in r.body["error"]["message"]
    r = lab.admin.call("POST", "/v1/admin/tenants", json_body={"name": "q", "quotas": {"max_x": 1}},
                       expect=400)
    assert r.body["error"]["details"]["field"] == "quotas.max_x"


def test_another_tenants_objects_are_404_on_every_route_and_nothing_changes(lab):
    a_ten, b_ten = lab.tenant("owner"), lab.tenant("intruder")
    a_tok = lab.token(a_ten)
    a = lab.client(a_tok["token"])
    b = lab.client(lab.token(b_ten)["token"])
    sb = wait_running(a, a.create_sandbox({}, wait=False))
    a.call("PUT", f"/v1/sandboxes/{sb['id']}/files", params={"path": "/tmp/mine"}, data=b"mine",
           headers={"Content-Type": "application/octet-stream"}, expect=(200, 201, 204))
    ses = a.create_session(sb["id"], ["sleep", "300"], stdin=True)
    ses_id = ses["session_id"] if "session_id" in ses else ses["session"]["id"]
    ses_state = a.get_session(ses_id)["state"]
    ids = {"sandbox_id": sb["id"], "session_id": ses_id, "tenant_id": a_ten,
           "token_id": a_tok["id"], "port": "8080", "path": "x"}
    checked = []
    for method, path in cross_tenant.routes():
        if "{operation_id}" in path:
            continue  # below, with an operation of A's
        url, kwargs = cross_tenant.request(method, path, ids)
        r = b.call(method, url, **kwargs)
        assert r.status_code == 404, f"{method} {url}: {r.status_code} {r.body}"
        if method != "HEAD":  # a HEAD's answer has no body
            assert r.body["error"]["code"] == "not_found", (url, r.body)
        checked.append(f"{method} {path}")
    # Operations: A's create operation, read and cancelled by B.
    a_ops = a.call("POST", f"/v1/sandboxes/{sb['id']}/pause", json_body={}, expect=202).body
    op_id = a_ops["operation"]["id"]
    for method, path in cross_tenant.routes():
        if "{operation_id}" not in path:
            continue
        url, kwargs = cross_tenant.request(method, path, dict(ids, operation_id=op_id))
        r = b.call(method, url, **kwargs)
        assert r.status_code == 404, (url, r.status_code, r.body)
        checked.append(f"{method} {path}")
    assert a.wait_operation(op_id)["state"] == "succeeded"
    a.call("POST", f"/v1/sandboxes/{sb['id']}/wake", json_body={}, expect=202)
    # Every route that names an object was tried (the report counts them).
    assert sorted(checked) == sorted(f"{m} {p}" for m, p in cross_tenant.routes()), checked
    # Every refused change left an audit row of B's (a session's stdin and resize excepted:
    # an interactive session would fill the log).
    rows = lab.admin.call("GET", "/v1/admin/audit", params={"tenant": b_ten, "limit": 500},
                          expect=200).body["audit"]
    audited = {r["action"] for r in rows if r["status"] == 404}
    # A port's relay is the sandbox's data plane, not a management action: never audited.
    for method, path in cross_tenant.routes():
        if method in ("GET", "HEAD") or path.endswith(("/stdin", "/resize")) or "/ports/" in path:
            continue
        url, _ = cross_tenant.request(method, path, dict(ids, operation_id=op_id))
        assert f"{method} {url}" in audited, (method, url, sorted(audited))
    print(f"cross-tenant: {len(checked)} routes answered 404 to another tenant")
    # Nothing changed: A's sandbox, file, session, token and tenant are as they were.
    deadline = time.monotonic() + 60
    while a.get_sandbox(sb["id"])["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    r = a.call("GET", f"/v1/sandboxes/{sb['id']}/files", params={"path": "/tmp/mine"}, expect=200)
    assert r.content == b"mine"
    assert a.get_session(ses_id)["state"] == ses_state
    assert a.call("GET", f"/v1/admin/tenants/{a_ten}", expect=200).body["tenant"]["name"] == "owner"
    assert a.call("GET", f"/v1/admin/tokens/{a_tok['id']}", expect=200).body["token"]["revoked_at"] is None
    # B's own list shows none of A's.
    assert b.call("GET", "/v1/sandboxes", expect=200).body["sandboxes"] == []
    tenants = b.call("GET", "/v1/admin/tenants", expect=200).body["tenants"]
    assert [t["id"] for t in tenants] == [b_ten]
    # The same Idempotency-Key in two tenants: two sandboxes.
    key = "same-key-in-two-tenants"
    one = a.create_sandbox({}, wait=False, idempotency_key=key)["sandbox"]["id"]
    two = b.create_sandbox({}, wait=False, idempotency_key=key)["sandbox"]["id"]
    assert one != two
    for c, i in ((a, one), (b, two), (a, sb["id"])):
        c.delete_sandbox(i)


def test_quotas_hold_under_concurrency(lab):
    ten = lab.tenant("quota", quotas={"max_sandboxes": 2, "max_sessions_per_sandbox": 1,
                                      "max_memory_mib": 100000})
    c = lab.client(lab.token(ten)["token"])
    # Ten at once against a limit of two: exactly two.
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        rs = list(pool.map(lambda _: c.clone().call("POST", "/v1/sandboxes", json_body={}),
                           range(10)))
    made = [r for r in rs if r.status_code == 202]
    refused = [r for r in rs if r.status_code == 429]
    assert len(made) == 2 and len(refused) == 8, [r.status_code for r in rs]
    for r in made:
        c.created_sandboxes.append(r.body["sandbox"]["id"])
    err = refused[0].body["error"]
    assert err["code"] == "quota_exceeded", err
    assert err["details"] == {"quota": "max_sandboxes", "limit": 2, "used": 2, "requested": 1}, err
    sb = wait_running(c, {"sandbox": made[0].body["sandbox"], "operation": made[0].body["operation"]})
    # Sessions per sandbox: one running, the second refused; once it exits, room again.
    # (A session not started yet counts: it holds its place until it has exited.)
    s1 = c.create_session(sb["id"], ["true"])
    s1_id = s1["session_id"] if "session_id" in s1 else s1["session"]["id"]
    r = c.call("POST", f"/v1/sandboxes/{sb['id']}/sessions", json_body={"argv": ["true"]},
               expect=429)
    assert r.body["error"]["details"]["quota"] == "max_sessions_per_sandbox"
    c.collect(c.attach(s1_id))  # runs it to its end
    deadline = time.monotonic() + 30
    while c.get_session(s1_id)["state"] != "exited":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    c.create_session(sb["id"], ["true"])
    # The tenant's usage, as the admin sees it; a lowered quota refuses the next create.
    usage = lab.admin.call("GET", f"/v1/admin/tenants/{ten}", expect=200).body["tenant"]["usage"]
    assert usage["sandboxes"] == 2 and usage["memory_mib"] > 0, usage
    lab.admin.call("PATCH", f"/v1/admin/tenants/{ten}",
                   json_body={"quotas": {"max_sandboxes": 5, "max_memory_mib": usage["memory_mib"]}},
                   expect=200)
    r = c.call("POST", "/v1/sandboxes", json_body={}, expect=429)
    assert r.body["error"]["details"]["quota"] == "max_memory_mib", r.body
    assert r.body["error"]["details"]["limit"] == usage["memory_mib"]
    for r in made:
        c.delete_sandbox(r.body["sandbox"]["id"])


def test_rate_limits_say_when_to_come_back(lab):
    ten = lab.tenant("rated", rate_limit={"requests_per_s": 0.5, "burst": 3})
    c = lab.client(lab.token(ten, ["read"])["token"])
    remaining = []
    for _ in range(3):
        r = c.call("GET", "/v1/sandboxes", expect=200)
        assert r.headers["RateLimit-Limit"] == "3", dict(r.headers)
        remaining.append(int(r.headers["RateLimit-Remaining"]))
    assert remaining == [2, 1, 0], remaining
    r = c.call("GET", "/v1/sandboxes", expect=429)
    assert r.body["error"]["code"] == "rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 2, dict(r.headers)
    assert int(r.headers["RateLimit-Reset"]) >= 1
    # The operator's token is never limited, another token has its own bucket.
    lab.admin.call("GET", "/v1/sandboxes", expect=200)
    other = lab.client(lab.token(ten, ["read"])["token"])
    other.call("GET", "/v1/sandboxes", expect=200)


def test_audit_rows_for_management_actions(lab):
    ten = lab.tenant("audited")
    tok = lab.token(ten)
    c = lab.client(tok["token"])
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    sb = wait_running(c, c.create_sandbox({}, wait=False))
    c.call("POST", f"/v1/sandboxes/{sb['id']}/sessions", json_body={"argv": ["true"]}, expect=201)
    c.call("POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/pause", json_body={}, expect=404)
    c.delete_sandbox(sb["id"])
    rows = lab.admin.call("GET", "/v1/admin/audit", params={"tenant": ten, "since": since},
                          expect=200).body["audit"]
    actions = [(r["action"].split(" ")[0], r["status"], r["token_id"]) for r in rows]
    assert ("POST", 202, tok["id"]) in actions, rows
    assert any(r["action"] == f"POST /v1/sandboxes/{sb['id']}/sessions" and r["status"] == 201
               for r in rows), rows
    refused = [r for r in rows if r["status"] == 404]
    assert refused and refused[0]["code"] == "not_found", rows
    assert any(r["action"] == f"DELETE /v1/sandboxes/{sb['id']}" for r in rows), rows
    assert all(r["tenant_id"] == ten and r["request_id"] for r in rows), rows
    creates = [r for r in rows if r["action"] == "POST /v1/sandboxes"]
    assert creates and creates[0]["target"] == sb["id"], rows
    # A tenant's admin sees its own rows only; another tenant's filter is 404.
    other = lab.tenant("other-audit")
    c.call("GET", "/v1/admin/audit", params={"tenant": other}, expect=404)
    mine = c.call("GET", "/v1/admin/audit", expect=200).body["audit"]
    assert mine and all(r["tenant_id"] == ten for r in mine)
    # Paging: two at a time, in order, without repeats.
    seqs, page = [], None
    for _ in range(100):
        params = {"tenant": ten, "limit": 2, **({"page_token": page} if page else {})}
        body = lab.admin.call("GET", "/v1/admin/audit", params=params, expect=200).body
        seqs += [r["seq"] for r in body["audit"]]
        page = body["next_page_token"]
        if not page:
            break
    assert seqs == sorted(set(seqs)) and len(seqs) >= len(rows)


def test_deleting_a_tenant_stops_its_tokens_and_deletes_its_sandboxes(lab):
    ten = lab.tenant("doomed")
    c = lab.client(lab.token(ten)["token"])
    sb = wait_running(c, c.create_sandbox({}, wait=False))
    r = lab.admin.call("DELETE", f"/v1/admin/tenants/{ten}", expect=202).body
    assert r["tenant"]["state"] == "deleting" and len(r["operations"]) == 1, r
    assert c.call("GET", "/v1/sandboxes", expect=401).body["error"]["code"] == "unauthenticated"
    deadline = time.monotonic() + 60
    while lab.admin.call("GET", f"/v1/admin/tenants/{ten}").status_code != 404:
        assert time.monotonic() < deadline, "the tenant was not removed"
        time.sleep(0.1)
    lab.admin.call("DELETE", "/v1/admin/tenants/default", expect=409)
    assert sb["id"]


def test_an_expired_sandbox_answers_410_saying_when_and_why(lab):
    sb = lab.admin.create_sandbox({"timeout_s": 2}, wait=False)["sandbox"]
    deadline = time.monotonic() + 30
    while lab.admin.get_sandbox(sb["id"])["state"] != "deleted":
        assert time.monotonic() < deadline, "the TTL did not delete the sandbox"
        time.sleep(0.2)
    for method, path, body in (("POST", f"/v1/sandboxes/{sb['id']}/sessions", {"argv": ["true"]}),
                               ("POST", f"/v1/sandboxes/{sb['id']}/pause", {}),
                               ("GET", f"/v1/sandboxes/{sb['id']}/files:list", None)):
        kw = {"json_body": body} if body is not None else {"params": {"path": "/"}}
        r = lab.admin.call(method, path, expect=410, **kw)
        err = r.body["error"]
        assert err["code"] == "sandbox_expired", err
        assert err["details"]["reason"] == "timeout" and err["details"]["expired_at"], err
        assert "timeout_s of 2 s" in err["message"], err
    # The record itself still reads, and a delete answers with the TTL's operation.
    assert lab.admin.get_sandbox(sb["id"])["state"] == "deleted"
    # A sandbox deleted by its owner is not "expired".
    other = lab.admin.create_sandbox({})["sandbox"]
    lab.admin.delete_sandbox(other["id"])
    r = lab.admin.call("POST", f"/v1/sandboxes/{other['id']}/sessions", json_body={"argv": ["true"]})
    assert r.status_code == 409 and r.body["error"]["code"] == "sandbox_not_running", r.body


def test_attach_keys_rotate_with_overlap(lab):
    admin = lab.admin
    before = admin.call("GET", "/v1/admin/attach-keys", expect=200).body
    sb = admin.create_sandbox({})["sandbox"]
    old = admin.create_session(sb["id"], ["echo", "old"])
    assert old["attach"]["token"].startswith(f"sat2.{before['signing_key_id']}."), old["attach"]
    after = admin.call("POST", "/v1/admin/attach-keys:rotate", expect=200).body
    assert after["signing_key_id"] != before["signing_key_id"]
    retired = [k for k in after["keys"] if k["id"] == before["signing_key_id"]]
    assert retired and retired[0]["retire_at"], after
    # The token minted before still opens its session; a new one names the new key.
    r = admin.collect(admin.attach(old))
    assert r.stdout == b"old\n", r
    new = admin.create_session(sb["id"], ["true"])
    assert new["attach"]["token"].startswith(f"sat2.{after['signing_key_id']}.")
    assert "key" not in str(after["keys"][0].keys() - {"id", "created_at", "retire_at"})
    # A tenant's admin cannot see or rotate the deployment's keys.
    ten_admin = lab.client(lab.token(lab.tenant("keys"), ["admin"])["token"])
    r = ten_admin.call("POST", "/v1/admin/attach-keys:rotate", expect=403)
    assert r.body["error"]["code"] == "missing_scope"
    admin.delete_sandbox(sb["id"])


def test_idempotent_create_under_concurrency_and_on_every_mutating_route(lab):
    ten = lab.tenant("idem")
    c = lab.client(lab.token(ten)["token"])
    key = "ten-at-once"
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        rs = list(pool.map(lambda _: c.clone().call("POST", "/v1/sandboxes", json_body={},
                                                    headers={"Idempotency-Key": key}),
                           range(10)))
    assert [r.status_code for r in rs] == [202] * 10, [r.status_code for r in rs]
    ids = {r.body["sandbox"]["id"] for r in rs}
    assert len(ids) == 1, ids
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in rs) == 9
    sid = ids.pop()
    c.created_sandboxes.append(sid)
    wait_running(c, {"sandbox": rs[0].body["sandbox"], "operation": rs[0].body["operation"]})
    # A route whose service call does not record the key: the router claims it. Five at once
    # make one directory; the others replay its answer.
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        rs = list(pool.map(lambda _: c.clone().call(
            "POST", f"/v1/sandboxes/{sid}/files:mkdir", json_body={"path": "/tmp/once"},
            headers={"Idempotency-Key": "mkdir-once"}), range(5)))
    codes = {r.status_code for r in rs}
    assert len(codes) == 1 and codes < {200, 201}, [(r.status_code, r.body) for r in rs]
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in rs) == 4
    assert len({json.dumps(r.body, sort_keys=True) for r in rs}) == 1
    # The same key with another request: 409; a fresh key runs again (and fails: it exists).
    r = c.call("POST", f"/v1/sandboxes/{sid}/files:mkdir", json_body={"path": "/tmp/other"},
               headers={"Idempotency-Key": "mkdir-once"}, expect=409)
    assert r.body["error"]["code"] == "idempotency_key_reused"
    r = c.call("POST", f"/v1/sandboxes/{sid}/files:mkdir", json_body={"path": "/tmp/once"},
               headers={"Idempotency-Key": "mkdir-twice"})
    assert r.status_code == 409 and "Idempotent-Replayed" not in r.headers, r.body
    # Admin routes too: one token, whatever the retries.
    toks = [lab.admin.call("POST", f"/v1/admin/tenants/{ten}/tokens",
                           json_body={"name": "retried", "scopes": ["read"]},
                           headers={"Idempotency-Key": "one-token"}, expect=201) for _ in range(3)]
    assert len({t.body["token"]["id"] for t in toks}) == 1
    listed = lab.admin.call("GET", f"/v1/admin/tenants/{ten}/tokens", expect=200).body["tokens"]
    assert sum(t["name"] == "retried" for t in listed) == 1
    # Another tenant's same key is its own.
    other = lab.client(lab.token(lab.tenant("idem-other"))["token"])
    mine = other.call("POST", "/v1/sandboxes", json_body={}, headers={"Idempotency-Key": key},
                      expect=202)
    assert mine.body["sandbox"]["id"] != sid and "Idempotent-Replayed" not in mine.headers
    other.created_sandboxes.append(mine.body["sandbox"]["id"])
    other.delete_sandbox(mine.body["sandbox"]["id"])
    c.delete_sandbox(sid)


def test_an_upload_key_is_its_tenants_own(lab):
    """Idempotency-Key on an upload (its body streams) is scoped per tenant as on any route:
    another tenant's request with the same key and URL is not a replay of the first's answer
    (it is 404: the sandbox is not its), and the same key on its own sandbox runs."""
    clients, sandboxes = [], []
    for name in ("up-a", "up-b"):
        c = lab.client(lab.token(lab.tenant(name))["token"])
        created = c.create_sandbox({}, wait=False)
        clients.append(c)
        sandboxes.append(wait_running(c, created)["id"])
    (a, b), (sa, sb) = clients, sandboxes
    headers = {"Idempotency-Key": "upload-once", "Content-Type": "application/octet-stream"}

    def put(c, sid, data):
        return c.call("PUT", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/up"},
                      data=data, headers=headers)

    first = put(a, sa, b"from a\n")
    assert first.status_code == 200 and "Idempotent-Replayed" not in first.headers, first.body
    foreign = put(b, sa, b"from a\n")
    assert foreign.status_code == 404 and "Idempotent-Replayed" not in foreign.headers, foreign.body
    own = put(b, sb, b"from a\n")
    assert own.status_code == 200 and "Idempotent-Replayed" not in own.headers, own.body
    assert put(a, sa, b"from a\n").headers.get("Idempotent-Replayed") == "true"
    assert put(b, sb, b"from a\n").headers.get("Idempotent-Replayed") == "true"
    for c, sid in zip(clients, sandboxes):
        got = c.call("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/up"}, expect=200)
        assert got.content == b"from a\n"
        c.delete_sandbox(sid)


def test_an_attach_token_opens_only_its_own_tenants_session(lab):
    ten_a = lab.tenant("att-a")
    a = lab.client(lab.token(ten_a)["token"])
    b = lab.client(lab.token(lab.tenant("att-b"))["token"])
    sa = wait_running(a, a.create_sandbox({}, wait=False))
    sb = wait_running(b, b.create_sandbox({}, wait=False))
    ses_a = a.create_session(sa["id"], ["true"])
    ses_b = b.create_session(sb["id"], ["true"])
    # A's attach token on B's session, and A's management token on it: nothing opens.
    r = a.call("GET", f"/v1/sessions/{ses_b['session_id']}/attach", token=ses_a["attach"]["token"],
               headers={"Accept": "text/event-stream"}, expect=401)
    assert r.body["error"]["code"] == "unauthenticated"
    a.call("GET", f"/v1/sessions/{ses_b['session_id']}/attach",
           headers={"Accept": "text/event-stream"}, expect=404)
    # A token of A's without the sessions scope reads the session but cannot open its stream.
    reader = lab.client(lab.token(ten_a, ["read"])["token"])
    assert reader.call("GET", f"/v1/sessions/{ses_a['session_id']}", expect=200)
    r = reader.call("GET", f"/v1/sessions/{ses_a['session_id']}/attach",
                    headers={"Accept": "text/event-stream"}, expect=403)
    assert r.body["error"]["details"]["scope"] == "sessions"
    # B's session is untouched: it starts at its own first attach and runs to its end.
    assert b.collect(b.attach(ses_b)).exit["exit_code"] == 0
    for c, s in ((a, sa), (b, sb)):
        c.delete_sandbox(s["id"])

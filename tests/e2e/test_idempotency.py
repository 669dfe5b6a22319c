"""Idempotency-Key on create, delete and session create."""

import secrets

from sbx_client import check_error_body


def key() -> str:
    return "e2e-" + secrets.token_hex(12)


def test_create_replay_same_key_same_body(api):
    k = key()
    body = {"labels": {"e2e": "idempotency"}, "resources": {"vcpu": 1}}
    first = api.create_sandbox(body, idempotency_key=k, wait=False)
    assert first["response"].headers.get("Idempotent-Replayed") in (None, "false"), \
        "a first request is not a replay"
    second = api.create_sandbox(body, idempotency_key=k, wait=False)
    assert second["response"].headers.get("Idempotent-Replayed") == "true", dict(second["response"].headers)
    assert second["response"].status_code == first["response"].status_code
    assert second["sandbox"]["id"] == first["sandbox"]["id"]
    assert second["operation"]["id"] == first["operation"]["id"]
    # The replay did not create a second sandbox.
    labelled = [s for s in api.list_sandboxes(label="e2e=idempotency") if s["id"] != first["sandbox"]["id"]]
    assert not labelled, f"replay created another sandbox: {labelled}"
    op = api.wait_operation(first["operation"]["id"])
    assert op["state"] == "succeeded", op
    # Same key, different body.
    resp = api.call("POST", "/v1/sandboxes", json_body={"labels": {"e2e": "other"}},
                    headers={"Idempotency-Key": k})
    assert resp.status_code == 409, f"expected 409, got {resp.status_code}: {resp.body}"
    check_error_body(resp, resp.body, "idempotency_key_reused")
    # A replay after completion still returns the original ids.
    third = api.create_sandbox(body, idempotency_key=k, wait=False)
    assert third["sandbox"]["id"] == first["sandbox"]["id"]
    assert third["response"].headers.get("Idempotent-Replayed") == "true"


def test_different_keys_create_different_sandboxes(api):
    a = api.create_sandbox({}, idempotency_key=key(), wait=False)
    b = api.create_sandbox({}, idempotency_key=key(), wait=False)
    assert a["sandbox"]["id"] != b["sandbox"]["id"]
    for x in (a, b):
        assert api.wait_operation(x["operation"]["id"])["state"] == "succeeded"


def test_session_and_delete_replay(api, sandbox):
    k = key()
    s1 = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", json_body={"argv": ["echo", "once"]},
                  headers={"Idempotency-Key": k}, expect=201)
    s2 = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", json_body={"argv": ["echo", "once"]},
                  headers={"Idempotency-Key": k}, expect=201)
    assert s2.headers.get("Idempotent-Replayed") == "true"
    assert s2.body["session_id"] == s1.body["session_id"]
    resp = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", json_body={"argv": ["echo", "twice"]},
                    headers={"Idempotency-Key": k})
    assert resp.status_code == 409, resp.status_code
    check_error_body(resp, resp.body, "idempotency_key_reused")
    with api.attach(s1.body) as stream:
        assert api.collect(stream).stdout == b"once\n"

    dk = key()
    d1 = api.call("DELETE", f"/v1/sandboxes/{sandbox['id']}", headers={"Idempotency-Key": dk}, expect=202)
    d2 = api.call("DELETE", f"/v1/sandboxes/{sandbox['id']}", headers={"Idempotency-Key": dk}, expect=202)
    assert d2.headers.get("Idempotent-Replayed") == "true"
    assert d2.body["operation"]["id"] == d1.body["operation"]["id"]
    assert api.wait_operation(d1.body["operation"]["id"])["state"] == "succeeded"


def test_bad_idempotency_key(api):
    for bad in ("k" * 256, "has\x7fdel"):
        resp = api.call("POST", "/v1/sandboxes", json_body={}, headers={"Idempotency-Key": bad})
        if resp.status_code == 202:
            api.created_sandboxes.append(resp.body["sandbox"]["id"])
        assert resp.status_code == 400, f"Idempotency-Key {bad!r}: expected 400, got {resp.status_code}"
        check_error_body(resp, resp.body, "invalid_argument")


def test_a_key_is_replayed_across_a_restart_of_sbxd(restartable):
    """The key is in the store: a retry after sbxd restarted gets the first answer, not a
    second sandbox."""
    client = restartable.start()
    restartable.track(client)
    first = client.call("POST", "/v1/sandboxes", json_body={},
                        headers={"Idempotency-Key": "across-a-restart"}, expect=202)
    client.wait_operation(first.body["operation"]["id"])
    client.created_sandboxes.append(first.body["sandbox"]["id"])
    client = restartable.restart()
    restartable.track(client)
    client.created_sandboxes.append(first.body["sandbox"]["id"])
    again = client.call("POST", "/v1/sandboxes", json_body={},
                        headers={"Idempotency-Key": "across-a-restart"}, expect=202)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.body["sandbox"]["id"] == first.body["sandbox"]["id"]
    client.delete_sandbox(first.body["sandbox"]["id"])

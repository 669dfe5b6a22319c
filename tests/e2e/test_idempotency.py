"""Idempotency-Key on create, delete and session create, and on requests whose body streams
(file uploads, template imports)."""

import concurrent.futures
import secrets
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import images
from conftest import ns_runtime_only
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


# ---- requests whose body streams (file uploads, template imports) -------------------------------

def put_file(client, sid: str, path: str, data, k: str | None, **kw):
    headers = {"Content-Type": "application/octet-stream"}
    if k is not None:
        headers["Idempotency-Key"] = k
    return client.call("PUT", f"/v1/sandboxes/{sid}/files", params={"path": path}, data=data,
                       headers=headers, **kw)


def read_file(client, sid: str, path: str) -> bytes:
    return client.call("GET", f"/v1/sandboxes/{sid}/files", params={"path": path}, expect=200).content


def test_an_upload_with_a_key_is_written_once(api, sandbox):
    sid, k = sandbox["id"], key()
    body = b"first\n" * 50000  # 300 KB: more than one read of the body
    first = put_file(api, sid, "/tmp/once", body, k, expect=200)
    assert first.headers.get("Idempotent-Replayed") is None
    # Changed behind the key's back: a replay must not write the file again.
    api.run(sid, ["sh", "-c", "echo changed > /tmp/once"])
    again = put_file(api, sid, "/tmp/once", body, k, expect=200)
    assert again.headers.get("Idempotent-Replayed") == "true", dict(again.headers)
    assert again.body == first.body
    assert read_file(api, sid, "/tmp/once") == b"changed\n"
    # The same key with other bytes (same length, so the hash decides) or another path.
    other = put_file(api, sid, "/tmp/once", b"other\n" + body[6:], k)
    assert other.status_code == 409, (other.status_code, other.body)
    check_error_body(other, other.body, "idempotency_key_reused")
    elsewhere = put_file(api, sid, "/tmp/elsewhere", body, k)
    assert elsewhere.status_code == 409, (elsewhere.status_code, elsewhere.body)
    assert read_file(api, sid, "/tmp/once") == b"changed\n"
    # A body sent chunked hashes as the same bytes with a Content-Length.
    chunked = put_file(api, sid, "/tmp/once", iter([body[:1000], body[1000:]]), k, expect=200)
    assert chunked.headers.get("Idempotent-Replayed") == "true"
    # Without a key every upload runs.
    put_file(api, sid, "/tmp/once", body, None, expect=200)
    assert read_file(api, sid, "/tmp/once") == body


def test_concurrent_duplicate_uploads_run_once(api, sandbox):
    sid, k = sandbox["id"], key()
    piece = b"0123456789abcdef" * 4096  # 64 KiB

    def slow_body():
        # Chunked, and slow enough that the duplicates arrive while the first still streams.
        for _ in range(16):
            time.sleep(0.05)
            yield piece

    barrier = threading.Barrier(5)

    def one(_):
        c = api.clone()
        try:
            barrier.wait(10)
            return put_file(c, sid, "/tmp/concurrent", slow_body(), k, expect=200, timeout=90)
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(one, range(5)))
    ran = [a for a in answers if a.headers.get("Idempotent-Replayed") != "true"]
    assert len(ran) == 1, [dict(a.headers) for a in answers]
    assert all(a.body == ran[0].body for a in answers), [a.body for a in answers]
    assert read_file(api, sid, "/tmp/concurrent") == piece * 16


def test_an_upload_broken_off_gives_its_key_back(api, sandbox, sbxd):
    """A client gone mid-body leaves no claim behind: the retry runs now, and does not wait
    for the claim to be abandoned."""
    sid, k = sandbox["id"], key()
    host, port = sbxd.url.removeprefix("http://").split(":")
    body = b"x" * (1 << 20)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall((f"PUT /v1/sandboxes/{sid}/files?path=/tmp/broken HTTP/1.1\r\n"
                   f"Host: {host}\r\nAuthorization: Bearer {sbxd.token}\r\n"
                   f"Idempotency-Key: {k}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                  + body[:1000])
        time.sleep(0.3)  # the claim is made and the handler reads
    started = time.monotonic()
    retry = put_file(api, sid, "/tmp/broken", body, k, expect=200)
    assert retry.headers.get("Idempotent-Replayed") is None
    assert time.monotonic() - started < 30
    assert read_file(api, sid, "/tmp/broken") == body
    # Refused before its body was read (no such sandbox): not kept, a retry runs again.
    k2 = key()
    gone = "sbx_" + "a" * 20
    for _ in range(2):
        r = put_file(api, gone, "/tmp/x", b"abc", k2)
        assert r.status_code == 404 and r.headers.get("Idempotent-Replayed") is None, r.status_code


@ns_runtime_only("templates are imported by the ns runtime's image store")
def test_an_import_with_a_key_is_one_operation(api):
    work = Path(tempfile.mkdtemp(prefix="sbx-e2e-idem-"))
    try:
        layout = work / "layout"
        images.write_layout(layout, [images.busybox_layer().bytes()])
        archive = images.docker_archive(layout, work / "img.tar").read_bytes()
        k = key()
        params = {"name": "idem-import", "tag": "v1"}
        headers = {"Idempotency-Key": k, "Content-Type": "application/x-tar"}
        first = api.call("POST", "/v1/templates:import", params=params, data=archive,
                         headers=headers, expect=202)
        op = api.wait_operation(first.body["operation"]["id"])
        assert op["state"] == "succeeded", op
        again = api.call("POST", "/v1/templates:import", params=params, data=archive,
                         headers=headers, expect=202)
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert again.body["operation"]["id"] == first.body["operation"]["id"]
        other = api.call("POST", "/v1/templates:import", params=params, data=archive + b"\0" * 512,
                         headers=headers, expect=409)
        check_error_body(other, other.body, "idempotency_key_reused")
        api.call("DELETE", "/v1/templates/idem-import:v1", expect=200)
    finally:
        shutil.rmtree(work, ignore_errors=True)

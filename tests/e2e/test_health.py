"""Health endpoints and request ids."""

import re



def test_healthz(api):
    resp = api.call("GET", "/healthz", token=None, expect=200)
    assert resp.body == {"status": "ok"}


def test_readyz(api):
    resp = api.call("GET", "/readyz", token=None, expect=200)
    assert resp.body == {"status": "ready"}


def test_request_id_generated_and_unique(api):
    ids = {api.call("GET", "/healthz", token=None, expect=200).headers["X-Request-Id"] for _ in range(5)}
    assert len(ids) == 5, f"X-Request-Id must be unique per request: {ids}"
    for rid in ids:
        assert re.fullmatch(r"[\x21-\x7e]{1,128}", rid), rid


def test_request_id_echoed(api):
    rid = "e2e-req-1234_abc"
    for method, path, token in (("GET", "/healthz", None), ("GET", "/v1/sandboxes", "wrong-token"),
                                ("GET", "/v1/sandboxes", api.token)):
        resp = api.call(method, path, token=token, headers={"X-Request-Id": rid})
        assert resp.headers["X-Request-Id"] == rid, f"{method} {path}: client X-Request-Id not echoed"


def test_bad_request_id_replaced(api):
    for bad in ("x" * 129, "has space"):
        resp = api.call("GET", "/healthz", token=None, headers={"X-Request-Id": bad}, expect=200)
        assert resp.headers["X-Request-Id"] != bad, f"invalid X-Request-Id {bad!r} must not be echoed"


def test_request_id_on_errors_and_unknown_routes(api):
    # call() asserts X-Request-Id on every response and request_id == header in error bodies.
    resp = api.call("GET", "/v1/sandboxes", token=None, expect=401)
    assert resp.body["error"]["code"] == "unauthenticated"
    r = api.session.get(api.base_url + "/v1/no-such-route", headers={"Authorization": f"Bearer {api.token}"},
                        timeout=10)
    assert r.status_code == 404 and r.headers.get("X-Request-Id")
    assert r.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["request_id"] == r.headers["X-Request-Id"]

"""Bad requests are rejected with the documented status, code and field, and leave nothing behind."""

import json
import secrets
import subprocess

import pytest
import requests

from sbx_client import check_error_body

ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def fake_id(prefix: str) -> str:
    """Well-formed but unknown id."""
    return prefix + "_" + "".join(secrets.choice(ALPHABET) for _ in range(20))


def validate_as_error(api, resp):
    """Responses to undocumented routes/methods still use the documented error schema."""
    check_error_body(resp, resp.json())
    _, documented = api.validator.find_response("GET", "/v1/sandboxes", 401)
    schema = documented["content"]["application/json"]["schema"]
    api.validator.validate_schema(schema, resp.json(), f"{resp.request.method} {resp.request.path_url}")


def all_sandbox_ids(api) -> set:
    return {s["id"] for s in api.list_sandboxes()} | {s["id"] for s in api.list_sandboxes(state="deleted")}


@pytest.fixture
def nothing_created(api):
    """Fails the test if it left any new sandbox (in any state) or the daemon unhealthy."""
    before = all_sandbox_ids(api)
    yield
    api.call("GET", "/healthz", token=None, expect=200)
    new = all_sandbox_ids(api) - before
    leftovers = [api.get_sandbox(i) for i in new]
    api.created_sandboxes.extend(new)
    assert not new, f"rejected requests left sandboxes behind: {[(s['id'], s['state']) for s in leftovers]}"


CREATE_CASES = [
    # (name, body bytes or object, status, code, field)
    ("malformed_json", b'{"template": ', 400, "invalid_argument", None),
    ("not_an_object", b"[1, 2]", 400, "invalid_argument", None),
    ("trailing_garbage", b"{} x", 400, "invalid_argument", None),
    ("unknown_field", {"bogus": 1}, 400, "invalid_argument", "bogus"),
    ("unknown_nested_field", {"resources": {"gpu": 1}}, 400, "invalid_argument", "resources.gpu"),
    ("template_wrong_type", {"template": 5}, 400, "invalid_argument", "template"),
    ("vcpu_string", {"resources": {"vcpu": "2"}}, 400, "invalid_argument", "resources.vcpu"),
    ("vcpu_float", {"resources": {"vcpu": 1.5}}, 400, "invalid_argument", "resources.vcpu"),
    ("vcpu_bool", {"resources": {"vcpu": True}}, 400, "invalid_argument", "resources.vcpu"),
    ("resources_not_object", {"resources": [1]}, 400, "invalid_argument", "resources"),
    ("env_not_object", {"env": ["A=1"]}, 400, "invalid_argument", "env"),
    ("env_value_not_string", {"env": {"A": 1}}, 400, "invalid_argument", "env*"),
    ("env_bad_key", {"env": {"1BAD": "x"}}, 400, "invalid_argument", "env*"),
    ("labels_bad_key", {"labels": {"bad key!": "x"}}, 400, "invalid_argument", "labels*"),
    ("labels_value_too_long", {"labels": {"k": "v" * 256}}, 400, "invalid_argument", "labels*"),
    ("vcpu_zero", {"resources": {"vcpu": 0}}, 400, "invalid_argument", "resources.vcpu"),
    ("vcpu_too_many", {"resources": {"vcpu": 65}}, 400, "invalid_argument", "resources.vcpu"),
    ("memory_absurd", {"resources": {"memory_mib": 10 ** 9}}, 400, "invalid_argument", "resources.memory_mib"),
    ("memory_huge_int", {"resources": {"memory_mib": 10 ** 30}}, 400, "invalid_argument", "resources.memory_mib"),
    ("memory_negative", {"resources": {"memory_mib": -512}}, 400, "invalid_argument", "resources.memory_mib"),
    ("memory_too_small", {"resources": {"memory_mib": 31}}, 400, "invalid_argument", "resources.memory_mib"),
    ("disk_negative", {"resources": {"disk_mib": -1}}, 400, "invalid_argument", "resources.disk_mib"),
    # Integers only (docs/api.md): whole floats and exponents are refused too.
    ("memory_float", {"resources": {"memory_mib": 256.5}}, 400, "invalid_argument", "resources.memory_mib"),
    ("memory_whole_float", b'{"resources": {"memory_mib": 256.0}}', 400, "invalid_argument", "resources.memory_mib"),
    ("disk_exponent", b'{"resources": {"disk_mib": 1e3}}', 400, "invalid_argument", "resources.disk_mib"),
    ("vcpu_whole_float", b'{"resources": {"vcpu": 2.0}}', 400, "invalid_argument", "resources.vcpu"),
    ("memory_1e300", b'{"resources": {"memory_mib": 1e300}}', 400, "invalid_argument", "resources.memory_mib"),
    ("memory_2pow63", {"resources": {"memory_mib": 2 ** 63}}, 400, "invalid_argument", "resources.memory_mib"),
    ("disk_2pow64", {"resources": {"disk_mib": 2 ** 64}}, 400, "invalid_argument", "resources.disk_mib"),
    ("vcpu_min_int64", {"resources": {"vcpu": -(2 ** 63)}}, 400, "invalid_argument", "resources.vcpu"),
    ("memory_string", {"resources": {"memory_mib": "512"}}, 400, "invalid_argument", "resources.memory_mib"),
    ("disk_string", {"resources": {"disk_mib": "1G"}}, 400, "invalid_argument", "resources.disk_mib"),
    ("memory_bool", {"resources": {"memory_mib": False}}, 400, "invalid_argument", "resources.memory_mib"),
    ("disk_bool", {"resources": {"disk_mib": True}}, 400, "invalid_argument", "resources.disk_mib"),
    ("memory_zero", {"resources": {"memory_mib": 0}}, 400, "invalid_argument", "resources.memory_mib"),
    ("disk_zero", {"resources": {"disk_mib": 0}}, 400, "invalid_argument", "resources.disk_mib"),
    ("vcpu_negative", {"resources": {"vcpu": -1}}, 400, "invalid_argument", "resources.vcpu"),
    ("disk_too_large", {"resources": {"disk_mib": 1048577}}, 400, "invalid_argument", "resources.disk_mib"),
    ("memory_nested_object", {"resources": {"memory_mib": {"value": 512}}}, 400, "invalid_argument",
     "resources.memory_mib"),
    ("vcpu_array", {"resources": {"vcpu": [2]}}, 400, "invalid_argument", "resources.vcpu"),
    # Deployment settings, not requestable (DESIGN.md §3).
    ("pids_not_requestable", {"resources": {"pids": 64}}, 400, "invalid_argument", "resources.pids"),
    ("open_files_not_requestable", {"resources": {"open_files": 64}}, 400, "invalid_argument",
     "resources.open_files"),
    ("tmp_not_requestable", {"resources": {"tmp_mib": 64}}, 400, "invalid_argument", "resources.tmp_mib"),
    ("shm_not_requestable", {"resources": {"shm_mib": 64}}, 400, "invalid_argument", "resources.shm_mib"),
    ("output_buffer_not_requestable", {"resources": {"output_buffer_bytes": 1}}, 400, "invalid_argument",
     "resources.output_buffer_bytes"),
    ("unknown_template", {"template": "no-such-template"}, 422, "template_not_found", "template"),
    ("unknown_template_tag", {"template": "base:no-such-tag"}, 422, "template_not_found", "template"),
    # A name that is no runtime of sbx's is the client's error; one sbx has that this sbxd
    # does not run (the e2e sbxd runs ns and microvm, not fake) is the host's lack.
    ("unknown_runtime", {"runtime": "firecracker"}, 400, "invalid_argument", "runtime"),
    ("unknown_runtime_unicode", {"runtime": "O\u00bfc\u205a"}, 400, "invalid_argument", "runtime"),
    ("runtime_not_on_this_host", {"runtime": "fake"}, 501, "not_implemented", "runtime"),
    ("ttl_zero", {"timeout_s": 0}, 400, "invalid_argument", "timeout_s"),
    ("ttl_over_30_days", {"timeout_s": 30 * 86400 + 1}, 400, "invalid_argument", "timeout_s"),
    ("ttl_string", {"timeout_s": "60"}, 400, "invalid_argument", "timeout_s"),
    ("idle_suspend_negative", {"idle_suspend_s": -1}, 400, "invalid_argument", "idle_suspend_s"),
]


@pytest.mark.parametrize("name,body,status,code,field", CREATE_CASES, ids=[c[0] for c in CREATE_CASES])
def test_create_rejects(api, nothing_created, name, body, status, code, field):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = api.call("POST", "/v1/sandboxes", data=data, headers={"Content-Type": "application/json"})
    assert resp.status_code == status, f"{name}: expected {status}, got {resp.status_code}: {resp.body}"
    check_error_body(resp, resp.body, code, field)


SESSION_CASES = [
    ("malformed_json", b'{"argv": [', "argv"),
    ("missing_argv", {}, "argv"),
    ("empty_argv", {"argv": []}, "argv"),
    ("argv_string", {"argv": "echo hi"}, "argv"),
    ("argv_non_string", {"argv": ["echo", 5]}, "argv*"),
    ("argv_null_element", {"argv": ["echo", None]}, "argv*"),
    ("argv_empty_program", {"argv": [""]}, "argv*"),
    ("unknown_field", {"argv": ["true"], "shell": True}, "shell"),
    ("relative_cwd", {"argv": ["true"], "cwd": "tmp"}, "cwd"),
    ("env_not_object", {"argv": ["true"], "env": "A=1"}, "env"),
    ("tty_wrong_type", {"argv": ["true"], "tty": "yes"}, "tty"),
]


@pytest.mark.parametrize("name,body,field", SESSION_CASES, ids=[c[0] for c in SESSION_CASES])
def test_session_create_rejects(api, sandbox, name, body, field):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", data=data,
                    headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, f"{name}: expected 400, got {resp.status_code}: {resp.body}"
    check_error_body(resp, resp.body, "invalid_argument", None if name == "malformed_json" else field)


INTERACTIVE_CASES = [
    ("timeout_zero", {"timeout_s": 0}, "timeout_s"),
    ("timeout_negative", {"timeout_s": -5}, "timeout_s"),
    ("timeout_over_30_days", {"timeout_s": 30 * 86400 + 1}, "timeout_s"),
    ("timeout_string", {"timeout_s": "5"}, "timeout_s"),
    ("timeout_float", {"timeout_s": 1.5}, "timeout_s"),
    ("grace_without_timeout", {"kill_grace_s": 1}, "kill_grace_s"),
    ("grace_over_limit", {"timeout_s": 5, "kill_grace_s": 301}, "kill_grace_s"),
    ("stdin_wrong_type", {"stdin": "yes"}, "stdin"),
    ("tty_rows_zero", {"tty": {"rows": 0, "cols": 80}}, "tty.rows"),
    ("tty_unknown_key", {"tty": {"rows": 24, "width": 80}}, "tty.width"),
]


@pytest.mark.parametrize("name,fields,field", INTERACTIVE_CASES, ids=[c[0] for c in INTERACTIVE_CASES])
def test_session_interactive_fields_rejected(api, sandbox, name, fields, field):
    resp = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", json_body={"argv": ["true"], **fields})
    assert resp.status_code == 400, f"{fields}: expected 400, got {resp.status_code}: {resp.body}"
    check_error_body(resp, resp.body, "invalid_argument", field)


@pytest.mark.parametrize("fields", [{"tty": True}, {"tty": {"rows": 10, "cols": 40}}, {"stdin": True},
                                    {"timeout_s": 5}, {"timeout_s": 5, "kill_grace_s": 0}],
                         ids=["tty", "tty_size", "stdin", "timeout_s", "kill_grace_s"])
def test_session_interactive_fields_accepted(api, sandbox, fields):
    resp = api.call("POST", f"/v1/sandboxes/{sandbox['id']}/sessions", json_body={"argv": ["true"], **fields})
    assert resp.status_code == 201, f"{fields}: expected 201, got {resp.status_code}: {resp.body}"


def test_unknown_ids_are_404(api):
    sbx, op, ses = fake_id("sbx"), fake_id("op"), fake_id("ses")
    cases = [
        ("GET", f"/v1/sandboxes/{sbx}", None),
        ("DELETE", f"/v1/sandboxes/{sbx}", None),
        ("POST", f"/v1/sandboxes/{sbx}/sessions", {"argv": ["true"]}),
        ("GET", f"/v1/operations/{op}", None),
        ("GET", f"/v1/sessions/{ses}", None),
        ("GET", f"/v1/sessions/{ses}/attach", None),
    ]
    failures = []
    for method, path, body in cases:
        kwargs = {"json_body": body} if body is not None else {}
        resp = api.call(method, path, **kwargs)
        try:
            assert resp.status_code == 404, f"{method} {path}: expected 404, got {resp.status_code}: {resp.body}"
            check_error_body(resp, resp.body, "not_found")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_malformed_ids_are_400(api):
    cases = [
        ("GET", "/v1/sandboxes/not-an-id"),
        ("GET", f"/v1/sandboxes/{fake_id('op')}"),  # wrong prefix
        ("GET", "/v1/sandboxes/sbx_" + "A" * 20),
        ("GET", "/v1/sessions/ses_" + "x" * 300),
        ("GET", "/v1/operations/op_..%2F..%2Fetc"),  # decoded, it may not match a route: 404 is fine
    ]
    failures = []
    for method, path in cases:
        resp = api.call(method, path, validate="%2F" not in path)
        try:
            if "%2F" in path and resp.status_code == 404:
                check_error_body(resp, resp.body, "not_found")
                continue
            assert resp.status_code == 400, f"{method} {path}: expected 400, got {resp.status_code}: {resp.body}"
            check_error_body(resp, resp.body, "invalid_argument")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_missing_or_wrong_token_is_401(api, sandbox, nothing_created):
    session = api.create_session(sandbox["id"], ["echo", "x"])
    sbx = sandbox["id"]
    routes = [
        ("GET", "/v1/sandboxes", None),
        ("POST", "/v1/sandboxes", {}),
        ("GET", f"/v1/sandboxes/{sbx}", None),
        ("DELETE", f"/v1/sandboxes/{sbx}", None),
        ("POST", f"/v1/sandboxes/{sbx}/sessions", {"argv": ["true"]}),
        ("GET", f"/v1/operations/{fake_id('op')}", None),
        ("GET", f"/v1/sessions/{session['session_id']}", None),
        ("GET", f"/v1/sessions/{session['session_id']}/attach", None),
        ("GET", f"/v1/sandboxes/{fake_id('sbx')}", None),  # auth is checked before lookup
    ]
    bad_auth = [
        ("no header", None, None),
        ("wrong token", "wrong-" + api.token, None),
        ("empty bearer", "", None),
        ("basic scheme", None, {"Authorization": f"Basic {api.token}"}),
        ("token without scheme", None, {"Authorization": api.token}),
    ]
    failures = []
    for method, path, body in routes:
        for label, tok, headers in bad_auth:
            kwargs = {"json_body": body} if body is not None else {}
            resp = api.call(method, path, token=tok, headers=headers, **kwargs)
            try:
                assert resp.status_code == 401, f"{method} {path} ({label}): expected 401, got {resp.status_code}"
                check_error_body(resp, resp.body, "unauthenticated")
                assert api.token not in resp.text, "an error body echoes the token"
            except AssertionError as e:
                failures.append(str(e))
    assert api.get_sandbox(sbx)["state"] == "running", "an unauthenticated DELETE had an effect"
    assert api.get_session(session["session_id"])["state"] == "created", "an unauthenticated attach started it"
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def _post_oversized(api, data) -> None:
    """POSTs an oversized body on its own connection, expects 413, then checks that the
    connection is either still usable or was announced as closing (Connection: close)."""
    client = api.clone()
    try:
        try:
            resp = client.call("POST", "/v1/sandboxes", data=data, headers={"Content-Type": "application/json"})
        except requests.exceptions.ConnectionError as e:
            pytest.fail("sbxd closed the connection while the client was still sending the body, so no "
                        f"413 could be read ({e}); a server rejecting a body early should drain it or "
                        "close lingeringly (RFC 9112 section 9.6)")
        assert resp.status_code == 413, f"expected 413, got {resp.status_code}: {resp.body}"
        check_error_body(resp, resp.body, "payload_too_large")
        try:
            client.call("GET", "/healthz", token=None, expect=200)
        except requests.exceptions.ConnectionError as e:
            pytest.fail("after the 413 sbxd closed the connection without sending `Connection: close`, "
                        f"so a client reusing it fails ({e}); headers were {dict(resp.headers)}")
    finally:
        client.close()


def test_body_over_1mib_is_413(api, nothing_created):
    big = json.dumps({"labels": {"k": "v" * (1024 * 1024)}}).encode()
    assert len(big) > 1024 * 1024
    _post_oversized(api, big)


def test_chunked_body_over_1mib_is_413(api, nothing_created):
    def chunks():
        yield b'{"labels": {"k": "'
        for _ in range(20):
            yield b"v" * 65536
        yield b'"}}'
    _post_oversized(api, chunks())


def test_chunked_body_accepted(api):
    def chunks():
        yield b'{"labels": '
        yield b'{"e2e": "chunked"}}'
    resp = api.call("POST", "/v1/sandboxes", data=chunks(), headers={"Content-Type": "application/json"},
                    expect=202)
    api.created_sandboxes.append(resp.body["sandbox"]["id"])
    assert resp.body["sandbox"]["labels"] == {"e2e": "chunked"}


def test_wrong_method_is_405(api, sandbox, nothing_created):
    sbx = sandbox["id"]
    ses = fake_id("ses")
    # Every 405 names what the route serves in Allow (RFC 9110): the route table's, and those
    # the handlers that serve several methods answer themselves (files, a session's I/O, ws,
    # processes, a port's relay).
    cases = [
        ("PUT", "/v1/sandboxes", "POST, GET"),
        ("PATCH", f"/v1/sandboxes/{sbx}", "GET, DELETE"),
        ("PUT", f"/v1/sandboxes/{sbx}", "GET, DELETE"),
        ("GET", f"/v1/sandboxes/{sbx}/sessions", "POST"),
        # DELETE cancels a template operation (docs/templates.md): PUT is still no method.
        ("PUT", f"/v1/operations/{fake_id('op')}", "GET, DELETE"),
        ("PUT", "/v1/templates", "POST, GET"),
        ("PATCH", "/v1/templates/x", "GET, DELETE, PUT"),
        ("GET", "/v1/templates:import", "POST"),
        ("POST", f"/v1/sessions/{ses}", "GET"),
        ("POST", "/healthz", "GET, HEAD"),
        ("TRACE", f"/v1/sandboxes/{sbx}", "GET, DELETE"),
        ("POST", f"/v1/sandboxes/{sbx}/files?path=/tmp/x", "GET, PUT, DELETE"),
        ("GET", f"/v1/sandboxes/{sbx}/files:mkdir", "POST"),
        ("POST", f"/v1/sandboxes/{sbx}/files:stat?path=/tmp", "GET"),
        ("GET", f"/v1/sessions/{ses}/stdin", "POST"),
        ("POST", f"/v1/sessions/{ses}/ws", "GET"),
        ("POST", f"/v1/sandboxes/{sbx}/processes", "GET"),
        ("TRACE", f"/v1/sandboxes/{sbx}/ports/8080/x", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
    ]
    failures = []
    for method, path, allow in cases:
        kwargs = {"json_body": {}} if method in ("POST", "PUT", "PATCH") else {}
        resp = api.call(method, path, validate=False, **kwargs)
        try:
            assert resp.status_code == 405, f"{method} {path}: expected 405, got {resp.status_code}"
            assert resp.headers.get("Allow") == allow, f"{method} {path}: Allow {resp.headers.get('Allow')!r}, expected {allow!r}"
            check_error_body(resp, resp.body, "method_not_allowed")
            validate_as_error(api, resp)
        except AssertionError as e:
            failures.append(str(e))
    assert api.get_sandbox(sbx)["state"] == "running"
    assert not failures, "\n".join(failures)


def test_unknown_route_is_404(api):
    # /sandboxes and /v2/sandboxes are the E2B API's (docs/e2b.md, test_e2b_api.py).
    for path in ("/v1/nope", "/v2/nope", "/v3/sandboxes", "/", "/v1/sandboxes/x/y/z"):
        resp = api.call("GET", path, validate=False)
        assert resp.status_code == 404, f"GET {path}: expected 404, got {resp.status_code}"
        check_error_body(resp, resp.body, "not_found")
        validate_as_error(api, resp)


def test_limit_out_of_range(api):
    for limit in ("0", "501", "abc", "-1"):
        resp = api.call("GET", "/v1/sandboxes", params={"limit": limit})
        assert resp.status_code == 400, f"limit={limit}: expected 400, got {resp.status_code}"
        check_error_body(resp, resp.body, "invalid_argument")


@pytest.mark.parametrize("flag,value,words", [
    ("--default-pids", "0", "between 16 and 4194304"),
    ("--default-pids", "10", "between 16 and 4194304"),
    ("--default-open-files", "3", "between 64 and 1048576"),
    ("--default-open-files", "2000000", "between 64 and 1048576"),
    ("--tmp-mib", "0", "between 1 and 1048576"),
    ("--shm-mib", "-1", "between 1 and 1048576"),
    ("--tmp-mib", "lots", "--tmp-mib"),
])
def test_sbxd_rejects_bad_limit_flags_before_touching_the_host(tmp_path, flag, value, words):
    """A bad deployment limit stops sbxd at start-up with a message naming the flag, before the
    state directory or the runtime is touched."""
    from conftest import build_dir
    state = tmp_path / "state"
    proc = subprocess.run([str(build_dir() / "bin" / "sbxd"), "--listen", "127.0.0.1:0", "--state-dir", str(state),
                           "--admin-token", "x" * 32, "--runtime", "fake", flag, value],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, f"{flag} {value} was accepted: {proc.stdout}{proc.stderr}"
    out = proc.stdout + proc.stderr
    assert flag in out and words in out, out
    assert not state.exists(), "the state directory was created before the flags were checked"

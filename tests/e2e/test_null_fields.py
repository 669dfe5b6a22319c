"""The contract's convention, checked against sbxd: "a `null` value for an optional field means the
same as leaving the field out". Clients that serialize their unset fields (pydantic, serde's
Option, a TypeScript `undefined` turned null) send `"field": null`; sbxd once refused that with a
400 naming the field, in tenants, tokens, a session's tty size and stdin.

The fields come from docs/api/openapi.yaml itself: every optional property of every JSON request
body, nested ones included (an object's properties, an array's first item when the base body has
one). For each, the same request is sent twice, once without the field and once with it null,
each with a fresh base body (fresh names, a fresh file to move); both answers must agree in status,
error code and the field an error names. An operation added to the contract must get a base body
here (or a reason in SKIPPED): test_every_operation_with_optional_fields_has_a_case checks it.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import yaml

from conftest import REPO, Daemon, shutdown
from sbx_client import SbxClient

SPEC = REPO / "docs/api/openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch")

# Operations with optional fields that need no case: why.
SKIPPED: dict[str, str] = {}


def load_spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def optional_paths(d: dict, schema: dict, base: dict) -> list[tuple]:
    """Paths (tuples of keys, 0 for an array's first item) of the optional properties under
    `schema`, nested ones included; an array is entered only where `base` has a first item."""
    schemas = d["components"]["schemas"]

    def resolve(s):
        while isinstance(s, dict) and "$ref" in s:
            s = schemas[s["$ref"].rsplit("/", 1)[-1]]
        return s if isinstance(s, dict) else {}

    out: list[tuple] = []

    def walk(node, path: tuple, sample: Any, depth: int) -> None:
        s = resolve(node)
        if depth > 6:
            return
        for combinator in ("allOf", "oneOf", "anyOf"):  # tty: a boolean or {rows, cols}
            for sub in s.get(combinator, []):
                walk(sub, path, sample, depth + 1)
        required = set(s.get("required") or [])
        for name, prop in (s.get("properties") or {}).items():
            if name not in required:
                out.append(path + (name,))
            inner = sample.get(name) if isinstance(sample, dict) else None
            walk(prop, path + (name,), inner if inner is not None else {}, depth + 1)
        if "items" in s and isinstance(sample, list) and sample:
            walk(s["items"], path + (0,), sample[0], depth + 1)

    walk(schema, (), base, 0)
    return sorted(set(out), key=str)


def request_schemas(d: dict):
    """operationId -> (METHOD, path, JSON request schema) for each operation with one."""
    found = {}
    for path, item in d["paths"].items():
        for method, op in item.items():
            if method not in METHODS:
                continue
            for ctype, media in ((op.get("requestBody") or {}).get("content") or {}).items():
                if "json" in ctype and "schema" in media:
                    found[op["operationId"]] = (method.upper(), path, media["schema"])
    return found


def with_parents(body: dict, path: tuple) -> dict | None:
    """A copy of `body` where the parents of `path` exist (objects made as needed); None when an
    array on the way has no item to enter."""
    out = copy.deepcopy(body)
    node: Any = out
    for key in path[:-1]:
        if isinstance(key, int):
            if not isinstance(node, list) or not node:
                return None
            node = node[0]
        else:
            if not isinstance(node.get(key), (dict, list)):
                node[key] = {}
            node = node[key]
    if not isinstance(node, dict):
        return None
    node.pop(path[-1], None)
    return out


def set_null(body: dict, path: tuple) -> dict:
    out = copy.deepcopy(body)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = None
    return out


def dotted(path: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else (f".{k}" if i else k)
                   for i, k in enumerate(path))


def verdict(resp) -> tuple:
    err = resp.body.get("error") if isinstance(resp.body, dict) else None
    if isinstance(err, dict):
        return resp.status_code, err.get("code"), (err.get("details") or {}).get("field")
    return resp.status_code, None, None


@pytest.fixture(scope="module")
def lab(validator):
    """An sbxd of this module's own: the cases make tenants, tokens and many sessions."""
    daemon = Daemon(["--warm-pool", "base=0"])
    client = None
    problems: list[str] = []
    try:
        daemon.start()
        client = SbxClient(daemon.url, daemon.token, validator)
        yield client
    finally:
        ids = []
        if client is not None:
            try:
                ids = [s["id"] for s in client.list_sandboxes()]
            finally:
                client.close()
        problems = [p for p in shutdown(daemon, validator, ids) if "was left by a test" not in p]
    assert not problems, "stopping the test's sbxd: " + "; ".join(problems)


@pytest.fixture(scope="module")
def cases(lab):
    """operationId -> (base(path) -> a fresh body for testing `path` (None: no base suits it),
    tidy(resp) -> undoes what a successful request made, the request's path)."""
    api = lab
    n = itertools.count()
    sid = api.create_sandbox({"labels": {"e2e": "null-fields"}})["sandbox"]["id"]
    sandboxes = f"/v1/sandboxes/{sid}"
    reader = api.create_session(sid, ["cat"], stdin=True)
    stream = api.attach(reader)  # starts it; stdin is taken from then on
    tenant = api.call("POST", "/v1/admin/tenants", json_body={"name": "nulls"}, expect=201).body
    tenant_id = tenant.get("tenant", tenant)["id"]

    def nothing(resp) -> None:
        return None

    def delete_sandbox(resp) -> None:
        if resp.status_code in (200, 201, 202) and isinstance(resp.body, dict):
            made = (resp.body.get("sandbox") or {}).get("id") or \
                (resp.body.get("operation") or {}).get("sandbox_id")
            if made and made != sid:
                api.delete_sandbox(made)

    def delete_tenant(resp) -> None:
        if resp.status_code == 201:
            made = resp.body.get("tenant", resp.body)["id"]
            api.call("DELETE", f"/v1/admin/tenants/{made}", expect=(200, 202, 204))

    def fresh_file(path: tuple) -> dict:
        name = f"/tmp/move-{next(n)}"
        api.call("PUT", f"{sandboxes}/files", params={"path": name}, data=b"x",
                 headers={"Content-Type": "application/octet-stream"}, expect=200)
        return {"from": name, "to": name + ".moved"}

    def pull_body(path: tuple) -> dict:
        """A pull from a registry nobody serves on loopback (started, then failed), or under
        source.build a build FROM it; `start` with its required cmd under start."""
        body: dict = {"name": f"nulls-{next(n)}", "source": {"image": "127.0.0.1:9/x:y"}}
        if path[:2] == ("source", "build") or path == ("source", "image"):
            body["source"] = {"build": {"dockerfile": "FROM 127.0.0.1:9/x:y\n"}}
        if path == ("source", "build"):
            body["source"] = {"image": "127.0.0.1:9/x:y"}
        if path[:1] == ("start",):
            body["start"] = {"cmd": True}
        return body

    table = {
        "createSandbox": (lambda p: {"labels": {"e2e": "null-fields"}}, delete_sandbox),
        "createSession": (lambda p: {"argv": ["true"]}, nothing),
        "makeDirectory": (lambda p: {"path": f"/tmp/dir-{next(n)}"}, nothing),
        "moveFile": (fresh_file, nothing),
        # Exactly one of data and data_b64: the base gives the other one.
        "writeSessionStdin": (lambda p: {"data_b64": "eA=="} if p == ("data",) else {"data": "x"},
                              nothing),
        "createTenant": (lambda p: {"name": f"nulls {next(n)}"}, delete_tenant),
        "updateTenant": (lambda p: {}, nothing),
        "createToken": (lambda p: {"name": f"t{next(n)}", "scopes": ["read"]}, nothing),
        "pullTemplate": (pull_body, nothing),
    }
    paths = {
        "createSandbox": "/v1/sandboxes",
        "createSession": f"{sandboxes}/sessions",
        "makeDirectory": f"{sandboxes}/files:mkdir",
        "moveFile": f"{sandboxes}/files:move",
        "writeSessionStdin": f"/v1/sessions/{reader['session_id']}/stdin",
        "createTenant": "/v1/admin/tenants",
        "updateTenant": f"/v1/admin/tenants/{tenant_id}",
        "createToken": f"/v1/admin/tenants/{tenant_id}/tokens",
        "pullTemplate": "/v1/templates",
    }
    yield {op: (base, tidy, paths[op]) for op, (base, tidy) in table.items()}
    stream.close()


def test_every_operation_with_optional_fields_has_a_case(cases):
    d = load_spec()
    with_optional = {op for op, (_, _, schema) in request_schemas(d).items()
                     if optional_paths(d, schema, {})}
    missing = with_optional - set(cases) - set(SKIPPED)
    assert not missing, f"operations with optional request fields but no case here: {sorted(missing)}"


def test_null_means_left_out_in_every_optional_request_field(lab, cases):
    d = load_spec()
    schemas = request_schemas(d)
    differ: list[str] = []
    checked = 0
    for op, (base, tidy, url) in cases.items():
        method, _, schema = schemas[op]
        for path in optional_paths(d, schema, base(())):
            start = base(path)
            omitted = with_parents(start, path) if start is not None else None
            if omitted is None:
                continue
            nulled = set_null(with_parents(base(path), path), path)
            answers = []
            for body in (omitted, nulled):
                resp = lab.call(method, url, json_body=body)
                assert resp.status_code < 500, f"{op} {body}: {resp.status_code} {resp.body}"
                answers.append(verdict(resp))
                tidy(resp)
            checked += 1
            if answers[0] != answers[1]:
                differ.append(f"{op} {dotted(path)}: left out -> {answers[0]}, null -> {answers[1]}")
    assert checked >= 30, f"only {checked} optional fields were tried"
    assert not differ, "null is not answered as a left-out field:\n" + "\n".join(differ)

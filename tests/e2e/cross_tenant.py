"""The routes of docs/api/openapi.yaml that name an object (a sandbox, session, operation,
tenant or token), and a request to each that would be valid for the object's owner: what
tenant B sends with tenant A's ids. Both the e2e tenancy test and the escape suite's cross-tenant
attacks take their list from here, so a route added to the document is tried by both."""
from __future__ import annotations

import re
import time
from pathlib import Path

import yaml

SPEC = Path(__file__).resolve().parents[2] / "docs" / "api" / "openapi.yaml"
OBJECT_PARAMS = {"sandbox_id", "session_id", "operation_id", "tenant_id", "token_id"}

# operationId -> a body that would be valid for the caller's own object. A route whose body is
# required and is missing here fails the listing: add it.
BODIES = {
    "createSession": {"argv": ["true"]},
    "makeDirectory": {"path": "/tmp/d"},
    "moveFile": {"from": "/tmp/mine", "to": "/tmp/moved"},
    "writeSessionStdin": {"data": "x"},
    "signalSession": {"signal": "KILL"},
    "resizeSession": {"rows": 10, "cols": 10},
    "patchSandboxEgress": {"allow": []},
    "updateTenant": {"name": "taken"},
    "createToken": {"name": "stolen", "scopes": ["read"]},
    "pauseSandbox": {}, "suspendSandbox": {}, "wakeSandbox": {},
}


def _spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def routes() -> list[tuple[str, str]]:
    """(METHOD, path template) of every operation whose path names an object."""
    out = []
    for path, item in _spec()["paths"].items():
        if not set(re.findall(r"\{(\w+)\}", path)) & OBJECT_PARAMS:
            continue
        out += [(m.upper(), path) for m in item if m != "parameters"]
    return out


def request(method: str, path: str, ids: dict[str, str]) -> tuple[str, dict]:
    """The URL and the SbxClient.call keyword arguments of `method path` with `ids` filled in
    (sandbox_id, session_id, operation_id, tenant_id, token_id)."""
    spec = _spec()
    item = spec["paths"][path]
    op = item[method.lower()]
    url = path
    for name in re.findall(r"\{(\w+)\}", path):
        url = url.replace("{" + name + "}", {"port": "8080", "path": "x"}.get(name, ids.get(name, "")))
    params = {}
    for p in op.get("parameters", []) + item.get("parameters", []):
        if "$ref" in p:
            p = spec["components"]["parameters"][p["$ref"].split("/")[-1]]
        if p.get("in") == "query" and p.get("required"):
            params[p["name"]] = "/tmp/mine" if p["name"] == "path" else "x"
    kwargs: dict = {"params": params, "validate": False}
    rb = op.get("requestBody") or {}
    if op["operationId"] in BODIES:
        kwargs["json_body"] = BODIES[op["operationId"]]
    elif rb.get("required"):
        raise AssertionError(f"{method} {path}: add a body for {op['operationId']} to cross_tenant.BODIES")
    elif "application/octet-stream" in (rb.get("content") or {}):
        kwargs["data"] = b"theirs"
        kwargs["headers"] = {"Content-Type": "application/octet-stream"}
    if path.endswith("/ws"):
        kwargs["headers"] = {"Connection": "Upgrade", "Upgrade": "websocket",
                             "Sec-WebSocket-Version": "13",
                             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    return url, kwargs


def delete_tenants(admin, tenants: list[str], timeout: float = 60) -> None:
    """Deletes `tenants` through `admin` (which deletes their sandboxes and templates) and waits
    until each row has gone: the end of a tenancy test's tenants is its cleanup."""
    for t in tenants:
        r = admin.call("DELETE", f"/v1/admin/tenants/{t}", expect=(202, 404))
        for op in (r.body or {}).get("operations", []):
            admin.call("GET", f"/v1/operations/{op}", expect=(200, 404))
    deadline = time.monotonic() + timeout
    for t in tenants:
        while admin.call("GET", f"/v1/admin/tenants/{t}").status_code != 404:
            assert time.monotonic() < deadline, f"tenant {t} still there after {timeout} s"
            time.sleep(0.1)

"""Templates per tenant (docs/tenancy.md, "Templates"): the operator tenant's templates are the
shared catalogue every tenant sees; any other tenant's are its own, invisible to the others on
every route (list, get, create, tag, delete, build FROM, name@digest), within its quotas
max_templates and max_template_bytes, and gone with the tenant. One sbxd of its own."""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

import images
import tenancy_lab
from conftest import ns_runtime_only
from sbx_client import SbxClient

pytestmark = ns_runtime_only("image layers are overlay lowers of the ns runtime")

ALL_SCOPES = ["read", "sandboxes", "sessions", "files", "templates"]


def image(work: Path, marker: str) -> Path:
    """A docker archive of a busybox image whose /marker says `marker`."""
    layout = work / f"{marker}-layout"
    images.write_layout(layout, [images.busybox_layer().file("marker", marker + "\n").bytes()],
                        env=["PATH=/bin"])
    return images.docker_archive(layout, work / f"{marker}.tar")


class Lab(tenancy_lab.TenancyLab):
    def __init__(self, validator):
        super().__init__(validator)
        self.work = Path(tempfile.mkdtemp(prefix="sbx-e2e-tenant-templates-"))
        self.archives: dict[str, Path] = {}

    def tenant_client(self, name: str, **fields) -> tuple[str, SbxClient]:
        """A tenant and a client of a token with every scope but admin."""
        t = self.tenant(name, **fields)
        return t, self.client(self.token(t, ALL_SCOPES)["token"])

    def archive(self, marker: str) -> bytes:
        if marker not in self.archives:
            self.archives[marker] = image(self.work, marker)
        return self.archives[marker].read_bytes()

    def tags_in_store(self) -> list[str]:
        db = sqlite3.connect(f"file:{self.daemon.state_dir / 'sbx.db'}?mode=ro", uri=True)
        try:
            return [r[0] for r in db.execute("SELECT name || ':' || tag FROM template_tags")]
        finally:
            db.close()

    def close(self) -> list[str]:
        problems = super().close()
        shutil.rmtree(self.work, ignore_errors=True)
        return problems


@pytest.fixture(scope="module")
def lab(validator):
    lab = Lab(validator)
    try:
        yield lab
    finally:
        problems = lab.close()
        assert not problems, problems


def start_import(c: SbxClient, data: bytes, name: str, tag: str = "latest", expect=202):
    return c.call("POST", "/v1/templates:import", params={"name": name, "tag": tag}, data=data,
                  headers={"Content-Type": "application/x-tar"}, expect=expect)


def imported(c: SbxClient, data: bytes, name: str, tag: str = "latest") -> dict:
    op = start_import(c, data, name, tag).body["operation"]
    assert op["target"] == f"{name}:{tag}", op
    done = c.wait_operation(op["id"], timeout=120)
    assert done["state"] == "succeeded", done
    return done


def marker_of(c: SbxClient, template: str) -> str:
    sb = c.create_sandbox({"template": template})["sandbox"]
    r = c.run(sb["id"], ["cat", "/marker"])
    assert r.exit and r.exit.get("exit_code") == 0, (r.stdout, r.stderr, r.exit)
    c.delete_sandbox(sb["id"])
    return r.stdout.decode().strip()


def names(c: SbxClient) -> dict[str, list[bool]]:
    """name -> [shared, ...] of each entry of GET /v1/templates."""
    out: dict[str, list[bool]] = {}
    for t in c.call("GET", "/v1/templates", expect=200).body["templates"]:
        out.setdefault(t["name"], []).append(t["shared"])
    return out


def test_a_tenants_templates_are_its_own_on_every_route(lab):
    shared_op = imported(lab.admin, lab.archive("shared"), "common")
    a_ten, a = lab.tenant_client("tpl-a")
    b_ten, b = lab.tenant_client("tpl-b")
    done = imported(a, lab.archive("a-own"), "mine")
    digest = done["result"]["template"]["digest"]
    assert done["result"]["template"]["name"] == "mine", done

    # A sees its own and the shared ones; B and the operator see only the shared ones.
    assert names(a) == {"base": [True], "common": [True], "mine": [False]}
    assert names(b) == {"base": [True], "common": [True]}
    assert names(lab.admin) == {"base": [True], "common": [True]}
    assert "store_bytes" in lab.admin.call("GET", "/v1/templates", expect=200).body
    assert "store_bytes" not in a.call("GET", "/v1/templates", expect=200).body
    # Nothing a tenant is shown carries another tenant's id (nor its own qualifier).
    for c in (a, b):
        assert "ten_" not in json.dumps(c.call("GET", "/v1/templates", expect=200).body)

    assert marker_of(a, "mine") == "a-own"
    assert marker_of(a, f"mine@{digest}") == "a-own"
    assert marker_of(b, "common") == "shared"

    # B, on every route that could reach A's: not found, and the error lists none of A's names.
    assert b.call("GET", "/v1/templates/mine", expect=404).body["error"]["code"] == "not_found"
    for ref in ("mine", "mine:latest", f"mine@{digest}"):
        r = b.call("POST", "/v1/sandboxes", json_body={"template": ref}, expect=422)
        err = r.body["error"]
        assert err["code"] == "template_not_found", err
        assert "mine" not in err["message"].split("available:")[-1], err
    r = b.call("PUT", "/v1/templates/stolen:1", json_body={"from": f"mine@{digest}"}, expect=404)
    assert r.body["error"]["code"] == "not_found"
    b.call("PUT", "/v1/templates/stolen:1", json_body={"from": "mine"}, expect=404)
    b.call("DELETE", "/v1/templates/mine", expect=404)
    b.call("DELETE", "/v1/templates/mine:latest", expect=404)
    # The shared catalogue is the operator's to change.
    for method, path, body in (("DELETE", "/v1/templates/common", None),
                               ("POST", "/v1/templates:gc", {})):
        r = b.call(method, path, json_body=body, expect=403)
        assert r.body["error"]["code"] == "missing_scope", r.body
    # B's build FROM A's template fails as if it did not exist.
    r = b.call("POST", "/v1/templates",
               json_body={"name": "built", "source": {"build": {"dockerfile": "FROM mine\nENV X=1\n"}}},
               expect=202)
    op = b.wait_operation(r.body["operation"]["id"], timeout=120)
    assert op["state"] == "failed" and op["error"]["code"] == "template_not_found", op
    # A's own build FROM its template works, and is A's alone.
    r = a.call("POST", "/v1/templates",
               json_body={"name": "built", "source": {"build": {"dockerfile": "FROM mine\nENV X=1\n"}}},
               expect=202)
    op = a.wait_operation(r.body["operation"]["id"], timeout=120)
    assert op["state"] == "succeeded", op
    assert marker_of(a, "built") == "a-own"
    assert "built" not in names(b)

    # A tag of a shared release in A's namespace; a name of B's own hides the shared one for B
    # alone.
    a.call("PUT", "/v1/templates/mine:from-common", json_body={"from": "common"}, expect=200)
    assert marker_of(a, "mine:from-common") == "shared"
    imported(b, lab.archive("b-own"), "common")
    assert names(b) == {"base": [True], "common": [False, True]}
    assert b.call("GET", "/v1/templates/common", expect=200).body["shared"] is False
    assert marker_of(b, "common") == "b-own"
    assert marker_of(a, "common") == "shared"
    assert marker_of(lab.admin, "common") == "shared"
    # B deleting its "common" leaves the shared one in place.
    b.call("DELETE", "/v1/templates/common", expect=200)
    assert marker_of(b, "common") == "shared"
    assert shared_op["result"]["template"]["name"] == "common"

    # The operator deleting a shared name never touches a tenant's of the same name.
    imported(a, lab.archive("a-own"), "gone-shared")
    imported(lab.admin, lab.archive("shared"), "gone-shared")
    lab.admin.call("DELETE", "/v1/templates/gone-shared", expect=200)
    assert marker_of(a, "gone-shared") == "a-own"

    # A's templates go with A.
    assert any(t.startswith(f"{a_ten}/") for t in lab.tags_in_store())
    lab.admin.call("DELETE", f"/v1/admin/tenants/{a_ten}", expect=202)
    assert not any(t.startswith(f"{a_ten}/") for t in lab.tags_in_store()), lab.tags_in_store()
    assert "common:latest" in lab.tags_in_store()


def test_template_quotas_count_names_and_bytes(lab):
    ten, c = lab.tenant_client("tpl-quota", quotas={"max_templates": 1})
    imported(c, lab.archive("q1"), "one")
    # A second tag of the same name is not a second template.
    imported(c, lab.archive("q2"), "one", "v2")
    c.call("PUT", "/v1/templates/one:v3", json_body={"from": "one:v2"}, expect=200)
    # A second name is refused before the upload is kept, by an import or a tag.
    r = start_import(c, lab.archive("q1"), "two", expect=429)
    err = r.body["error"]
    assert err["code"] == "quota_exceeded", err
    assert err["details"] == {"quota": "max_templates", "limit": 1, "used": 1, "requested": 1}, err
    r = c.call("PUT", "/v1/templates/two:1", json_body={"from": "one"}, expect=429)
    assert r.body["error"]["details"]["quota"] == "max_templates"
    # Under concurrency: of three new names at a quota of two, exactly one more lands.
    lab.admin.call("PATCH", f"/v1/admin/tenants/{ten}", json_body={"quotas": {"max_templates": 2}},
                   expect=200)
    data = lab.archive("q1")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(
            lambda i: start_import(c.clone(), data, f"race-{i}", expect=(202, 429)), range(3)))
    assert any(r.status_code == 202 for r in answers), [r.status_code for r in answers]
    ops = [r.body["operation"]["id"] for r in answers if r.status_code == 202]
    states = [c.wait_operation(op, timeout=120) for op in ops]
    won = [s for s in states if s["state"] == "succeeded"]
    assert len(won) == 1, states
    for s in states:
        if s["state"] == "failed":
            assert s["error"]["code"] == "quota_exceeded", s
    assert len([n for n, shared in names(c).items() if shared == [False]]) == 2

    # Bytes: what the tenant's tags name, each release once.
    ten2, c2 = lab.tenant_client("tpl-bytes")
    first = imported(c2, lab.archive("b1"), "x")
    size = first["result"]["template"]["size"]
    assert size > 0
    lab.admin.call("PATCH", f"/v1/admin/tenants/{ten2}",
                   json_body={"quotas": {"max_template_bytes": size + 1}}, expect=200)
    # Another tag of the same release adds nothing.
    c2.call("PUT", "/v1/templates/y:1", json_body={"from": "x"}, expect=200)
    # A new release would pass the limit: the import fails at its end, and nothing is tagged.
    op = start_import(c2, lab.archive("b2"), "z").body["operation"]
    done = c2.wait_operation(op["id"], timeout=120)
    assert done["state"] == "failed" and done["error"]["code"] == "quota_exceeded", done
    assert "z" not in names(c2)
    r = c2.call("POST", "/v1/sandboxes", json_body={"template": "z"}, expect=422)
    assert r.body["error"]["code"] == "template_not_found"
    # Exactly at the limit is allowed.
    lab.admin.call("PATCH", f"/v1/admin/tenants/{ten2}",
                   json_body={"quotas": {"max_template_bytes": size * 2}}, expect=200)
    imported(c2, lab.archive("b2"), "z")

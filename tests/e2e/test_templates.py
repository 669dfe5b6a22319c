"""Templates users bring (docs/templates.md): imports of skopeo-written archives, pulls from a
real registry (Debian's docker-registry on loopback, with and without htpasswd auth), sandboxes
from them (image config applied, layers shared, whiteouts and opaque directories), tag moves,
delete refused while in use, garbage collection, cancellation, and hostile archives that must
fail with a clear reason and leave nothing behind."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import images
from conftest import Daemon, ns_runtime_only, shutdown, skip_or_fail
from registry_lab import Registry
from sbx_client import SbxClient

pytestmark = ns_runtime_only("image layers are overlay lowers of the ns runtime")


@pytest.fixture(scope="module")
def work():
    d = Path(tempfile.mkdtemp(prefix="sbx-e2e-templates-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def base_layer() -> bytes:
    return (images.busybox_layer().dir("data").file("data/old", "old\n")
            .file("gone", "x").bytes())


def top_layer(marker: str = "new") -> bytes:
    return (images.Layer().whiteout("gone").dir("data").opaque("data")
            .file("data/new", marker + "\n")
            # Parents as image builders write them: a directory a layer does not list is made
            # root-owned 0755 (as docker's unpacking does) and would hide the lower one's owner.
            .dir("home").dir("home/app", 0o755, 1000, 1000)
            .file("home/app/mine", "m", uid=1000, gid=1000).bytes())


def make_image(work: Path, name: str, marker: str = "new", kind: str = "docker") -> Path:
    layout = work / f"{name}-layout"
    if not layout.exists():
        images.write_layout(layout, [base_layer(), top_layer(marker)],
                            env=["PATH=/bin", "GREETING=hi"], workdir="/home/app", user="app",
                            gzip_layers=(0,))
    out = work / f"{name}.{kind}.tar"
    if not out.exists():
        (images.docker_archive if kind == "docker" else images.oci_archive)(layout, out)
    return out


def import_archive(api: SbxClient, path: Path, name: str, tag: str = "latest", expect=202):
    resp = api.call("POST", "/v1/templates:import", params={"name": name, "tag": tag},
                    data=path.read_bytes(), headers={"Content-Type": "application/x-tar"},
                    expect=expect)
    return resp.body


def finished(api: SbxClient, answer: dict, timeout: float = 120) -> dict:
    return api.wait_operation(answer["operation"]["id"], timeout=timeout)


def run_out(api: SbxClient, sandbox_id: str, script: str) -> str:
    r = api.run(sandbox_id, ["sh", "-c", script])
    assert r.exit and r.exit.get("exit_code") == 0, (r.stdout, r.stderr, r.exit)
    return r.stdout.decode()


def state_leftovers(daemon: Daemon) -> list[str]:
    root = daemon.state_dir / "templates"
    found = []
    for sub in ("uploads", "pulls", "store/tmp"):
        d = root / sub
        if d.is_dir():
            found += [f"{sub}/{p.name}" for p in d.iterdir()]
    found += [p.name for p in (root / "uploads").glob(".import-*")] if (root / "uploads").is_dir() else []
    return found


def test_an_imported_image_runs_with_its_config_layers_and_whiteouts(api, sbxd, work):
    for kind in ("docker", "oci"):
        op = finished(api, import_archive(api, make_image(work, "bb", kind=kind), "bb", kind))
        assert op["state"] == "succeeded", op
        assert op["kind"] == "template_import" and op["sandbox_id"] is None
        assert op["target"] == f"bb:{kind}"
        assert op["progress"]["stage"] == "done"
        assert op["result"]["template"]["digest"].startswith("sha256:")
    sb = api.create_sandbox({"template": "bb:docker"})["sandbox"]
    assert sb["template_digest"] == api.call("GET", "/v1/templates/bb").body["tags"]["docker"]
    out = run_out(api, sb["id"], "id -u; pwd; echo $GREETING; ls /data; test -e /gone || echo nogone; "
                                 "stat -c %u /home/app/mine; test -e /usr/bin/python3 || echo nohost; "
                                 "echo w > /home/app/written && cat /home/app/written")
    assert out.split() == ["1000", "/home/app", "hi", "new", "nogone", "1000", "nohost", "w"], out
    # Root is root in the sandbox still, and the session's env wins over the image's.
    r = api.run(sb["id"], ["sh", "-c", "id -u; echo $GREETING"], user="root", env={"GREETING": "mine"})
    assert r.stdout.decode().split() == ["0", "mine"]
    listed = api.call("GET", "/v1/templates").body
    names = [t["name"] for t in listed["templates"]]
    assert names[0] == "base" and "bb" in names
    api.delete_sandbox(sb["id"])
    assert state_leftovers(sbxd) == []


def test_templates_share_layers_tags_move_and_in_use_releases_stay(api, sbxd, work):
    one = finished(api, import_archive(api, make_image(work, "v1", "one"), "share", "v1"))
    two = finished(api, import_archive(api, make_image(work, "v2", "two"), "share", "v2"))
    assert one["state"] == two["state"] == "succeeded", (one, two)
    # The busybox layer is stored once: three layers for two releases of two layers each.
    layers = list((sbxd.state_dir / "templates/store/layers/sha256").iterdir())
    t = api.call("GET", "/v1/templates/share").body
    digests = {r["digest"] for r in t["releases"]}
    assert len(digests) == 2
    assert images.sha256(base_layer())[7:] in {p.name for p in layers}

    # A tag pointed at an existing release, by tag and by digest.
    v1 = api.call("GET", "/v1/templates/share").body["tags"]["v1"]
    moved = api.call("PUT", "/v1/templates/share:stable", json_body={"from": "share:v1"}, expect=200).body
    assert moved["digest"] == v1 and moved["previous"] is None
    moved = api.call("PUT", "/v1/templates/other:pin", json_body={"from": f"share@{v1}"}, expect=200).body
    assert moved["digest"] == v1
    sbp = api.create_sandbox({"template": f"other@{v1}"})["sandbox"]
    assert run_out(api, sbp["id"], "cat /data/new").strip() == "one"
    api.delete_sandbox(sbp["id"])
    api.call("PUT", "/v1/templates/share:x", json_body={"from": "share:nope"}, expect=404)
    api.call("PUT", "/v1/templates/share:x", json_body={"src": "share:v1"}, expect=400)
    api.call("DELETE", "/v1/templates/other", expect=200)
    api.call("DELETE", "/v1/templates/share:stable", expect=200)

    # latest -> v1; a sandbox from it; latest moves to v2: the sandbox keeps v1's files.
    finished(api, import_archive(api, make_image(work, "v1", "one"), "share", "latest"))
    sb = api.create_sandbox({"template": "share:latest"})["sandbox"]
    v1_digest = sb["template_digest"]
    finished(api, import_archive(api, make_image(work, "v2", "two"), "share", "latest"))
    assert api.call("GET", "/v1/templates/share").body["tags"]["latest"] != v1_digest
    assert run_out(api, sb["id"], "cat /data/new").strip() == "one"
    sb2 = api.create_sandbox({"template": "share:latest"})["sandbox"]
    assert run_out(api, sb2["id"], "cat /data/new").strip() == "two"
    api.delete_sandbox(sb2["id"])

    # v1 is still named by tag v1; deleting that tag would orphan a release a sandbox uses.
    resp = api.call("DELETE", "/v1/templates/share:v1", expect=409)
    assert resp.body["error"]["code"] == "template_in_use"
    api.delete_sandbox(sb["id"])
    api.call("DELETE", "/v1/templates/share:v1", expect=200)
    api.call("DELETE", "/v1/templates/share", expect=200)
    api.call("GET", "/v1/templates/share", expect=404)
    gc = api.call("POST", "/v1/templates:gc", json_body={}, expect=200).body
    assert gc["layers_removed"] >= 1
    # What other tests' templates still list stays.
    for t in api.call("GET", "/v1/templates").body["templates"]:
        for r in t.get("releases", []):
            for layer in r["layers"]:
                assert (sbxd.state_dir / "templates/store/layers/sha256" / layer["diff_id"][7:]).is_dir()


def hostile_archives(work: Path) -> dict[str, Path]:
    out = {}
    import io
    import tarfile

    def tar(path: Path, entries: list[tuple[str, bytes]]):
        with tarfile.open(path, "w") as t:
            for name, data in entries:
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        return path

    out["climbs"] = tar(work / "climbs.tar", [("../../escape", b"x"), ("index.json", b"{}")])
    out["not_an_image"] = tar(work / "plain.tar", [("hello.txt", b"hi")])
    (work / "garbage.tar").write_bytes(os.urandom(4096))
    out["garbage"] = work / "garbage.tar"
    # A layout whose layer is not what its digest says.
    lay = work / "lie-layout"
    info = images.write_layout(lay, [images.Layer().file("a", "1").bytes()])
    blob = next(p for p in (lay / "blobs/sha256").iterdir()
                if p.name == json.loads((lay / "blobs/sha256" / info["manifest_digest"][7:]).read_text())["layers"][0]["digest"][7:])
    blob.write_bytes(images.Layer().file("a", "2").bytes())
    out["digest_lie"] = tar(work / "lie.tar", [(str(p.relative_to(lay)), p.read_bytes())
                                              for p in lay.rglob("*") if p.is_file()])
    # A layer that escapes through its own symlink and climbs with ..
    evil = images.Layer().symlink("up", "../../../../..").file("up/tmp/sbx-e2e-escape", "x").bytes()
    lay2 = work / "evil-layout"
    images.write_layout(lay2, [evil])
    out["symlink_escape"] = tar(work / "evil.tar", [(str(p.relative_to(lay2)), p.read_bytes())
                                                   for p in lay2.rglob("*") if p.is_file()])
    return out


def test_hostile_archives_fail_clearly_and_leave_nothing(api, sbxd, work):
    cases = hostile_archives(work)
    codes = {}
    for name, path in cases.items():
        op = finished(api, import_archive(api, path, "hostile", name.replace("_", "-")))
        codes[name] = (op["state"], (op["error"] or {}).get("code"), (op["error"] or {}).get("message"))
    for name, (state, code, message) in codes.items():
        if name == "symlink_escape":
            # Contained: the layer's symlink resolves inside the layer, so this one imports.
            assert state == "succeeded", (name, code, message)
            continue
        assert state == "failed", (name, code, message)
        assert code == "invalid_image", (name, code, message)
        assert message, name
    assert not Path("/tmp/sbx-e2e-escape").exists()
    assert not (sbxd.state_dir.parent / "escape").exists()
    assert state_leftovers(sbxd) == []
    # Bad requests are refused before anything is stored.
    for params, code in (({"name": "Bad Name"}, "invalid_template_ref"), ({"tag": "x"}, "invalid_argument"),
                         ({"name": "base"}, "invalid_template_ref")):
        resp = api.call("POST", "/v1/templates:import", params=params, data=b"x" * 10, expect=400)
        assert resp.body["error"]["code"] == code, resp.body
    api.call("POST", "/v1/templates:import", params={"name": "empty"}, data=b"", expect=400)
    resp = api.call("POST", "/v1/templates", json_body={"name": "x", "source": {"image": "UPPER/x"}}, expect=400)
    assert resp.body["error"]["code"] == "invalid_image_ref"
    for build, field in (({}, "source.build.dockerfile"), ([], "source.build"),
                         ({"dockerfile": "FROM x", "shell": 1}, "source.build.shell"),
                         ({"dockerfile": "FROM x", "args": {"A": 1}}, "source.build.args"),
                         ({"dockerfile": "FROM x", "sandbox": {"resources": {"vcpu": -1}}},
                          "source.build.sandbox"),
                         ({"dockerfile": "RUN true"}, "source.build.dockerfile")):
        resp = api.call("POST", "/v1/templates", json_body={"name": "x", "source": {"build": build}},
                        expect=400)
        assert resp.body["error"]["details"]["field"] == field, (build, resp.body)
    api.call("GET", "/v1/templates/nope", expect=404)
    # A sandbox's operation is not cancelled by DELETE (the sandbox's delete ends it).
    sb = api.create_sandbox({})
    resp = api.call("DELETE", f"/v1/operations/{sb['operation']['id']}", expect=409)
    assert resp.body["error"]["code"] == "not_cancellable"
    api.call("DELETE", "/v1/operations/op_" + "a" * 20, expect=404)
    assert api.call("DELETE", "/v1/templates/base", expect=409).body["error"]["code"] == "template_builtin"
    assert state_leftovers(sbxd) == []


@pytest.fixture(scope="module")
def registries(work):
    htpasswd = shutil.which("htpasswd")
    if not htpasswd:
        skip_or_fail("htpasswd (apache2-utils) is not installed")
    line = subprocess.run([htpasswd, "-Bbn", "puller", "s3cret"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (work / "htpasswd").write_text(line + "\n")
    open_reg = Registry(work / "reg-open")
    auth_reg = Registry(work / "reg-auth", work / "htpasswd")
    yield open_reg, auth_reg
    open_reg.stop()
    auth_reg.stop()


@pytest.fixture(scope="module")
def puller(registries, work, validator):
    """An sbxd whose configuration names the test registries (insecure: plain http on loopback)
    and the credentials of the one with auth."""
    open_reg, auth_reg = registries
    tarpit = socket.socket()
    tarpit.bind(("127.0.0.1", 0))
    tarpit.listen(16)  # accepts by the kernel's backlog, never answers: a pull that hangs
    tarpit_host = f"127.0.0.1:{tarpit.getsockname()[1]}"
    auth = work / "auth.json"
    auth.write_text(json.dumps({"auths": {auth_reg.host: {"username": "puller", "password": "s3cret"}}}))
    d = Daemon(["--templates-registry-insecure", f"{open_reg.host},{auth_reg.host},{tarpit_host}",
                "--templates-registry-auth-file", str(auth)])
    d.start()
    client = SbxClient(d.url, d.token, validator)
    try:
        yield d, client, tarpit_host
    finally:
        problems = shutdown(d, validator, list(client.created_sandboxes))
        client.close()
        tarpit.close()
        assert not problems, problems


def test_pulls_from_a_registry_with_and_without_auth(puller, registries, work):
    daemon, api, tarpit = puller
    open_reg, auth_reg = registries
    layout = work / "pull-layout"
    info = images.write_layout(layout, [base_layer(), top_layer("pulled")], workdir="/home/app",
                               user="app", gzip_layers=(0, 1))
    open_reg.push(layout, "team/app:1")
    auth_reg.push(layout, "team/app:1", creds="puller:s3cret")

    ans = api.call("POST", "/v1/templates", json_body={
        "name": "pulled", "tag": "1", "source": {"image": f"{open_reg.host}/team/app:1"}}, expect=202).body
    op = finished(api, ans)
    assert op["state"] == "succeeded", op
    assert op["result"]["template"]["digest"] == info["manifest_digest"]
    assert op["progress"]["layers_total"] >= 2
    sb = api.create_sandbox({"template": "pulled:1"})["sandbox"]
    assert run_out(api, sb["id"], "cat /data/new; id -u").split() == ["pulled", "1000"]
    api.delete_sandbox(sb["id"])

    # By digest, and behind basic auth with the configured credentials.
    op = finished(api, api.call("POST", "/v1/templates", json_body={
        "name": "pulled", "tag": "auth",
        "source": {"image": f"{auth_reg.host}/team/app@{info['manifest_digest']}"}}, expect=202).body)
    assert op["state"] == "succeeded", op
    # A multi-arch index picks linux/amd64; a zstd-compressed copy of the image pulls too.
    multi = work / "multi-layout"
    digests = images.write_multiarch_layout(multi, {
        "arm64": [images.Layer().file("arch", "arm64\n").bytes()],
        "amd64": [base_layer(), top_layer("amd64")]})
    images.skopeo("copy", "-q", "--all", "--dest-tls-verify=false", f"oci:{multi}:t",
                  f"docker://{open_reg.host}/team/multi:1")
    # skopeo keeps a compressed layer as it is: zstd from a layout of uncompressed layers.
    plain = work / "plain-layout"
    images.write_layout(plain, [base_layer(), top_layer("pulled")], workdir="/home/app", user="app")
    images.skopeo("copy", "-q", "--dest-tls-verify=false", "--dest-compress-format", "zstd",
                  f"oci:{plain}:t", f"docker://{open_reg.host}/team/zstd:1")
    raw = subprocess.run([shutil.which("skopeo"), "inspect", "--tls-verify=false", "--raw",
                          f"docker://{open_reg.host}/team/zstd:1"], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    # (a layer the registry holds already is reused as it is: at least the top one is zstd)
    assert any(layer["mediaType"].endswith("+zstd") for layer in json.loads(raw)["layers"]), raw
    for image, tag in ((f"{open_reg.host}/team/multi:1", "multi"), (f"{open_reg.host}/team/zstd:1", "zstd")):
        op = finished(api, api.call("POST", "/v1/templates", json_body={
            "name": "pulled", "tag": tag, "source": {"image": image}}, expect=202).body)
        assert op["state"] == "succeeded", (image, op)
    assert set(digests) == {"amd64", "arm64", "index"}
    # (skopeo compresses the layers it pushes, so the registry's digests are its own.)
    for tag, want in (("multi", "amd64"), ("zstd", "pulled")):
        sb = api.create_sandbox({"template": f"pulled:{tag}"})["sandbox"]
        assert run_out(api, sb["id"], "cat /data/new").strip() == want
        api.delete_sandbox(sb["id"])

    # A digest the registry does not have, a repository it does not have.
    bad = "sha256:" + "0" * 64
    for image, code in ((f"{open_reg.host}/team/app@{bad}", "image_not_found"),
                        (f"{open_reg.host}/team/none:1", "image_not_found"),
                        (f"{auth_reg.host}/team/none:1", "image_not_found")):
        op = finished(api, api.call("POST", "/v1/templates", json_body={
            "name": "pulled", "tag": "bad", "source": {"image": image}}, expect=202).body)
        assert op["state"] == "failed" and op["error"]["code"] == code, (image, op)

    # A pull that hangs is cancelled by DELETE and leaves nothing.
    ans = api.call("POST", "/v1/templates", json_body={
        "name": "hang", "source": {"image": f"{tarpit}/team/app:1"}}, expect=202).body
    op_id = ans["operation"]["id"]
    api.call("DELETE", f"/v1/operations/{op_id}", expect=202)
    op = api.wait_operation(op_id, timeout=30)
    assert op["state"] == "failed" and op["error"]["code"] == "cancelled", op
    assert state_leftovers(daemon) == []


def test_a_build_from_a_registry_image_fetches_its_layers_once(puller, registries, work):
    """FROM a registry image: the first build imports it; the next ones resolve the tag again
    (it may have moved) but fetch no blob of an image whose layers are in the store."""
    _, api, _ = puller
    open_reg, _ = registries
    layout = work / "parent-layout"
    images.write_layout(layout, [base_layer(), top_layer("parent")], user="app")
    open_reg.push(layout, "team/parent:1")
    log = work / "reg-open" / "registry.log"

    def blob_gets() -> int:
        open_reg.log.flush()
        return sum(1 for line in log.read_text(errors="replace").splitlines()
                   if "GET /v2/team/parent/blobs/" in line)

    dockerfile = f"FROM {open_reg.host}/team/parent:1\nUSER root\nRUN echo built > /built\n"
    digests = []
    for i in range(2):
        before = blob_gets()
        op = finished(api, api.call("POST", "/v1/templates", json_body={
            "name": "fromreg", "tag": str(i),
            "source": {"build": {"dockerfile": dockerfile, "no_cache": True}}}, expect=202).body,
            timeout=300)
        assert op["state"] == "succeeded", op
        digests.append(op["result"]["template"]["digest"])
        fetched = blob_gets() - before
        if i == 0:
            assert fetched >= 3, fetched  # the config and both layers
        else:
            assert fetched == 0, f"the second build fetched {fetched} blobs again"
    sb = api.create_sandbox({"template": "fromreg:1"})["sandbox"]
    assert run_out(api, sb["id"], "cat /built /data/new").split() == ["built", "parent"]
    api.delete_sandbox(sb["id"])


def test_a_restart_during_a_pull_fails_it_cleanly(restartable):
    """sbxd stopped (SIGKILL: a crash) in the middle of a pull: the next sbxd fails the
    operation as interrupted and leaves no partial layout, upload or layer behind."""
    tarpit = socket.socket()
    tarpit.bind(("127.0.0.1", 0))
    tarpit.listen(16)
    host = f"127.0.0.1:{tarpit.getsockname()[1]}"
    try:
        restartable.start()
        api = restartable.restart(["--templates-registry-insecure", host])
        ans = api.call("POST", "/v1/templates", json_body={
            "name": "hang", "source": {"image": f"{host}/team/app:1"}}, expect=202).body
        op_id = ans["operation"]["id"]
        api = restartable.restart(["--templates-registry-insecure", host], kill=True)
        op = api.wait_operation(op_id, timeout=30)
        assert op["state"] == "failed" and op["error"]["code"] == "interrupted", op
        assert state_leftovers(restartable.daemon) == []
        assert "hang" not in [t["name"] for t in api.call("GET", "/v1/templates").body["templates"]]
    finally:
        tarpit.close()


def test_a_sandbox_from_a_template_survives_a_restart_of_sbxd(restartable, work):
    api = restartable.start()
    restartable.track(api)
    op = finished(api, import_archive(api, make_image(work, "bb", kind="oci"), "keep", "1"))
    assert op["state"] == "succeeded", op
    sb = api.create_sandbox({"template": "keep:1"})["sandbox"]
    api = restartable.restart()
    restartable.track(api)
    api.created_sandboxes.append(sb["id"])
    # Re-adopted, with its release resolved again from the store.
    assert api.get_sandbox(sb["id"])["state"] == "running"
    assert run_out(api, sb["id"], "cat /data/new; id -u").split() == ["new", "1000"]
    assert api.call("GET", "/v1/templates/keep").body["tags"]["1"] == sb["template_digest"]
    api.delete_sandbox(sb["id"])


def test_the_cli_imports_lists_tags_runs_and_removes(api, sbxd, work):
    from conftest import build_dir
    cli = [str(build_dir() / "bin" / "sbx"), "--url", sbxd.url, "--token", sbxd.token]

    def sbx(*args, check=True):
        p = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)
        assert not check or p.returncode == 0, (args, p.stdout, p.stderr)
        return p

    out = sbx("template", "import", str(make_image(work, "bb")), "-t", "clitpl:1").stdout
    assert out.startswith("clitpl:1 sha256:"), out
    sbx("template", "tag", "clitpl:1", "clitpl:latest")
    assert "clitpl:latest" in sbx("template", "ls").stdout
    assert json.loads(sbx("template", "inspect", "clitpl").stdout)["tags"]["1"]
    run = sbx("run", "--template", "clitpl", "--", "cat", "/data/new")
    assert run.stdout.strip() == "new", run
    bad = sbx("template", "import", str(hostile_archives(work)["not_an_image"]), "-t", "clitpl:bad",
              check=False)
    assert bad.returncode != 0 and "invalid_image" in bad.stderr, bad
    # The sandbox `sbx run` made is deleted by it; the template's tags can go (its release may
    # stay: the same image is tagged under another name by the tests before this one).
    removed = json.loads(sbx("template", "rm", "clitpl").stdout)
    assert sorted(t["tag"] for t in removed["deleted_tags"]) == ["1", "latest"], removed
    assert sbx("template", "inspect", "clitpl", check=False).returncode != 0

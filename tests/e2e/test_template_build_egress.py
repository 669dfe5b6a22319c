"""A template build whose RUN step downloads from the network (docs/templates.md, "Builds"),
in the egress lab of netlab.py: sbxd in a test namespace behind a stand-in internet on the
exempted 198.18.0.0/15, so nothing leaves the machine. The step's sandbox gets the egress
profile the build names; with the default, `none`, the same step cannot reach anything."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import images  # noqa: E402
import netlab  # noqa: E402
from netlab import HTTP_PORT, INTERNET  # noqa: E402

PROFILES = f"""
[egress.profiles.lab]
description = "the stand-in internet's web server only"
allow = [{{cidr = "{INTERNET}/32", ports = "{HTTP_PORT}", protocol = "tcp"}}]
"""


@pytest.fixture(scope="module")
def lab(validator, tmp_path_factory):
    work = tmp_path_factory.mktemp("build-egress")
    with netlab.lab(validator, PROFILES) as client:
        layout = work / "layout"
        images.write_layout(layout, [images.busybox_layer().symlink("bin/nc", "busybox").bytes()],
                            env=["PATH=/bin"])
        archive = images.docker_archive(layout, work / "bb.tar")
        resp = client.call("POST", "/v1/templates:import", params={"name": "netbb"},
                           data=archive.read_bytes(),
                           headers={"Content-Type": "application/x-tar"}, expect=202)
        op = client.wait_operation(resp.body["operation"]["id"], timeout=120)
        assert op["state"] == "succeeded", op
        yield client


def build(client, name: str, dockerfile: str, sandbox: dict | None):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    params = {"name": name}
    if sandbox is not None:
        params["build"] = json.dumps({"sandbox": sandbox})
    resp = client.call("POST", "/v1/templates:build", params=params, data=buf.getvalue(),
                       headers={"Content-Type": "application/x-tar"}, expect=202)
    return client.wait_operation(resp.body["operation"]["id"], timeout=300)


# busybox's static wget crashes without the NSS modules of a libc, so plain nc speaks HTTP.
FETCH = (f"FROM netbb\nRUN printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {INTERNET} {HTTP_PORT} "
         f"> /fetched && grep -q internet-ok /fetched\n")


def test_a_run_step_uses_the_egress_profile_the_build_names(lab):
    op = build(lab, "fetched", FETCH, {"egress_profile": "lab"})
    assert op["state"] == "succeeded", op
    sb = lab.create_sandbox({"template": "fetched"})["sandbox"]
    r = lab.run(sb["id"], ["cat", "/fetched"])
    assert r.stdout.decode().endswith("internet-ok"), (r.stdout, r.stderr)
    lab.delete_sandbox(sb["id"])
    release = lab.call("GET", "/v1/templates/fetched").body["releases"][0]
    assert release["source"]["egress_profile"] == "lab"


def test_without_a_profile_a_run_step_reaches_nothing(lab):
    op = build(lab, "offline", FETCH, None)
    assert op["state"] == "failed", op
    assert op["error"]["code"] == "build_step_failed", op
    assert "line 2" in op["error"]["message"], op

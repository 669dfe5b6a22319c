"""Warm pools of image templates (docs/templates.md, "Warm pools"): `warm_pool.NAME=N` for a
template users brought, checked once the template store has loaded; a create is served from
the pool; a tag move drains the old release's sandboxes and the refill builds the new one;
delete and gc keep a release pooled sandboxes run on."""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import images
from conftest import ns_runtime_only

pytestmark = ns_runtime_only("image layers are overlay lowers of the ns runtime")


def metric(client, name: str) -> float | None:
    text = client.call("GET", "/metrics", validate=False, expect=200).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def ready(client, template: str) -> float | None:
    return metric(client, f'sbx_warm_pool_ready{{runtime="ns",template="{template}",egress="none"}}')


def wait_ready(client, template: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while ready(client, template) != n:
        assert time.monotonic() < deadline, (template, ready(client, template))
        time.sleep(0.1)


START = {"cmd": ["sh", "-c", "cat /marker > /tmp/started; exec sleep 1000"],
         "ready": ["test", "-e", "/tmp/started"]}


def import_image(client, work: Path, name: str, tag: str, marker: str) -> str:
    layout = work / f"{name}-{tag}"
    images.write_layout(layout, [images.busybox_layer().file("marker", marker).bytes()],
                        env=["PATH=/bin"])
    archive = images.docker_archive(layout, work / f"{name}-{tag}.tar")
    resp = client.call("POST", "/v1/templates:import",
                       params={"name": name, "tag": tag, "start": json.dumps(START)},
                       data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                       expect=202)
    op = client.wait_operation(resp.body["operation"]["id"], timeout=120)
    assert op["state"] == "succeeded", op
    return op["result"]["template"]["digest"]


def test_a_pool_of_an_image_template_serves_creates_and_follows_its_tag(restartable):
    work = Path(tempfile.mkdtemp(prefix="sbx-e2e-pools-"))
    try:
        client = restartable.start()
        one = import_image(client, work, "pooled", "latest", "one")
        two = import_image(client, work, "pooled", "two", "two")
        # The pool's template is an image template: sbxd checks it after the store loaded.
        client = restartable.restart(["--warm-pool", "pooled=1"])
        restartable.track(client)
        wait_ready(client, "pooled", 1)
        made = client.create_sandbox({"template": "pooled"})
        assert made["response"].body["operation"]["state"] == "succeeded", "served by the pool"
        sb = made["sandbox"]
        assert sb["template_digest"] == one
        assert client.run(sb["id"], ["cat", "/marker"]).stdout == b"one"
        # The pooled sandbox ran the release's start command before it was pooled.
        assert client.run(sb["id"], ["cat", "/tmp/started"]).stdout == b"one"
        client.delete_sandbox(sb["id"])
        wait_ready(client, "pooled", 1)
        # The pooled sandbox runs on `one`: neither delete nor gc may take it away.
        held = client.call("DELETE", "/v1/templates/pooled:latest", expect=409).body
        assert held["error"]["code"] == "template_in_use"
        assert "warm-pool" in held["error"]["message"], held
        client.call("POST", "/v1/templates:gc", json_body={}, expect=200)
        assert one in {r["digest"] for r in client.call("GET", "/v1/templates/pooled").body["releases"]}
        # The tag moves to `two`: the pool drains `one` and refills from `two`.
        client.call("PUT", "/v1/templates/pooled:latest", json_body={"from": "pooled:two"},
                    expect=200)
        wait_ready(client, "pooled", 1)
        made = client.create_sandbox({"template": "pooled"})
        # Served by a sandbox of `two` the refill built: the stale one was drained, not found
        # (and destroyed in the create's way) at this take.
        assert made["response"].body["operation"]["state"] == "succeeded", "served by the pool"
        sb = made["sandbox"]
        assert sb["template_digest"] == two
        assert client.run(sb["id"], ["cat", "/marker"]).stdout == b"two"
        client.delete_sandbox(sb["id"])
    finally:
        shutil.rmtree(work, ignore_errors=True)

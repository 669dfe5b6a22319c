"""Pulls from a registry behind the Docker token flow, over TLS from a test CA, and through the
configured HTTP proxy (docs/templates.md, "Pull"): Debian's docker-registry with `auth.token`,
the test's token service (registry_lab.TokenService) and Debian's tinyproxy, all on loopback.

What must hold:
  - sbxd follows the registry's 401 challenge to the token service, authenticates there with the
    credentials of `templates.registry_auth_file` over verified TLS, asks for pull only, and the
    pulled template runs;
  - the credentials never reach the registry itself, and the token is not kept in anything the
    API shows;
  - a wrong password and a missing CA each fail the operation with a clear code and reason, and
    leave nothing behind;
  - `templates.registry_proxy` carries the registry's and the token service's traffic."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

import images
from conftest import Daemon, ns_runtime_only, shutdown
from registry_lab import Registry, TinyProxy, TokenService
from sbx_client import SbxClient
from test_templates import base_layer, finished, run_out, state_leftovers, top_layer
from testca import Ca

pytestmark = ns_runtime_only("image layers are overlay lowers of the ns runtime")

PULL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def lab():
    root = Path(tempfile.mkdtemp(prefix="sbx-e2e-regtoken-"))
    ca = Ca.make(root, "sbx-test-registry-ca")
    token = TokenService(root / "token", ca, {"puller": ("s3cret", ["pull"]),
                                              "pusher": ("pushpw", ["pull", "push"])})
    reg = Registry(root / "registry", ca=ca, token=token)
    proxy = TinyProxy(root / "proxy")
    layout = root / "layout"
    info = images.write_layout(layout, [base_layer(), top_layer("token")], workdir="/home/app",
                               user="app", gzip_layers=(0, 1))
    reg.push(layout, "team/app:1", creds="pusher:pushpw")
    try:
        yield {"root": root, "ca": ca, "token": token, "registry": reg, "proxy": proxy,
               "manifest_digest": info["manifest_digest"]}
    finally:
        proxy.stop()
        reg.stop()
        token.stop()
        shutil.rmtree(root, ignore_errors=True)


class Puller:
    """An sbxd with the given registry settings, stopped (and checked for leftovers) after."""

    def __init__(self, validator, args: list[str]):
        self.daemon = Daemon(args)
        self.daemon.start()
        self.api = SbxClient(self.daemon.url, self.daemon.token, validator)
        self.validator = validator

    def pull(self, image: str, name: str, tag: str) -> dict:
        ans = self.api.call("POST", "/v1/templates", json_body={
            "name": name, "tag": tag, "source": {"image": image}}, expect=202).body
        return finished(self.api, ans, timeout=PULL_TIMEOUT_S)

    def close(self) -> None:
        problems = shutdown(self.daemon, self.validator, list(self.api.created_sandboxes))
        self.api.close()
        assert not problems, problems


def auth_file(root: Path, host: str, user: str, password: str) -> Path:
    path = root / f"auth-{user}-{password}.json"
    path.write_text(json.dumps({"auths": {host: {"username": user, "password": password}}}))
    return path


def test_a_pull_follows_the_token_flow_over_verified_tls(lab, validator):
    reg, token = lab["registry"], lab["token"]
    p = Puller(validator, ["--templates-registry-ca-file", str(lab["ca"].path),
                           "--templates-registry-auth-file",
                           str(auth_file(lab["root"], reg.host, "puller", "s3cret"))])
    try:
        before = len(token.requests)
        op = p.pull(f"{reg.host}/team/app:1", "tok", "1")
        assert op["state"] == "succeeded", op
        assert op["result"]["template"]["digest"] == lab["manifest_digest"]
        asked = token.requests[before:]
        # sbxd authenticated at the token service as the configured user, asked to pull only.
        assert asked and all(r["user"] == "puller" and not r["refused"] for r in asked), asked
        assert {s for r in asked for s in r["scope"]} == {"repository:team/app:pull"}, asked
        # The registry challenged sbxd, then served the manifest on the token.
        log = reg.log_path.read_text(errors="replace")
        assert "authorization token required" in log, log
        assert any("GET /v2/team/app/manifests/1 " in line and '" 200 ' in line and '"sbx"' in line
                   for line in log.splitlines()), log
        sb = p.api.create_sandbox({"template": "tok:1"})["sandbox"]
        assert run_out(p.api, sb["id"], "cat /data/new; id -u").split() == ["token", "1000"]
        p.api.delete_sandbox(sb["id"])
        # Nothing the API shows carries the credentials or a token.
        shown = json.dumps(p.api.call("GET", "/v1/templates/tok").body) + json.dumps(op)
        assert "s3cret" not in shown and "eyJ" not in shown, shown
    finally:
        p.close()


def test_a_wrong_password_or_a_missing_ca_fails_clearly_and_leaves_nothing(lab, validator):
    reg, token = lab["registry"], lab["token"]
    wrong = Puller(validator, ["--templates-registry-ca-file", str(lab["ca"].path),
                               "--templates-registry-auth-file",
                               str(auth_file(lab["root"], reg.host, "puller", "not-it"))])
    try:
        before = len(token.requests)
        op = wrong.pull(f"{reg.host}/team/app:1", "tok", "bad")
        assert op["state"] == "failed" and op["error"]["code"] == "registry_auth_failed", op
        assert "token" in op["error"]["message"], op
        assert any(r["refused"] for r in token.requests[before:]), token.requests[before:]
        assert state_leftovers(wrong.daemon) == []
    finally:
        wrong.close()

    no_ca = Puller(validator, ["--templates-registry-auth-file",
                               str(auth_file(lab["root"], reg.host, "puller", "s3cret"))])
    try:
        before = len(token.requests)
        op = no_ca.pull(f"{reg.host}/team/app:1", "tok", "noca")
        assert op["state"] == "failed" and op["error"]["code"] == "registry_unavailable", op
        assert "certificate" in op["error"]["message"].lower(), op
        # TLS failed before any credential was sent anywhere.
        assert token.requests[before:] == []
        assert state_leftovers(no_ca.daemon) == []
    finally:
        no_ca.close()


def test_the_configured_proxy_carries_the_registry_and_token_traffic(lab, validator):
    reg, token, proxy = lab["registry"], lab["token"], lab["proxy"]
    p = Puller(validator, ["--templates-registry-ca-file", str(lab["ca"].path),
                           "--templates-registry-auth-file",
                           str(auth_file(lab["root"], reg.host, "puller", "s3cret")),
                           "--templates-registry-proxy", proxy.url])
    try:
        op = p.pull(f"{reg.host}/team/app@{lab['manifest_digest']}", "viaproxy", "1")
        assert op["state"] == "succeeded", op
        relayed = proxy.relayed()
        # TLS through an HTTP proxy is a CONNECT per host: the registry and the token service.
        assert f"CONNECT 127.0.0.1:{reg.port}" in relayed, relayed
        assert f"CONNECT 127.0.0.1:{token.port}" in relayed, relayed
    finally:
        p.close()

    # Hosts in templates.registry_no_proxy bypass it.
    direct = Puller(validator, ["--templates-registry-ca-file", str(lab["ca"].path),
                                "--templates-registry-auth-file",
                                str(auth_file(lab["root"], reg.host, "puller", "s3cret")),
                                "--templates-registry-proxy", proxy.url,
                                "--templates-registry-no-proxy", "127.0.0.1"])
    try:
        before = proxy.relayed()
        op = direct.pull(f"{reg.host}/team/app:1", "direct", "1")
        assert op["state"] == "succeeded", op
        assert proxy.relayed() == before, "a no_proxy host went through the proxy"
    finally:
        direct.close()

"""The Helm chart deploy/helm/sbx and the plain manifest rendered from it (issue 21).

Run by tools/test_deploy.sh with the venv of tests/deploy/requirements.lock (kubernetes-validate,
pytest, pyyaml) and the helm that tools/helm/build.sh builds. No cluster is needed: everything is
`helm lint`/`helm template`, the Kubernetes OpenAPI schemas kubernetes-validate ships (strict:
an unknown field fails), and sbxd's own config checker.

Environment:
  SBX_HELM            helm binary (default: tools/helm/build.sh's, built when missing)
  SBX_BUILD_DIR       build tree whose bin/sbxd checks the config (default <repo>/build)
  SBX_TESTS_MUST_RUN  1: a missing prerequisite fails the test instead of skipping it
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import tempfile

import pytest
import yaml

from conftest import cannot_run

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "sbx"
MANIFEST = ROOT / "deploy" / "k8s" / "sbx.yaml"
MUST_RUN = os.environ.get("SBX_TESTS_MUST_RUN") == "1"
RELEASE = "sbx"
# How deploy/k8s/sbx.yaml is rendered (its header says the same): default values, but Secrets the
# user creates, so that the committed file holds no token and renders the same every time.
MANIFEST_SETS = ["adminToken.existingSecret=sbx-admin-token", "database.existingSecret=sbx-database"]


def newest_schema(kv) -> str:
    """The newest Kubernetes version whose strict schemas kubernetes-validate ships."""
    return kv.latest_version()


# The chart refuses to render without a database; the tests that are not about it give one.
SOME_DATABASE = "database.url=postgresql://sbx@postgres:5432/sbx"


def render_text(helm: str, *sets: str) -> str:
    if not any(s.startswith("database.") for s in sets):
        sets = (SOME_DATABASE,) + sets
    args = [helm, "template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, f"helm template failed: {out.stderr}"
    return out.stdout


def render(helm: str, *sets: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_text(helm, *sets)) if d]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def validate_all(kv, objs: list[dict]) -> None:
    version = newest_schema(kv)
    for obj in objs:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{name} does not validate against Kubernetes {version} (strict): "
                        f"{'.'.join(map(str, e.path))}: {e.message}")


def sbxd_args(workload: dict) -> list[str]:
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "sbxd"]
    return container["command"] + container["args"]


def flag(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def test_helm_lint(helm):
    out = subprocess.run([helm, "lint", "--strict", str(CHART), "--set", SOME_DATABASE],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"helm lint: {out.stdout}{out.stderr}"


def test_no_database_is_refused_at_render(helm):
    # Pods that would all exit at start for want of a store are worse than a failed install.
    for sets in ([], ["database.url="]):
        args = [helm, "template", RELEASE, str(CHART)]
        for s in sets:
            args += ["--set", s]
        out = subprocess.run(args, capture_output=True, text=True)
        assert out.returncode != 0, out.stdout
        assert "database.url (postgresql://...) or database.existingSecret is required" in out.stderr


def test_default_render_validates(helm, validator):
    objs = render(helm)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "PodDisruptionBudget", "Secret",
                     "Secret", "Service"], kinds
    validate_all(validator, objs)
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    ds = one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is False
    (sbxd,) = pod["containers"]
    assert sbxd["securityContext"]["privileged"] is True
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths == {"/var/lib/sbx", "/sys/fs/cgroup"}
    (doctor,) = pod["initContainers"]
    assert doctor["command"] + doctor["args"] == ["sbx", "doctor", "--state-dir", "/var/lib/sbx",
                                                  "--runtime", "ns", "--cgroup-parent", "/sbx"]
    env = {e["name"]: e.get("value") for e in sbxd["env"]}
    assert env["SBX_STATE_DIR"] == "/var/lib/sbx"
    assert env["SBX_RUNTIME_NS_CGROUP_PARENT"] == "/sbx"
    mounts = {m["mountPath"]: m for m in sbxd["volumeMounts"]}
    assert mounts["/var/lib/sbx"]["mountPropagation"] == "Bidirectional"
    for workload in (deploy, ds):
        tmpl = workload["spec"]["template"]
        ann = tmpl["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert ann["prometheus.io/path"] == "/metrics"
        assert ann["prometheus.io/port"] == "7070"
        (c,) = tmpl["spec"]["containers"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["ports"][0]["containerPort"] == 7070
    assert one(objs, "Service")["spec"]["ports"][0]["port"] == 7070


def test_committed_manifest_is_a_fresh_render(helm):
    committed = MANIFEST.read_text()
    assert committed.startswith("#"), "deploy/k8s/sbx.yaml lost its header comment"
    # The header is the comment block before the render's first document separator.
    body = committed[committed.index("\n---\n") + 1:]
    fresh = render_text(helm, *MANIFEST_SETS)
    assert body.strip() == fresh.strip(), (
        "deploy/k8s/sbx.yaml differs from the chart's render: re-render it (docs/kubernetes.md)")


def test_committed_manifest_validates(helm, validator):
    objs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    assert not by_kind(objs, "Secret"), "the plain manifest must not carry a secret"
    validate_all(validator, objs)


def test_overrides(helm, validator):
    objs = render(helm, "adminToken.existingSecret=my-admin", "database.existingSecret=my-db",
                  "node.kvm.enabled=true", "api.replicas=3")
    validate_all(validator, objs)
    assert not by_kind(objs, "Secret"), "existingSecret: the chart must create no Secret"
    deploy, ds = one(objs, "Deployment"), one(objs, "DaemonSet")
    assert deploy["spec"]["replicas"] == 3
    api_env = {e["name"]: e for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert api_env["SBX_STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "my-db"
    assert api_env["SBX_SERVER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-admin"
    pod = ds["spec"]["template"]["spec"]
    node_env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert node_env["SBX_SERVER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-admin"
    assert node_env["SBX_STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "my-db"
    (kvm,) = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/dev/kvm"]
    assert kvm["hostPath"]["type"] == "CharDevice"
    for c in pod["containers"] + pod["initContainers"]:
        assert "/dev/kvm" in [m["mountPath"] for m in c["volumeMounts"]], c["name"]


def test_generated_secrets_hold_the_values(helm):
    import base64
    objs = render(helm, "adminToken.value=tok", "database.url=postgresql://db/sbx")
    data = {s["metadata"]["name"]: s["data"] for s in by_kind(objs, "Secret")}
    assert base64.b64decode(data["sbx-admin-token"]["admin-token"]) == b"tok"
    assert base64.b64decode(data["sbx-database"]["url"]) == b"postgresql://db/sbx"


def test_config_passes_sbxd_checker(helm):
    sbxd = pathlib.Path(os.environ.get("SBX_BUILD_DIR", ROOT / "build")) / "bin" / "sbxd"
    if not os.access(sbxd, os.X_OK):
        cannot_run(f"no sbxd at {sbxd}: build it (ninja -C build) or set SBX_BUILD_DIR")
    toml = one(render(helm), "ConfigMap")["data"]["sbxd.toml"]
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(toml)
        f.flush()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        out = subprocess.run([str(sbxd), "--config", f.name, "--print-config"],
                             capture_output=True, text=True, env=env)
    assert out.returncode == 0, f"sbxd rejects the chart's config: {out.stderr}"
    effective = out.stdout
    # The values the chart relies on are the ones sbxd reads.
    assert 'listen = "0.0.0.0:7070"' in effective, effective
    assert 'dir = "/var/lib/sbx"' in effective, effective


def test_container_commands(helm):
    objs = render(helm)
    api = sbxd_args(one(objs, "Deployment"))
    node = sbxd_args(one(objs, "DaemonSet"))
    for args in (api, node):
        assert args[0] == "sbxd"
        assert flag(args, "--config") == "/etc/sbx/sbxd.toml"
    assert flag(api, "--role") == "api"
    assert flag(api, "--store") == "$(SBX_STORE_URL)"
    assert flag(node, "--role") == "node"
    assert flag(node, "--node-name") == "$(NODE_NAME)"
    # A node registers in the same store, under the address the replicas dial: its pod's.
    assert flag(node, "--store") == "$(SBX_STORE_URL)"
    assert flag(node, "--node-url") == "http://$(POD_IP):7070"
    env = {e["name"]: e for e in one(objs, "DaemonSet")["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["SBX_STORE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    # Every variable an arg names is defined before use (the kubelet leaves others verbatim).
    names = [e["name"] for e in one(objs, "DaemonSet")["spec"]["template"]["spec"]
             ["containers"][0]["env"]]
    for a in node:
        for var in re.findall(r"\$\(([A-Z_]+)\)", a):
            assert var in names, f"{a}: ${var} is not in the container's env"
    # Another port, or an explicit URL (an IPv6 pod network's brackets).
    node = sbxd_args(one(render(helm, "service.port=8080"), "DaemonSet"))
    assert flag(node, "--node-url") == "http://$(POD_IP):8080"
    node = sbxd_args(one(render(helm, "node.url=http://[$(POD_IP)]:7070"), "DaemonSet"))
    assert flag(node, "--node-url") == "http://[$(POD_IP)]:7070"

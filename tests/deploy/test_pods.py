"""The chart's pods run (issue 21): the rendered api Deployment and node DaemonSet, started the way
a kubelet would start them, form a working cluster on a real PostgreSQL.

No Kubernetes here, so this test is the kubelet: each pod gets its own network namespace (a
bridge in a namespace of the test joins them, the "pod network", and the host reaches it through
one veth) and its own mount namespace with the pod's volumes mounted at their mountPaths; a
container's environment is exactly its rendered `env` (Secrets resolved from the rendered Secret
objects, `fieldRef`s from the pod), `$(VAR)` in its args is expanded as the kubelet does, init
containers run to completion first, and the readiness probe is polled at its rendered path and
port. Only `image` is replaced: the command is looked up in the build tree.

Asserted: the node's `sbx doctor` init container passes; both api replicas and the node become
ready; the node registers under its spec.nodeName with the URL built from its pod IP; a sandbox
created through one replica runs a command and moves a file through the other; after the test
every process is ended by PID and the namespaces, mounts and cgroups are gone.

Needs root, `ip`/`unshare`/`nsenter`, Debian's postgresql and a built sbxd (SBX_BUILD_DIR);
a missing one fails the test (tests/deploy never skips).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, cannot_run
from test_helm import by_kind, one, render

PG_SERVER = ROOT / "tools" / "pg_test_server.sh"
# A /24 the test's own namespaces hold; the host's end is .1.
SUBNET = "10.254.77"
NODE_NAME = "deploy-test-node"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return out


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, $$ escapes, the rest stays."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, arg)


def http(method: str, url: str, token: str | None = None, body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30.0):
    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(what: str, fn, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Kubelet:
    """Runs rendered pods on this host; remembers everything it made so that close() undoes it."""

    def __init__(self, objs: list[dict], bin_dir: pathlib.Path, scratch: pathlib.Path):
        self.objs = objs
        self.bin_dir = bin_dir
        self.scratch = scratch
        self.tag = secrets.token_hex(3)
        self.net = f"sbxdt-{self.tag}"  # the pod network's bridge lives here
        self.host_veth = f"sbxdt{self.tag}"
        self.namespaces: list[str] = []
        self.procs: list[tuple[str, subprocess.Popen, pathlib.Path]] = []
        self.made_dirs: list[pathlib.Path] = []
        self.next_ip = 2

    def start_network(self) -> None:
        sh("ip", "netns", "add", self.net)
        self.namespaces.append(self.net)
        sh("ip", "-n", self.net, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.net, "link", "set", "br0", "up")
        sh("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", "host",
           "netns", self.net)
        sh("ip", "-n", self.net, "link", "set", "host", "master", "br0", "up")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", self.host_veth)
        sh("ip", "link", "set", self.host_veth, "up")

    def secret(self, name: str, key: str) -> str:
        for s in by_kind(self.objs, "Secret"):
            if s["metadata"]["name"] == name:
                return base64.b64decode(s["data"][key]).decode()
        raise AssertionError(f"secretKeyRef to {name}/{key}, which the render does not hold")

    def env_of(self, container: dict, pod_ip: str, node_name: str) -> dict[str, str]:
        env = {"PATH": f"{self.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
                continue
            src = e["valueFrom"]
            if "secretKeyRef" in src:
                env[e["name"]] = self.secret(src["secretKeyRef"]["name"], src["secretKeyRef"]["key"])
            elif "fieldRef" in src:
                field = src["fieldRef"]["fieldPath"]
                known = {"spec.nodeName": node_name, "status.podIP": pod_ip}
                assert field in known, f"fieldRef {field}: this test's kubelet does not know it"
                env[e["name"]] = known[field]
            else:
                raise AssertionError(f"env {e['name']}: unsupported source {src}")
        return env

    def volume_sources(self, pod: dict, pod_dir: pathlib.Path) -> dict[str, pathlib.Path]:
        out = {}
        for v in pod.get("volumes", []):
            if "configMap" in v:
                (cm,) = [c for c in by_kind(self.objs, "ConfigMap")
                         if c["metadata"]["name"] == v["configMap"]["name"]]
                d = pod_dir / "volumes" / v["name"]
                d.mkdir(parents=True)
                for key, text in cm["data"].items():
                    (d / key).write_text(text)
                out[v["name"]] = d
            elif "emptyDir" in v:
                d = pod_dir / "volumes" / v["name"]
                d.mkdir(parents=True)
                out[v["name"]] = d
            elif "hostPath" in v:
                p = pathlib.Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") == "DirectoryOrCreate" and not p.exists():
                    p.mkdir(parents=True)
                out[v["name"]] = p
            else:
                raise AssertionError(f"volume {v['name']}: unsupported kind {v}")
        return out

    def mount_point(self, path: str) -> None:
        """A mountPath missing on this host is made for the test and removed after it."""
        p = pathlib.Path(path)
        if not p.exists():
            missing = [p] + [a for a in p.parents if not a.exists()]
            for d in reversed(missing):
                d.mkdir()
                self.made_dirs.append(d)

    def run(self, pod: dict, container: dict, sources: dict[str, pathlib.Path], netns: str,
            env: dict[str, str], log: pathlib.Path) -> subprocess.Popen:
        binds = []
        for m in container.get("volumeMounts", []):
            src = sources[m["name"]]
            if pathlib.Path(m["mountPath"]) == src:
                continue  # a hostPath at its own path: nothing to do
            self.mount_point(m["mountPath"])
            ro = ",ro" if m.get("readOnly") else ""
            binds.append(f"mount --bind {src} {m['mountPath']}" +
                         (f" && mount -o remount,bind{ro} {m['mountPath']}" if ro else ""))
        argv = [expand(a, env) for a in container["command"] + container.get("args", [])]
        argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        script = " && ".join(binds + ['exec "$@"']) if binds else 'exec "$@"'
        full = ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--mount",
                "--propagation", "private", "--", "sh", "-c", script, container["name"]] + argv
        return subprocess.Popen(full, env=env, stdin=subprocess.DEVNULL, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)

    def start_pod(self, kind: str, node_name: str) -> dict:
        pod = one(self.objs, kind)["spec"]["template"]["spec"]
        ip = f"{SUBNET}.{self.next_ip}"
        name = f"{kind.lower()}-{self.next_ip}"
        self.next_ip += 1
        netns = f"sbxdt-{self.tag}-{name}"
        sh("ip", "netns", "add", netns)
        self.namespaces.append(netns)
        sh("ip", "link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name",
           f"v{self.next_ip}", "netns", self.net)
        sh("ip", "-n", self.net, "link", "set", f"v{self.next_ip}", "master", "br0", "up")
        sh("ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        pod_dir = self.scratch / name
        pod_dir.mkdir()
        sources = self.volume_sources(pod, pod_dir)
        for init in pod.get("initContainers", []):
            env = self.env_of(init, ip, node_name)
            log = pod_dir / f"{init['name']}.log"
            p = self.run(pod, init, sources, netns, env, log)
            self.procs.append((f"{name}/{init['name']}", p, log))
            rc = p.wait(120)
            assert rc == 0, f"{name}: init container {init['name']} exited {rc}:\n{log.read_text()}"
        (c,) = pod["containers"]
        env = self.env_of(c, ip, node_name)
        log = pod_dir / f"{c['name']}.log"
        self.procs.append((f"{name}/{c['name']}", self.run(pod, c, sources, netns, env, log), log))
        probe = c["readinessProbe"]["httpGet"]
        port = {p["name"]: p["containerPort"] for p in c["ports"]}.get(probe["port"], probe["port"])
        return {"name": name, "ip": ip, "url": f"http://{ip}:{port}", "ready": probe["path"],
                "log": log, "proc": self.procs[-1][1]}

    def wait_ready(self, pod: dict) -> None:
        def ready():
            assert pod["proc"].poll() is None, \
                f"{pod['name']} exited {pod['proc'].returncode}:\n{pod['log'].read_text()[-4000:]}"
            try:
                return http("GET", pod["url"] + pod["ready"], timeout=2)[0] == 200
            except OSError:
                return False
        wait_for(f"{pod['name']} ready at {pod['url']}{pod['ready']}", ready)

    def close(self) -> list[str]:
        problems = []
        for name, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # the kubelet's stop: TERM, then KILL after grace
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    problems.append(f"{name} ignored SIGTERM for 60 s")
                    p.kill()
                    p.wait(10)
        for ns in reversed(self.namespaces):
            r = sh("ip", "netns", "del", ns, check=False)
            if r.returncode:
                problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
        sh("ip", "link", "del", self.host_veth, check=False)  # gone with its peer's namespace
        for d in reversed(self.made_dirs):
            try:
                d.rmdir()
            except OSError as e:
                problems.append(f"rmdir {d}: {e}")
        return problems


def remove_cgroup_parent(parent: str) -> list[str]:
    """The node's cgroup parent in every hierarchy. A sandbox cgroup still in it is a leak: it
    is reported, and its processes are killed and its cgroups removed all the same, so that a
    failed run leaves nothing behind either (sandboxes outlive their sbxd by design)."""
    problems = []
    roots = [pathlib.Path("/sys/fs/cgroup")] + [p for p in pathlib.Path("/sys/fs/cgroup").iterdir()
                                               if p.is_dir() and not p.is_symlink()]
    for root in roots:
        d = root / parent.lstrip("/")
        if not d.is_dir():
            continue
        left = [c.name for c in d.iterdir() if c.is_dir()]
        if left:
            problems.append(f"{d} still holds {left}")
        for _ in range(50):
            cgroups = sorted((c for c in d.rglob("*") if c.is_dir()), key=lambda c: -len(c.parts))
            pids = set()
            for c in cgroups + [d]:
                try:
                    pids |= {int(x) for x in (c / "cgroup.procs").read_text().split()}
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for c in cgroups + [d]:
                try:
                    c.rmdir()
                except OSError:
                    pass
            if not d.exists():
                break
            time.sleep(0.1)
        else:
            problems.append(f"could not remove {d}")
    return problems


@pytest.fixture
def prerequisites():
    if os.geteuid() != 0:
        cannot_run("the pods test needs root (namespaces, cgroups, the ns runtime)")
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if not shutil.which(tool):
            cannot_run(f"no {tool} on PATH")
    if not list(pathlib.Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        cannot_run("no PostgreSQL server (apt-get install postgresql)")
    bin_dir = pathlib.Path(os.environ.get("SBX_BUILD_DIR", ROOT / "build")) / "bin"
    for b in ("sbxd", "sbx", "sbx-agent"):
        if not os.access(bin_dir / b, os.X_OK):
            cannot_run(f"no {b} in {bin_dir}: build it or set SBX_BUILD_DIR")
    return bin_dir


def test_rendered_pods_form_a_cluster(helm, prerequisites):
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="sbx-pods-"))
    scratch.chmod(0o755)
    pg = scratch / "pg"
    sh("bash", str(PG_SERVER), "start", str(pg))
    token = secrets.token_urlsafe(24)
    cgroup_parent = f"/sbx-deploy-{secrets.token_hex(3)}"
    state = scratch / "node-state"
    kubelet = None
    problems: list[str] = []
    sid = None
    apis: list[dict] = []
    try:
        objs = render(helm, f"adminToken.value={token}",
                      f"database.url=postgresql:///postgres?host={pg}&user=sbx",
                      f"node.stateDir={state}", f"node.cgroupParent={cgroup_parent}")
        kubelet = Kubelet(objs, prerequisites, scratch)
        kubelet.start_network()
        node = kubelet.start_pod("DaemonSet", NODE_NAME)
        kubelet.wait_ready(node)
        replicas = one(objs, "Deployment")["spec"]["replicas"]
        apis = [kubelet.start_pod("Deployment", f"api-host-{i}") for i in range(replicas)]
        for a in apis:
            kubelet.wait_ready(a)
        def nodes_seen():
            code, body = http("GET", apis[0]["url"] + "/v1/admin/nodes", token)
            assert code == 200, body
            live = [n for n in json.loads(body)["nodes"] if n["state"] == "active" and n["alive"]]
            return live
        (seen,) = wait_for("the node registered and active", nodes_seen)
        assert seen["name"] == NODE_NAME
        assert seen["url"] == node["url"], seen

        first, second = apis[0]["url"], apis[-1]["url"]
        code, body = http("POST", first + "/v1/sandboxes", token, b"{}",
                          {"Content-Type": "application/json"})
        assert code == 202, body
        created = json.loads(body)
        sid, op = created["sandbox"]["id"], created["operation"]["id"]
        code, body = http("GET", f"{second}/v1/operations/{op}?wait_ms=20000", token)
        assert code == 200 and json.loads(body)["state"] == "succeeded", body
        code, body = http("GET", f"{second}/v1/sandboxes/{sid}", token)
        assert code == 200 and json.loads(body)["node"] == NODE_NAME, body

        payload = secrets.token_bytes(1 << 20)
        code, body = http("PUT", f"{first}/v1/sandboxes/{sid}/files?path=/tmp/blob", token,
                          payload, {"Content-Type": "application/octet-stream"})
        assert code in (200, 201), body
        code, got = http("GET", f"{second}/v1/sandboxes/{sid}/files?path=/tmp/blob", token)
        assert code == 200 and got == payload, f"{code}: {len(got)} bytes back"

        code, body = http("POST", f"{second}/v1/sandboxes/{sid}/sessions", token,
                          json.dumps({"argv": ["sh", "-c", "echo from-$(hostname); exit 3"]}).encode(),
                          {"Content-Type": "application/json"})
        assert code == 201, body
        session = json.loads(body)
        code, stream = http("GET", f"{first}/v1/sessions/{session['session_id']}/attach", token,
                            headers={"Accept": "text/event-stream"})
        assert code == 200, stream
        out, exit_code = b"", None
        for block in stream.decode().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if fields.get("event") == "stdout":
                out += base64.b64decode(json.loads(fields["data"])["data_b64"])
            elif fields.get("event") == "process_exited":
                exit_code = json.loads(fields["data"])["exit_code"]
        assert out.startswith(b"from-") and exit_code == 3, (out, exit_code, stream[-2000:])

        code, body = http("DELETE", f"{second}/v1/sandboxes/{sid}", token)
        assert code == 202, body
        op = json.loads(body)["operation"]["id"]
        code, body = http("GET", f"{first}/v1/operations/{op}?wait_ms=20000", token)
        assert code == 200 and json.loads(body)["state"] == "succeeded", body
        sid = None
    finally:
        if sid is not None and apis:  # a failure above: the sandbox goes before its node stops
            try:
                code, body = http("DELETE", f"{apis[0]['url']}/v1/sandboxes/{sid}", token)
                if code == 202:
                    op = json.loads(body)["operation"]["id"]
                    http("GET", f"{apis[0]['url']}/v1/operations/{op}?wait_ms=20000", token)
            except OSError as e:
                problems.append(f"delete {sid} after the failure: {e}")
        if kubelet is not None:
            problems += kubelet.close()
        problems += remove_cgroup_parent(cgroup_parent)
        sh("bash", str(PG_SERVER), "stop", str(pg), check=False)
        leftover = sh("findmnt", "-rn", "-o", "TARGET", check=False).stdout
        problems += [f"mount left: {m}" for m in leftover.splitlines() if str(scratch) in m]
        shutil.rmtree(scratch, ignore_errors=True)
    assert not problems, problems

"""One machine as a cluster (docs/scale.md, issue 21): two api replicas (`--role api`) and three
nodes (`--role node`, each with its own state directory, cgroup parent and network namespace) on
one PostgreSQL, Debian's, started for this module on a unix socket by tools/pg_test_server.sh.
The nodes' namespaces hang on a bridge in a namespace of this module, which the host reaches
through one veth (10.254.78.1/24): the replicas dial each node at its own address, as across
hosts, never through loopback.

Asserted: creates spread over the nodes; a session made through one replica is attached through
the other with the same bytes; a draining node gets no new sandbox; `kill -9` of a node makes
its sandboxes `lost` (with the reason), fails its operations and sends new creates elsewhere;
restarted, it destroys what it held of them and rejoins; `kill -9` of an api replica in the
middle of a create leaves exactly one sandbox for the create's Idempotency-Key. Every process is
ended by PID and every sandbox deleted; no cgroup of a sandbox is left under a node's parent."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from conftest import REPO, RUNTIME, Daemon, skip_or_fail
from sbx_client import SbxClient, SseStream

SERVER = REPO / "tools" / "pg_test_server.sh"
HEARTBEAT_MS = 200
LOST_AFTER_MS = 1500
NODES = ("node-a", "node-b", "node-c")


def cgroup_parent(name: str, tag: str) -> str:
    return f"/sbx-e2e-{tag}-{name}"


def cgroup_dirs(parent: str) -> list[Path]:
    """Sandbox cgroups under `parent` in every hierarchy this host mounts."""
    out = []
    for root in Path("/sys/fs/cgroup").iterdir():
        d = root / parent.lstrip("/") if root.is_dir() else None
        if d is not None and d.is_dir():
            out += [p for p in d.iterdir() if p.is_dir() and p.name.startswith("sbx_")]
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        d = Path("/sys/fs/cgroup") / parent.lstrip("/")
        if d.is_dir():
            out += [p for p in d.iterdir() if p.is_dir() and p.name.startswith("sbx_")]
    return out


def remove_parent(parent: str) -> list[str]:
    """The node's (empty) cgroup parent in every hierarchy; sbxd makes it and leaves it. The
    cgroup sets a node killed on purpose still had pooled (`pool-<tag>-N`, never a sandbox's:
    the next start of that node would sweep them) go first."""
    problems = []
    roots = [Path("/sys/fs/cgroup")] + [p for p in Path("/sys/fs/cgroup").iterdir()
                                       if p.is_dir() and not p.is_symlink()]
    for root in roots:
        d = root / parent.lstrip("/")
        if d.is_dir():
            try:
                for pooled in d.glob("pool-*"):
                    if (pooled / "work").is_dir():
                        (pooled / "work").rmdir()
                    pooled.rmdir()
                d.rmdir()
            except OSError as e:
                problems.append(f"rmdir {d}: {e}")
    return problems


SUBNET = "10.254.78"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode:
        raise AssertionError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


class NodeNetwork:
    """A network namespace per node on one bridge; the host is .1 on it."""

    def __init__(self, tag: str):
        self.tag = tag
        self.bridge_ns = f"sbxc-{tag}"
        self.host_veth = f"sbxc{tag}"
        self.namespaces: list[str] = []
        self.addresses: dict[str, str] = {}

    def start(self) -> None:
        ip("netns", "add", self.bridge_ns)
        self.namespaces.append(self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        ip("link", "add", self.host_veth, "type", "veth", "peer", "name", "host", "netns",
           self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "set", "host", "master", "br0", "up")
        ip("addr", "add", f"{SUBNET}.1/24", "dev", self.host_veth)
        ip("link", "set", self.host_veth, "up")

    def add(self, name: str) -> str:
        """The namespace of node `name` (made once; a restarted node gets it back)."""
        if name in self.addresses:
            return self.addresses[name]
        ns = f"sbxc-{self.tag}-{name}"
        addr = f"{SUBNET}.{10 + len(self.addresses)}"
        port = f"p{len(self.addresses)}"
        ip("netns", "add", ns)
        self.namespaces.append(ns)
        ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns",
           self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        self.addresses[name] = addr
        return addr

    def prefix(self, name: str) -> list[str]:
        # nsenter, not `ip netns exec`: that one also mounts a fresh /sys, hiding the cgroups.
        return ["nsenter", f"--net=/run/netns/sbxc-{self.tag}-{name}"]

    def close(self) -> list[str]:
        problems = []
        for ns in reversed(self.namespaces):
            r = ip("netns", "del", ns, check=False)
            if r.returncode:
                problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
        ip("link", "del", self.host_veth, check=False)  # went with its peer's namespace
        return problems


class Cluster:
    def __init__(self, url: str, validator):
        self.url = url
        self.validator = validator
        self.token = secrets.token_urlsafe(32)
        self.tag = secrets.token_hex(3)
        self.net = NodeNetwork(self.tag)
        self.nodes: dict[str, Daemon] = {}
        self.apis: list[Daemon] = []
        self.all: list[Daemon] = []

    def common(self) -> list[str]:
        return ["--store", self.url, "--node-heartbeat-ms", str(HEARTBEAT_MS),
                "--node-lost-after-ms", str(LOST_AFTER_MS)]

    def start_node(self, name: str, state: Daemon | None = None) -> Daemon:
        addr = self.net.add(name)
        d = Daemon(["--role", "node", "--node-name", name,
                    "--cgroup-parent", cgroup_parent(name, self.tag)] + self.common(),
                   listen=f"{addr}:0", prefix=self.net.prefix(name))
        d.token = self.token
        if state is not None:  # the same node again: its state dir, its log
            d.tmp, d.state_dir, d.log_path = state.tmp, state.state_dir, state.log_path
        d.start()
        self.nodes[name] = d
        self.all.append(d)
        return d

    def start_api(self) -> Daemon:
        d = Daemon(["--role", "api"] + self.common())
        d.token = self.token
        d.start()
        self.apis.append(d)
        self.all.append(d)
        return d

    def client(self, d: Daemon) -> SbxClient:
        return SbxClient(d.url, self.token, self.validator)

    def ensure_nodes_running(self) -> None:
        """Every node up again (a test that killed one failed before restarting it), so that
        the cleanup's deletes reach every sandbox's node."""
        for name, d in list(self.nodes.items()):
            if d.proc is None or d.proc.poll() is not None:
                self.start_node(name, state=d)

    def kill(self, d: Daemon) -> None:
        if d.proc is not None and d.proc.poll() is None:
            os.kill(d.proc.pid, signal.SIGKILL)
            d.proc.wait(10)
        if d._reader:
            d._reader.join(5)


def wait_for(what: str, fn, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


@pytest.fixture(scope="module")
def cluster(validator):
    if RUNTIME != "fake" and os.geteuid() != 0:
        skip_or_fail("the ns runtime needs root (or set SBX_E2E_RUNTIME=fake)")
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        skip_or_fail("no PostgreSQL server (apt-get install postgresql)")
    parent = Path(tempfile.mkdtemp(prefix="sbx-pgc-"))
    parent.chmod(0o755)
    host = parent / "pg"
    subprocess.run(["bash", str(SERVER), "start", str(host)], check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    c = None
    try:
        name = "sbxcluster_" + secrets.token_hex(4)
        psql = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql")) or [Path("/usr/bin/psql")]
        subprocess.run([str(psql[-1]), f"postgresql:///postgres?host={host}&user=sbx", "-qc",
                        f"CREATE DATABASE {name}"], check=True, timeout=60)
        c = Cluster(f"postgresql:///{name}?host={host}&user=sbx", validator)
        c.net.start()
        for n in NODES:
            c.start_node(n)
        c.start_api()
        c.start_api()
        api = c.client(c.apis[0])
        wait_for("three active nodes", lambda: len([
            n for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]
            if n["state"] == "active" and n["alive"]]) == 3)
        # Each node is dialled at its own namespace's address, the one it listens on.
        urls = {n["name"]: n["url"] for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]}
        assert urls == {n: d.url for n, d in c.nodes.items()}, urls
        assert all(u.startswith(f"http://{SUBNET}.") for u in urls.values()), urls
        yield c
    finally:
        problems = []
        if c is not None:
            # Every sandbox still there goes, through a live replica, before the nodes stop.
            live = [d for d in c.apis if d.proc and d.proc.poll() is None]
            try:
                c.ensure_nodes_running()
            except Exception as e:  # noqa: BLE001 - reported below, the rest still runs
                problems.append(f"restart a node for the cleanup: {e}")
            if live:
                api = c.client(live[0])
                for sb in api.list_sandboxes(limit=200):
                    if sb["state"] != "deleted":
                        r = api.call("DELETE", f"/v1/sandboxes/{sb['id']}", validate=False)
                        if r.status_code not in (200, 202, 404, 410):
                            problems.append(f"delete {sb['id']}: {r.status_code}")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and any(
                        s["state"] != "deleted" for s in api.list_sandboxes(limit=200)):
                    time.sleep(0.2)
            for d in c.all:
                rc = d.stop()
                if rc not in (0, -15, -9, None):
                    problems.append(f"sbxd {d.extra_args[:4]} exited with {rc}")
            for n in NODES:
                left = cgroup_dirs(cgroup_parent(n, c.tag))
                if left:
                    problems.append(f"{n} left cgroups: {[str(p) for p in left]}")
                else:
                    problems += remove_parent(cgroup_parent(n, c.tag))
            problems += c.net.close()
        subprocess.run(["bash", str(SERVER), "stop", str(host)], timeout=120)
        subprocess.run(["rm", "-rf", str(parent)], timeout=60)
        assert not problems, problems


def test_creates_spread_over_the_nodes_and_any_replica_attaches(cluster):
    a1, a2 = cluster.client(cluster.apis[0]), cluster.client(cluster.apis[1])
    made = [a1.create_sandbox({"labels": {"case": "spread"}})["sandbox"] for _ in range(6)]
    nodes = [a2.get_sandbox(sb["id"])["node"] for sb in made]
    assert set(nodes) == set(NODES) and max(nodes.count(n) for n in NODES) <= 3, nodes
    # A session made and run through one replica; its output read again through the other.
    out = a1.run(made[0]["id"], ["sh", "-c", "for i in 1 2 3; do echo line $i; done; echo err >&2"])
    assert out.stdout == b"line 1\nline 2\nline 3\n" and out.exit["exit_code"] == 0
    again = a2.collect(a2.attach(out.session["session_id"], last_event_id=0), first_id=1)
    assert again.stdout == out.stdout and again.stderr == out.stderr == b"err\n"
    assert again.exit["exit_code"] == 0
    # Sessions made and streamed by one request (?attach=true) through a replica, on each
    # node; the session each names is read again through the other replica.
    for node in NODES:
        sb = made[nodes.index(node)]
        resp = a1.call("POST", f"/v1/sandboxes/{sb['id']}/sessions", json_body={"argv": ["echo", sb["id"]]},
                       params={"attach": "true"}, stream=True, timeout=60, expect=200)
        ses = resp.headers["Sbx-Session-Id"]
        one = a1.collect(SseStream(resp, a1.validator), first_id=1)
        assert one.stdout == (sb["id"] + "\n").encode() and one.exit["exit_code"] == 0, one
        assert a2.get_session(ses)["state"] == "exited"
        # The node answers an ended session in one write and the replica relays it as one:
        # the client's first read holds the header, the events and the body's end.
        parts = urllib.parse.urlsplit(a2.base_url)
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
            s.sendall((f"GET /v1/sessions/{ses}/attach HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                       f"Authorization: Bearer {a2.token}\r\n\r\n").encode())
            first = s.recv(1 << 16)
        assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"\r\n0\r\n\r\n"), first
        assert b"event: stdout" in first and b"process_exited" in first, first
    # Files through either replica.
    sid = made[1]["id"]
    a1.call("PUT", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/x.txt"},
            data=b"through replica one", expect=(200, 201, 204))
    got = a2.call("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/x.txt"},
                  expect=200, validate=False)
    assert got.content == b"through replica one"
    for sb in made:
        a2.delete_sandbox(sb["id"])


def test_a_draining_node_gets_no_new_sandbox(cluster):
    api = cluster.client(cluster.apis[0])
    api.call("POST", "/v1/admin/nodes/node-b/drain", expect=200)
    try:
        made = [api.create_sandbox({"labels": {"case": "drain"}})["sandbox"] for _ in range(4)]
        assert all(api.get_sandbox(sb["id"])["node"] != "node-b" for sb in made)
        listed = {n["name"]: n for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]}
        assert listed["node-b"]["state"] == "draining"
        for sb in made:
            api.delete_sandbox(sb["id"])
    finally:
        api.call("POST", "/v1/admin/nodes/node-b/activate", expect=200)
    missing = api.call("POST", "/v1/admin/nodes/no-such-node/drain", validate=False)
    assert missing.status_code == 404, missing.text


def test_anti_affinity_keeps_a_group_apart(cluster):
    """The group's count comes before every other preference (warm pool, template, fill),
    read from the store at each create, so through either replica."""
    a1, a2 = cluster.client(cluster.apis[0]), cluster.client(cluster.apis[1])
    made: list[str] = []

    def create(client, body) -> str:
        sid = client.create_sandbox(body)["sandbox"]["id"]
        made.append(sid)
        return client.get_sandbox(sid)["node"]

    group = {"job": "aa-1"}
    spread = {"labels": group, "placement": {"anti_affinity": "job"}}
    try:
        for n in ("node-b", "node-c"):
            a1.call("POST", f"/v1/admin/nodes/{n}/drain", expect=200)
        try:
            assert create(a1, {"labels": group}) == "node-a"
        finally:
            for n in ("node-b", "node-c"):
                a1.call("POST", f"/v1/admin/nodes/{n}/activate", expect=200)
        # node-a holds one of the group: the next two go to the two others, one each. (Through
        # the replica that activated them: the other one's node view may be 500 ms old.)
        first = create(a1, spread)
        second = create(a1, spread)
        assert sorted([first, second]) == ["node-b", "node-c"], (first, second)
        # One each everywhere: any node, through the other replica; then, counted in the store
        # and not in a replica's memory, not that node again.
        third = create(a2, spread)
        fourth = create(a1, spread)
        assert third in NODES and fourth != third, (third, fourth)
        # The key must be one of the create's labels.
        bad = a1.call("POST", "/v1/sandboxes", json_body={"labels": group,
                      "placement": {"anti_affinity": "team"}}, validate=False)
        assert bad.status_code == 400 and "placement.anti_affinity" in bad.text, bad.text
    finally:
        for sid in made:
            a2.delete_sandbox(sid)


def oci_layout_tar(work: Path, name: str, layers: list[bytes]) -> tuple[Path, dict]:
    import images
    layout = work / f"{name}-layout"
    info = images.write_layout(layout, layers, env=["PATH=/bin"], gzip_layers=(1,))
    out = work / f"{name}.tar"
    with tarfile.open(out, "w") as t:
        for p in sorted(layout.rglob("*")):
            if p.is_file():
                t.add(p, arcname=str(p.relative_to(layout)))
    return out, info


def holders(api: SbxClient, ref: str) -> set[str]:
    nodes = api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]
    return {n["name"] for n in nodes if ref in n.get("capacity", {}).get("templates", [])}


def test_a_template_made_on_one_node_runs_on_every_node_and_follows_its_tag(cluster, tmp_path):
    """Templates (docs/scale.md): the catalogue is in the store, the layers on the node that
    imported them. Another node fetches them from it at its first create (verified against
    their diff_ids), and a tag moved on one node is what every node creates from next."""
    import images
    a1, a2 = cluster.client(cluster.apis[0]), cluster.client(cluster.apis[1])
    base = images.busybox_layer().bytes()
    top = images.Layer().dir("app").file("app/hello.txt", "first\n").bytes()
    archive, info = oci_layout_tar(tmp_path, "one", [base, top])
    made: list[str] = []

    def stored(n: str) -> set[str]:
        d = cluster.nodes[n].state_dir / "templates/store/layers/sha256"
        return {"sha256:" + p.name for p in d.iterdir()} if d.is_dir() else set()

    def refused(node: str, ref: str) -> dict:
        """A create of `ref` on `node` (the others drained), which must fail."""
        others = [n for n in NODES if n != node]
        for n in others:
            a1.call("POST", f"/v1/admin/nodes/{n}/drain", expect=200)
        try:
            r = a1.call("POST", "/v1/sandboxes", json_body={"template": ref}, validate=False)
        finally:
            for n in others:
                a1.call("POST", f"/v1/admin/nodes/{n}/activate", expect=200)
        assert 400 <= r.status_code < 500, (ref, r.status_code, r.text)
        return r.json()["error"]

    def on(node: str, ref: str) -> tuple[str, str]:
        """A sandbox of `ref` on `node` (the other nodes drained meanwhile), and what it reads."""
        others = [n for n in NODES if n != node]
        for n in others:
            a1.call("POST", f"/v1/admin/nodes/{n}/drain", expect=200)
        try:
            sid = a1.create_sandbox({"template": ref})["sandbox"]["id"]
        finally:
            for n in others:
                a1.call("POST", f"/v1/admin/nodes/{n}/activate", expect=200)
        made.append(sid)
        assert a1.get_sandbox(sid)["node"] == node
        r = a2.run(sid, ["cat", "/app/hello.txt"])
        assert r.exit and r.exit["exit_code"] == 0, (r.stdout, r.stderr, r.exit)
        return sid, r.stdout.decode()

    try:
        op = a1.call("POST", "/v1/templates:import", params={"name": "clu", "tag": "v1"},
                     data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                     expect=202).body
        assert a1.wait_operation(op["operation"]["id"], timeout=120)["state"] == "succeeded"
        first = wait_for("a node reporting clu:v1", lambda: holders(a1, "clu:v1"))
        assert len(first) == 1, first
        holder = next(iter(first))
        # The holder gives its layers as they were imported (the gzip one compressed), to the
        # admin token only.
        direct = SbxClient(cluster.nodes[holder].url, cluster.token, cluster.validator)
        got = direct.call("GET", f"/v1/admin/layers/{info['diff_ids'][0]}", expect=200,
                          validate=False)
        assert images.sha256(got.content) == info["diff_ids"][0]
        bad = direct.call("GET", "/v1/admin/layers/sha256:nothex", validate=False)  # not the pattern
        assert bad.status_code == 400, bad.text
        absent = direct.call("GET", "/v1/admin/layers/sha256:" + "0" * 64)
        assert absent.status_code == 404, absent.text
        anon = SbxClient(cluster.nodes[holder].url, "not-a-token", cluster.validator)
        assert anon.call("GET", f"/v1/admin/layers/{info['diff_ids'][0]}",
                         validate=False).status_code == 401
        # A tenant's token, even with every scope, reads no layer (they hold every tenant's
        # templates); nor does a path that is not a diff_id reach the file system.
        ten = a1.call("POST", "/v1/admin/tenants", json_body={"name": "layers-" + cluster.tag},
                      expect=201).body["tenant"]["id"]
        try:
            tok = a1.call("POST", f"/v1/admin/tenants/{ten}/tokens",
                          json_body={"name": "t", "scopes": ["admin"]}, expect=201).body["token"]
            tenant = SbxClient(cluster.nodes[holder].url, tok["token"], cluster.validator)
            r = tenant.call("GET", f"/v1/admin/layers/{info['diff_ids'][0]}", validate=False)
            assert r.status_code == 403, r.text
        finally:
            a1.call("DELETE", f"/v1/admin/tenants/{ten}", validate=False)
        for odd in ("sha256:..%2F..%2Fetc%2Fpasswd", "..", "sha256:" + "A" * 64):
            r = direct.call("GET", f"/v1/admin/layers/{odd}", validate=False)
            assert r.status_code in (400, 404), (odd, r.status_code, r.text)
        # A digest the store does not have, or one of another name: not found, and nothing is
        # fetched for it.
        elsewhere = next(n for n in NODES if n != holder)
        for ref in ("clu@sha256:" + "0" * 64, "other@" + info["manifest_digest"]):
            assert refused(elsewhere, ref)["code"] == "template_not_found", ref
        assert not stored(elsewhere) & set(info["diff_ids"])
        # Every node runs it: the two others fetch it from the holder at their first create.
        for n in NODES:
            assert on(n, "clu:v1")[1] == "first\n", n
        wait_for("every node reporting clu:v1", lambda: holders(a1, "clu:v1") == set(NODES))
        # The tag moves, imported wherever the replica sends it: every node creates from the
        # new release next, and fetches it if the import ran elsewhere.
        top2 = images.Layer().dir("app").file("app/hello.txt", "second\n").bytes()
        archive2, info2 = oci_layout_tar(tmp_path, "two", [base, top2])
        op = a2.call("POST", "/v1/templates:import", params={"name": "clu", "tag": "v1"},
                     data=archive2.read_bytes(), headers={"Content-Type": "application/x-tar"},
                     expect=202).body
        assert a2.wait_operation(op["operation"]["id"], timeout=120)["state"] == "succeeded"
        for n in NODES:
            assert on(n, "clu:v1")[1] == "second\n", n
        # The sandboxes of the first release keep it.
        r = a1.run(made[0], ["cat", "/app/hello.txt"])
        assert r.stdout == b"first\n"
        for sid in made:
            a2.delete_sandbox(sid)
        made.clear()
        # A tag added, then removed, through a replica (on whichever node), with no create of
        # it anywhere: every node, holding its release, reports it from its next tag sync
        # (heartbeat, at most every 10 s), and stops reporting it after the removal.
        a2.call("PUT", "/v1/templates/clu:v2", json_body={"from": "clu:v1"}, expect=200)
        wait_for("every node reporting clu:v2", lambda: holders(a1, "clu:v2") == set(NODES))
        a1.call("DELETE", "/v1/templates/clu:v2", expect=200)
        wait_for("no node reporting clu:v2", lambda: not holders(a1, "clu:v2"))
        assert holders(a1, "clu:v1") == set(NODES)
        # Removed through one replica (on whichever node): no node creates from it any more,
        # though each still held it in memory.
        a2.call("DELETE", "/v1/templates/clu", expect=200)
        for n in NODES:
            assert refused(n, "clu:v1")["code"] == "template_not_found", n
        wait_for("no node reporting clu:v1", lambda: not holders(a1, "clu:v1"))
        # One gc, through a replica to whichever node: every node's layer store lets go of them.
        ours = set(info["diff_ids"]) | set(info2["diff_ids"])
        assert all(stored(n) & ours for n in NODES)
        gc = a2.call("POST", "/v1/templates:gc", expect=200).body
        assert set(gc["nodes"]) == set(NODES) and not any("error" in v for v in gc["nodes"].values()), gc
        assert gc["layers_removed"] == sum(v["layers_removed"] for v in gc["nodes"].values()) >= 3 * 2
        assert not any(stored(n) & ours for n in NODES), {n: stored(n) & ours for n in NODES}
        bad = a2.call("POST", "/v1/templates:gc", params={"scope": "all"}, validate=False)
        assert bad.status_code == 400, bad.text
    finally:
        for sid in made:
            a2.delete_sandbox(sid)
        a1.call("DELETE", "/v1/templates/clu", validate=False)


def test_a_killed_node_loses_its_sandboxes_and_comes_back_clean(cluster):
    api = cluster.client(cluster.apis[1])
    made = [api.create_sandbox({"labels": {"case": "loss"}})["sandbox"] for _ in range(2)]
    # Two more certainly on node-c: the others are drained meanwhile.
    for n in ("node-a", "node-b"):
        api.call("POST", f"/v1/admin/nodes/{n}/drain", expect=200)
    try:
        made += [api.create_sandbox({"labels": {"case": "loss"}})["sandbox"] for _ in range(2)]
    finally:
        for n in ("node-a", "node-b"):
            api.call("POST", f"/v1/admin/nodes/{n}/activate", expect=200)
    on_c = [sb["id"] for sb in made if api.get_sandbox(sb["id"])["node"] == "node-c"]
    assert len(on_c) >= 2, on_c
    # An operation in flight on node-c when it dies: its session's sandbox is paused meanwhile.
    victim = cluster.nodes["node-c"]
    cgroups_before = cgroup_dirs(cgroup_parent("node-c", cluster.tag))
    assert cgroups_before
    cluster.kill(victim)

    def lost():
        states = [api.get_sandbox(i) for i in on_c]
        return states if all(s["state"] == "lost" for s in states) else None
    states = wait_for("node-c's sandboxes lost", lost, timeout=LOST_AFTER_MS / 1000 * 4 + 10)
    assert all(s["error"]["code"] == "node_lost" for s in states), states
    nodes = {n["name"]: n for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]}
    assert nodes["node-c"]["state"] == "lost" and not nodes["node-c"]["alive"]
    # A lost sandbox refuses work with a clear state, and new creates land elsewhere.
    r = api.call("POST", f"/v1/sandboxes/{on_c[0]}/pause", validate=False)
    assert r.status_code == 409, r.text
    fresh = [api.create_sandbox({"labels": {"case": "loss"}})["sandbox"] for _ in range(3)]
    assert all(api.get_sandbox(sb["id"])["node"] != "node-c" for sb in fresh)
    # One lost sandbox is deleted while its node is away; the others stay lost.
    api.delete_sandbox(on_c[0])
    assert api.get_sandbox(on_c[0])["state"] == "deleted"

    # Back, on the same state: it destroys what the store no longer gives it and rejoins.
    cluster.start_node("node-c", state=victim)
    wait_for("node-c active again", lambda: any(
        n["name"] == "node-c" and n["state"] == "active" and n["alive"]
        for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]))
    wait_for("node-c's old cgroups gone",
             lambda: not set(p.name for p in cgroup_dirs(cgroup_parent("node-c", cluster.tag)))
             & set(on_c))
    assert all(api.get_sandbox(i)["state"] == "lost" for i in on_c[1:])
    for sb in made + fresh:
        if api.get_sandbox(sb["id"])["state"] != "deleted":
            api.delete_sandbox(sb["id"])


def test_a_node_restarted_on_purpose_keeps_its_sandboxes_and_every_byte(cluster):
    """A rolling restart (docs/scale.md): SIGTERM writes the node's restart deadline, so it
    stays away longer than node.lost_after_ms without being declared lost, while nothing new is
    placed on it; back, it has its sandbox, and a session that wrote while it was away is read
    whole through the other replica."""
    a1, a2 = cluster.client(cluster.apis[0]), cluster.client(cluster.apis[1])
    made: list[str] = []
    for n in ("node-a", "node-b"):
        a1.call("POST", f"/v1/admin/nodes/{n}/drain", expect=200)
    try:
        sid = a1.create_sandbox({"labels": {"case": "restart"}})["sandbox"]["id"]
        made.append(sid)
    finally:
        for n in ("node-a", "node-b"):
            a1.call("POST", f"/v1/admin/nodes/{n}/activate", expect=200)
    assert a1.get_sandbox(sid)["node"] == "node-c"
    session = a1.create_session(sid, ["sh", "-c",
                                      "for i in $(seq 1 60); do echo line $i; sleep 0.05; done"])
    with a1.attach(session) as stream:
        for ev in stream.events():
            if ev.event == "stdout":
                break  # running: the rest is written while the node is away
    old = cluster.nodes["node-c"]
    epoch = {n["name"]: n for n in a1.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]}["node-c"]["epoch"]
    assert old.stop() in (0, -15)

    def row():
        return {n["name"]: n for n in a2.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]}["node-c"]

    try:
        # Silent for longer than node.lost_after_ms, yet not lost: it said when it is back.
        away = wait_for("node-c silent past lost_after",
                        lambda: (r := row())["heartbeat_age_ms"] > LOST_AFTER_MS + 500 and r)
        assert away["state"] == "active" and away["restart_by"], away
        assert a2.get_sandbox(sid)["state"] == "running"
        for _ in range(3):
            other = a2.create_sandbox({"labels": {"case": "restart"}})["sandbox"]["id"]
            made.append(other)
            assert a2.get_sandbox(other)["node"] != "node-c"
        # Requests about its sandbox are the node's: 502 node_unreachable while it is away.
        r = a2.call("POST", f"/v1/sandboxes/{sid}/sessions", json_body={"argv": ["true"]},
                    validate=False)
        assert r.status_code == 502 and r.json()["error"]["code"] == "node_unreachable", r.text
    finally:
        cluster.start_node("node-c", state=old)
    back = wait_for("node-c back", lambda: (r := row())["alive"] and r["restart_by"] is None and r)
    assert back["epoch"] == epoch + 1 and back["state"] == "active", back
    assert a2.get_sandbox(sid)["state"] == "running"
    whole = a2.collect(a2.attach(session["session_id"], last_event_id=0), first_id=1)
    assert whole.stdout == b"".join(b"line %d\n" % i for i in range(1, 61)), whole.stdout[-200:]
    assert whole.exit["exit_code"] == 0
    for s in made:
        a1.delete_sandbox(s)


def test_an_api_replica_killed_mid_create_leaves_exactly_one_sandbox(cluster):
    key = "cluster-kill-" + secrets.token_hex(4)
    doomed = cluster.start_api()
    d_client = cluster.client(doomed)
    errors = []

    def create():
        try:
            d_client.create_sandbox({"labels": {"case": "api-kill", "key": key}},
                                    idempotency_key=key, wait=False)
        except Exception as e:  # the replica dies under it: any error is fine here
            errors.append(e)
    t = threading.Thread(target=create)
    t.start()
    time.sleep(0.005)
    cluster.kill(doomed)
    cluster.apis.remove(doomed)
    t.join(30)
    # The client retries through the other replica with the same key.
    api = cluster.client(cluster.apis[0])
    again = api.create_sandbox({"labels": {"case": "api-kill", "key": key}}, idempotency_key=key,
                               wait=True)
    same = [sb for sb in api.list_sandboxes(label=f"key={key}") if sb["state"] != "deleted"]
    assert [sb["id"] for sb in same] == [again["sandbox"]["id"]], same
    out = api.run(again["sandbox"]["id"], ["echo", "one"])
    assert out.stdout == b"one\n"
    api.delete_sandbox(again["sandbox"]["id"])


def test_chaos_kills_of_nodes_and_replicas_lose_no_output_and_leave_nothing_stuck(cluster):
    """Clients create, exec, pause, wake and delete through random replicas while a node or a
    replica is killed (-9) every few seconds and started again: a node restarted within
    node.lost_after_ms keeps its sandboxes (a rolling restart), one that stays away longer
    loses them. At the end: every exec that reported an exit had its exact output, no
    Idempotency-Key made two sandboxes, no sandbox is stuck in an operation, and (in the
    fixture) no node left a cgroup behind."""
    import random
    rng = random.Random(21)
    deadline = time.monotonic() + 25
    stop = threading.Event()
    lock = threading.Lock()
    stats = {"cycles": 0, "execs": 0, "errors": 0, "kills": 0}
    bad_output: list[str] = []
    keys: list[str] = []

    def replica() -> SbxClient:
        with lock:
            live = [d for d in cluster.apis if d.proc and d.proc.poll() is None]
        return cluster.client(rng.choice(live))

    def attempt(fn, tries: int = 6):
        last = None
        for _ in range(tries):
            try:
                return fn(replica())
            except Exception as e:  # noqa: BLE001 - a killed process: try another replica
                last = e
                with lock:
                    stats["errors"] += 1
                time.sleep(0.3)
        raise last

    def worker(w: int):
        n = 0
        while not stop.is_set():
            n += 1
            key = f"chaos-{w}-{n}-{secrets.token_hex(3)}"
            with lock:
                keys.append(key)
            try:
                sb = attempt(lambda c: c.create_sandbox({"labels": {"case": "chaos", "key": key}},
                                                        idempotency_key=key))["sandbox"]
                for i in range(2):
                    word = f"{key}-{i}"
                    out = attempt(lambda c: c.run(sb["id"], ["echo", word], max_seconds=30))
                    if out.exit is not None and out.stdout != (word + "\n").encode():
                        bad_output.append(f"{sb['id']}: {out.stdout!r} != {word!r}")
                    with lock:
                        stats["execs"] += 1
                attempt(lambda c: c.call("POST", f"/v1/sandboxes/{sb['id']}/pause",
                                         expect=(200, 202)))
                attempt(lambda c: c.call("POST", f"/v1/sandboxes/{sb['id']}/wake",
                                         expect=(200, 202, 409)))
                attempt(lambda c: c.delete_sandbox(sb["id"]))
                with lock:
                    stats["cycles"] += 1
            except Exception:  # noqa: BLE001 - the sandbox's node was lost: checked below
                with lock:
                    stats["errors"] += 1

    def chaos():
        while time.monotonic() < deadline - 5:
            time.sleep(rng.uniform(2.0, 3.5))
            kind = rng.choice(["node", "node", "api"])
            if kind == "api":
                with lock:
                    victim = rng.choice([d for d in cluster.apis if d.proc.poll() is None])
                cluster.kill(victim)
                with lock:
                    cluster.apis.remove(victim)
                    stats["kills"] += 1
                with lock:
                    cluster.apis.append(cluster.start_api())
            else:
                name = rng.choice(NODES)
                victim = cluster.nodes[name]
                cluster.kill(victim)
                with lock:
                    stats["kills"] += 1
                # Back at once (its sandboxes survive) or after the lease (they are lost).
                time.sleep(rng.choice([0.1, LOST_AFTER_MS / 1000 + 1.0]))
                cluster.start_node(name, state=victim)
        stop.set()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=chaos))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a chaos thread did not finish"
    cluster.ensure_nodes_running()
    api = cluster.client(next(d for d in cluster.apis if d.proc.poll() is None))
    wait_for("every node alive", lambda: all(
        n["alive"] for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]), 30)
    assert stats["kills"] >= 3 and stats["cycles"] >= 3, stats
    assert not bad_output, bad_output

    busy: list[dict] = []

    def settled():
        sbs = [s for s in api.list_sandboxes(label="case=chaos") if s["state"] != "deleted"]
        busy[:] = [{"id": s["id"], "node": s["node"], "state": s["state"],
                    "op": s["current_operation_id"] and api.get_operation(s["current_operation_id"])}
                   for s in sbs if s["current_operation_id"] or s["state"] in ("creating", "deleting")]
        return None if busy else {"left": sbs}  # a dict: an empty list would read as "not yet"
    try:
        left = wait_for("no chaos sandbox in an operation", settled, timeout=60, every=0.5)["left"]
    except AssertionError:
        raise AssertionError(f"stuck: {busy}") from None
    by_key: dict[str, int] = {}
    for s in (api.list_sandboxes(label="case=chaos")
              + api.list_sandboxes(label="case=chaos", state="deleted")):
        by_key[s["labels"]["key"]] = by_key.get(s["labels"]["key"], 0) + 1
    assert all(n == 1 for n in by_key.values()), {k: n for k, n in by_key.items() if n > 1}
    for s in left:  # what is left (lost, or a cycle cut short) goes now
        api.delete_sandbox(s["id"])

"""One machine as a cluster (docs/scale.md, issue 21): two api replicas (`--role api`) and three
nodes (`--role node`, each with its own state directory and cgroup parent) on one PostgreSQL,
Debian's, started for this module on a unix socket by tools/pg_test_server.sh.

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
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, RUNTIME, Daemon, skip_or_fail
from sbx_client import SbxClient

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


class Cluster:
    def __init__(self, url: str, validator):
        self.url = url
        self.validator = validator
        self.token = secrets.token_urlsafe(32)
        self.tag = secrets.token_hex(3)
        self.nodes: dict[str, Daemon] = {}
        self.apis: list[Daemon] = []
        self.all: list[Daemon] = []

    def common(self) -> list[str]:
        return ["--store", self.url, "--node-heartbeat-ms", str(HEARTBEAT_MS),
                "--node-lost-after-ms", str(LOST_AFTER_MS)]

    def start_node(self, name: str, state: Daemon | None = None) -> Daemon:
        d = Daemon(["--role", "node", "--node-name", name,
                    "--cgroup-parent", cgroup_parent(name, self.tag)] + self.common())
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
        for n in NODES:
            c.start_node(n)
        c.start_api()
        c.start_api()
        api = c.client(c.apis[0])
        wait_for("three active nodes", lambda: len([
            n for n in api.call("GET", "/v1/admin/nodes", expect=200).body["nodes"]
            if n["state"] == "active" and n["alive"]]) == 3)
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


def test_a_killed_node_loses_its_sandboxes_and_comes_back_clean(cluster):
    api = cluster.client(cluster.apis[1])
    made = []
    for _ in range(6):
        made.append(api.create_sandbox({"labels": {"case": "loss"}})["sandbox"])
    on_c = [sb["id"] for sb in made if api.get_sandbox(sb["id"])["node"] == "node-c"]
    assert on_c, "placement put nothing on node-c"
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

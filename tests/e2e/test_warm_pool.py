"""The warm pool (sbxd's default --warm-pool base=2): creates with the default resources are
served by a sandbox built in advance, which is handed out once, belongs to nobody before that,
and behaves like any other sandbox afterwards."""

import concurrent.futures
import time

import pytest

import hostcheck
from conftest import not_applicable_on_fake_runtime

POOL_REFILL_TIMEOUT_S = 30


def create_warm(api, body=None):
    """Creates until one create is served from the pool (it refills in the background)."""
    deadline = time.monotonic() + POOL_REFILL_TIMEOUT_S
    while True:
        created = api.create_sandbox(dict(body or {}), wait=False)
        if created["operation"]["result"] == {"warm_pool": True}:
            return created
        api.wait_operation(created["operation"]["id"])
        if time.monotonic() > deadline:
            pytest.fail(f"no create was served by the warm pool within {POOL_REFILL_TIMEOUT_S}s")
        time.sleep(0.5)


@pytest.fixture
def ns_only(sbxd):
    not_applicable_on_fake_runtime("host objects are checked on the ns runtime only")


def test_warm_create_is_running_in_the_202_and_works(api, sbxd):
    created = create_warm(api, {"env": {"FROM_SANDBOX": "yes", "BOTH": "sandbox"}, "labels": {"k": "v"}})
    sb, op = created["sandbox"], created["operation"]
    assert sb["state"] == "running" and sb["current_operation_id"] is None, sb
    assert op["state"] == "succeeded" and op["completed_at"] is not None, op
    assert sb["labels"] == {"k": "v"} and sb["env"] == {"FROM_SANDBOX": "yes", "BOTH": "sandbox"}, sb
    assert api.get_operation(op["id"]) == op
    # The sandbox's env reaches its sessions although the sandbox was started before it was known;
    # a session's own env wins.
    r = api.run(sb["id"], ["sh", "-c", "echo $FROM_SANDBOX $BOTH $HOSTNAME"], env={"BOTH": "session"})
    assert r.exit["exit_code"] == 0, r.exit
    expected = ["yes", "session"] + ([sb["id"][:16]] if sbxd.runtime != "fake" else [])
    assert r.stdout.decode().split() == expected, r.stdout


def test_non_default_resources_are_built_cold(api):
    created = api.create_sandbox({"resources": {"memory_mib": 256}}, wait=False)
    assert created["operation"]["result"] is None, created["operation"]
    op = api.wait_operation(created["operation"]["id"])
    assert op["state"] == "succeeded" and op["result"] is None, op
    assert api.get_sandbox(created["sandbox"]["id"])["effective_resources"]["memory_mib"] == 256


def test_pooled_sandboxes_are_invisible_until_handed_out(api, sbxd):
    # Let the pool fill, then nothing but what this tenant created is listed.
    create_warm(api)
    time.sleep(1)
    listed = {s["id"] for s in api.list_sandboxes()}
    assert listed >= set(api.created_sandboxes)
    if sbxd.runtime == "fake":
        return  # the fake runtime keeps no per-sandbox directory to find pooled ones by
    pooled_dirs = {p.name for p in (sbxd.state_dir / "sandboxes").iterdir()} - listed
    pooled_dirs -= {s["id"] for s in api.list_sandboxes(state="deleted")}
    assert pooled_dirs, "the pool should hold built sandboxes that are not listed"
    for pid in pooled_dirs:
        resp = api.call("GET", f"/v1/sandboxes/{pid}", expect=404)
        assert resp.body["error"]["code"] == "not_found"


def test_concurrent_creates_never_share_a_sandbox(api, sbxd):
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda _: api.create_sandbox({}), range(8)))
    ids = [r["sandbox"]["id"] for r in results]
    assert len(set(ids)) == 8, ids
    if sbxd.runtime == "fake":
        return  # no filesystem isolation to check
    # Each sandbox has its own root: a file written in one is not seen in another.
    api.run(ids[0], ["sh", "-c", "echo mine > /tmp/owner"])
    for sid in ids[1:]:
        r = api.run(sid, ["sh", "-c", "cat /tmp/owner 2>/dev/null || echo none"])
        assert r.stdout == b"none\n", (sid, r.stdout)


def test_warm_sandbox_is_fully_removed_by_delete(api, sbxd, ns_only):
    sid = create_warm(api)["sandbox"]["id"]
    assert hostcheck.leftovers(sid, sbxd.state_dir).get("cgroups"), "no cgroup found for the warm sandbox"
    op = api.delete_sandbox(sid)
    assert op["state"] == "succeeded", op
    left = hostcheck.leftovers_after_delete(sid, sbxd.state_dir)
    assert not left, left


def test_idempotent_replay_of_a_warm_create(api):
    # The replay takes a pooled sandbox before it knows it is a replay, then puts it back.
    key = "warm-replay-1"
    first = api.call("POST", "/v1/sandboxes", json_body={"labels": {"idem": "w"}},
                     headers={"Idempotency-Key": key}, expect=202).body
    api.created_sandboxes.append(first["sandbox"]["id"])
    again = api.call("POST", "/v1/sandboxes", json_body={"labels": {"idem": "w"}},
                     headers={"Idempotency-Key": key}, expect=202).body
    assert again["sandbox"]["id"] == first["sandbox"]["id"]
    assert again["operation"]["id"] == first["operation"]["id"]


@pytest.mark.parametrize("flag, message", [
    ("nope=2", "template 'nope' not found"),
    ("base=x", "expected TEMPLATE=N"),
    ("base=257", "expected TEMPLATE=N"),
])
def test_bad_warm_pool_flag_stops_sbxd_before_it_starts(tmp_path, flag, message):
    import subprocess
    from conftest import build_dir
    r = subprocess.run([str(build_dir() / "bin" / "sbxd"), "--listen", "127.0.0.1:0",
                        "--state-dir", str(tmp_path / "state"), "--admin-token", "t",
                        "--warm-pool", flag], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr and f"--warm-pool '{flag}'" in r.stderr, r.stderr
    assert "listening" not in r.stdout


def _pool_ready(api) -> float:
    text = api.call("GET", "/metrics", validate=False, expect=200).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("sbx_warm_pool_ready{"))


def _wait_pool(api, n, what):
    deadline = time.monotonic() + POOL_REFILL_TIMEOUT_S
    while _pool_ready(api) != n:
        assert time.monotonic() < deadline, f"the pool did not reach {n} ({what})"
        time.sleep(0.2)


def test_pool_members_never_become_user_sandboxes_across_a_kill_9(restartable):
    """Unclaimed pool members exist only in sbxd's memory: after a crash (SIGKILL) the next
    sbxd destroys them (they are in no store row) and builds its own pool; no tenant ever sees
    them, and nothing of them is left on the host."""
    from conftest import _reap_adopted_orphans

    api = restartable.start()  # the default pool: base=2
    restartable.track(api)
    _wait_pool(api, 2, "first sbxd")
    d = restartable.daemon
    sandboxes_dir = d.state_dir / "sandboxes"
    pooled = {p.name for p in sandboxes_dir.iterdir()}
    assert len(pooled) == 2, pooled
    api = restartable.restart(kill=True)
    restartable.track(api)

    listed = api.list_sandboxes()
    assert listed == [], f"the crashed sbxd's pool members are listed: {listed}"
    for sid in pooled:
        assert api.call("GET", f"/v1/sandboxes/{sid}", expect=404).body["error"]["code"] == "not_found"
    _wait_pool(api, 2, "after the restart")
    # The pool serves creates as before: running in the 202.
    created = api.create_sandbox({}, wait=False)
    assert created["operation"]["result"] == {"warm_pool": True}, created["operation"]
    assert created["sandbox"]["id"] not in pooled
    assert [s["id"] for s in api.list_sandboxes()] == [created["sandbox"]["id"]]

    # Nothing of the old members is left: their agents were killed and reaped, their cgroups,
    # mounts and directories removed; the state dir holds the new pool (refilled) and ours.
    _reap_adopted_orphans(sorted(pooled), {restartable.daemon.proc.pid})
    for sid in pooled:
        assert not hostcheck.leftovers(sid, d.state_dir), (sid, hostcheck.leftovers(sid, d.state_dir))
    _wait_pool(api, 2, "refill after the create")
    now = {p.name for p in sandboxes_dir.iterdir()}
    assert len(now) == 3 and not (now & pooled), (now, pooled)

    # Again while the pool is refilling (a member half-built): only the user's sandbox stays.
    mine = created["sandbox"]["id"]
    second = api.create_sandbox({}, wait=False)["sandbox"]["id"]
    pooled = {p.name for p in sandboxes_dir.iterdir()} - {mine, second}
    api = restartable.restart(kill=True)
    restartable.track(api)
    assert sorted(s["id"] for s in api.list_sandboxes()) == sorted([mine, second])
    assert api.get_sandbox(mine)["state"] == "running"
    _reap_adopted_orphans(sorted(pooled), {restartable.daemon.proc.pid})
    for sid in pooled:
        assert not hostcheck.leftovers(sid, d.state_dir), (sid, hostcheck.leftovers(sid, d.state_dir))
    _wait_pool(api, 2, "after the second restart")
    assert len(list(sandboxes_dir.iterdir())) == 4
    for sid in (mine, second):
        assert api.delete_sandbox(sid)["state"] == "succeeded"

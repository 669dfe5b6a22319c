"""Admission control (docs/config.md, "[admission]"): a create is admitted only when its vcpu,
memory and disk fit in host x overcommit - reserve beside what the other sandboxes and the warm
pool hold; 503 insufficient_capacity (or 422 exceeds_capacity) naming the resource otherwise."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import time

import pytest

from conftest import Daemon, shutdown
from sbx_client import SbxClient

MIB = 1 << 20
RELOAD_TIMEOUT_S = 10


def metric(client, name: str) -> float | None:
    text = client.call("GET", "/metrics", validate=False, expect=200).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def create(client, body, expect):
    resp = client.call("POST", "/v1/sandboxes", json_body=body, expect=expect)
    if resp.status_code == 202:
        client.created_sandboxes.append(resp.body["sandbox"]["id"])
    return resp


def assert_refusal(resp, code: str, resource: str):
    err = resp.body["error"]
    assert err["code"] == code, err
    assert err["details"]["resource"] == resource, err
    assert f"{resource}:" in err["message"], err
    assert err["details"]["requested"] > err["details"]["available"] or code == "exceeds_capacity", err
    if code == "insufficient_capacity":
        assert resp.status_code == 503 and resp.headers.get("Retry-After", "").isdigit(), resp.headers
    else:
        assert resp.status_code == 422 and "Retry-After" not in resp.headers, resp.headers


class Small:
    """An sbxd of its own whose [admission] table a test rewrites and reloads (SIGHUP)."""

    def __init__(self, validator, flags: list[str]):
        self.validator = validator
        self.conf = None
        self.daemon = Daemon(flags)
        self.conf = self.daemon.tmp / "sbxd.toml"
        self.conf.write_text("")
        self.daemon.extra_args += ["--config", str(self.conf)]
        self.daemon.start()
        self.api = SbxClient(self.daemon.url, self.daemon.token, validator)

    def reload(self, table: dict, until):
        lines = ["[admission]"] + [f"{k} = {v}" for k, v in table.items()]
        self.conf.write_text("\n".join(lines) + "\n")
        os.kill(self.daemon.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while not until():
            assert time.monotonic() < deadline, f"reload not applied: {self.daemon.log_tail(20)}"
            time.sleep(0.1)

    def close(self) -> list[str]:
        ids = list(self.api.created_sandboxes)
        problems = []
        ops = []
        for sid in ids:
            resp = self.api.call("DELETE", f"/v1/sandboxes/{sid}", validate=False)
            if resp.status_code == 202:
                ops.append(resp.body["operation"]["id"])
        for op in ops:
            if self.api.wait_operation(op, timeout=60)["state"] != "succeeded":
                problems.append(f"delete {op} failed")
        self.api.close()
        return problems + shutdown(self.daemon, self.validator, ids)


@pytest.fixture
def small(sbxd, validator):
    # sbxd: the session's checks (root for ns) have passed. No warm pool: its members would
    # hold capacity too (test_pool_members_hold_capacity covers that).
    made = []

    def start(flags=None):
        s = Small(validator, ["--warm-pool", "base=0", "--max-memory-mib", "4194304"] + (flags or []))
        made.append(s)
        return s

    yield start
    problems = []
    for s in made:
        problems += s.close()
    if problems:
        pytest.fail("; ".join(problems))


def test_the_findings_request_is_refused_naming_the_resource(api):
    # The attack battery's request, against the session's sbxd with the default settings.
    before = {s["id"] for s in api.list_sandboxes()}
    resp = api.call("POST", "/v1/sandboxes",
                    json_body={"resources": {"memory_mib": 65536, "vcpu": 64, "disk_mib": 1048576}},
                    expect=(422, 503))
    err = resp.body["error"]
    assert err["code"] in ("exceeds_capacity", "insufficient_capacity"), err
    assert err["details"]["resource"] in ("memory", "vcpu", "disk"), err
    assert err["details"]["field"].startswith("resources."), err
    with open("/proc/meminfo") as f:
        total_mib = int(re.search(r"^MemTotal:\s+(\d+)", f.read(), re.M).group(1)) // 1024
    if total_mib < 65536 + 1024:
        # This host cannot ever give 64 GiB to one sandbox: a retry would not help.
        assert_refusal(resp, "exceeds_capacity", "memory")
    assert {s["id"] for s in api.list_sandboxes()} == before, "a refused create left a sandbox"


def test_fill_up_gets_503_naming_memory_and_a_delete_admits_the_next(small):
    s = small()
    host_mib = metric(s.api, "sbx_capacity_memory_bytes") // MIB + 1024  # the default reserve
    # Room for exactly 4 sandboxes of 256 MiB.
    s.reload({"reserve_memory_mib": int(host_mib - 4 * 256)},
             until=lambda: metric(s.api, "sbx_capacity_memory_bytes") == 4 * 256 * MIB)
    body = {"resources": {"memory_mib": 256}}
    ids = [s.api.create_sandbox(body)["sandbox"]["id"] for _ in range(4)]
    assert metric(s.api, "sbx_reserved_memory_bytes") == 4 * 256 * MIB
    refused = create(s.api, body, 503)
    assert_refusal(refused, "insufficient_capacity", "memory")
    assert refused.body["error"]["details"]["available"] == 0
    assert refused.body["error"]["details"]["capacity"] == 1024
    # Nothing was recorded for it; a smaller one does not fit either; a larger one never will.
    assert len([x for x in s.api.list_sandboxes() if x["state"] != "deleted"]) == 4
    create(s.api, {"resources": {"memory_mib": 32}}, 503)
    assert_refusal(create(s.api, {"resources": {"memory_mib": 2048}}, 422), "exceeds_capacity", "memory")

    s.api.delete_sandbox(ids.pop(0))
    assert metric(s.api, "sbx_reserved_memory_bytes") == 3 * 256 * MIB
    ids.append(s.api.create_sandbox(body)["sandbox"]["id"])
    create(s.api, body, 503)
    # A paused sandbox keeps its memory: pausing one makes no room.
    s.api.wait_operation(s.api.call("POST", f"/v1/sandboxes/{ids[0]}/pause", expect=202).body["operation"]["id"])
    create(s.api, body, 503)


def test_concurrent_creates_never_overshoot(small):
    s = small()
    host_mib = metric(s.api, "sbx_capacity_memory_bytes") // MIB + 1024
    s.reload({"reserve_memory_mib": int(host_mib - 3 * 256)},
             until=lambda: metric(s.api, "sbx_capacity_memory_bytes") == 3 * 256 * MIB)

    def one(_):
        c = s.api.clone()
        try:
            return create(c, {"resources": {"memory_mib": 256}}, (202, 503))
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(10) as ex:
        responses = list(ex.map(one, range(10)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [202] * 3 + [503] * 7, codes
    for r in responses:
        if r.status_code == 503:
            assert_refusal(r, "insufficient_capacity", "memory")
        else:
            assert s.api.wait_operation(r.body["operation"]["id"])["state"] == "succeeded"
    assert metric(s.api, "sbx_reserved_memory_bytes") == 3 * 256 * MIB
    assert len([x for x in s.api.list_sandboxes() if x["state"] != "deleted"]) == 3


def test_disk_is_checked_against_the_state_dirs_free_space(small):
    s = small()
    st = os.statvfs(s.daemon.state_dir)
    free_mib = st.f_bavail * st.f_frsize // MIB
    # 1 TiB on a host with less free: the sparse image would have been a promise never kept.
    if free_mib < (1 << 20) + 2048:
        resp = create(s.api, {"resources": {"memory_mib": 64, "disk_mib": 1 << 20}}, 422)
        assert_refusal(resp, "exceeds_capacity", "disk")
    # Keep all but ~3 GiB of the free space for the host: one 2 GiB disk fits, a second does not
    # (other writers on this file system may move the free space by a few hundred MiB).
    s.reload({"reserve_disk_mib": max(0, free_mib - 3072)},
             until=lambda: metric(s.api, "sbx_capacity_disk_bytes") < 4096 * MIB)
    first = s.api.create_sandbox({"resources": {"memory_mib": 64, "disk_mib": 2048}})
    assert first["sandbox"]["effective_resources"]["disk_mib"] == 2048
    resp = create(s.api, {"resources": {"memory_mib": 64, "disk_mib": 2048}}, 503)
    assert_refusal(resp, "insufficient_capacity", "disk")
    assert metric(s.api, "sbx_reserved_disk_bytes") == 2048 * MIB
    # Off: admitted (the ledger still counts it).
    s.reload({"reserve_disk_mib": max(0, free_mib - 3072), "enabled": "false"},
             until=lambda: create(s.api, {"resources": {"memory_mib": 64, "disk_mib": 2048}},
                                  (202, 503)).status_code == 202)
    assert metric(s.api, "sbx_reserved_disk_bytes") == 4096 * MIB


def test_pool_members_hold_capacity_and_the_pool_waits_for_room(small):
    s = small(["--warm-pool", "base=2", "--default-memory-mib", "256"])
    deadline = time.monotonic() + 60
    while metric(s.api, 'sbx_warm_pool_ready{runtime="%s",template="base",egress="none"}' % s.daemon.runtime) != 2:
        assert time.monotonic() < deadline, "the pool never filled"
        time.sleep(0.2)
    assert metric(s.api, "sbx_reserved_memory_bytes") == 2 * 256 * MIB
    host_mib = metric(s.api, "sbx_capacity_memory_bytes") // MIB + 1024
    # Room for the two pool members and one more.
    s.reload({"reserve_memory_mib": int(host_mib - 3 * 256)},
             until=lambda: metric(s.api, "sbx_capacity_memory_bytes") == 3 * 256 * MIB)
    cold = s.api.create_sandbox({"resources": {"memory_mib": 256, "vcpu": 2}})  # not the pool's size
    assert_refusal(create(s.api, {"resources": {"memory_mib": 256, "vcpu": 2}}, 503),
                   "insufficient_capacity", "memory")
    # Served by a pool member, which already holds its memory; the refill has no room and waits.
    warm = create(s.api, {}, 202).body
    assert warm["operation"]["result"] == {"warm_pool": True}, warm["operation"]
    time.sleep(2)
    assert metric(s.api, 'sbx_warm_pool_ready{runtime="%s",template="base",egress="none"}' % s.daemon.runtime) == 1
    assert metric(s.api, "sbx_reserved_memory_bytes") == 3 * 256 * MIB
    # A delete gives the room back, and the pool takes it.
    s.api.delete_sandbox(cold["sandbox"]["id"])
    deadline = time.monotonic() + 30
    while metric(s.api, 'sbx_warm_pool_ready{runtime="%s",template="base",egress="none"}' % s.daemon.runtime) != 2:
        assert time.monotonic() < deadline, "the pool did not refill after the delete"
        time.sleep(0.2)
    assert "waiting for capacity" in s.daemon.log_path.read_text()

"""After DELETE, nothing of the sandbox remains on the host."""

import base64
import os
import time

import pytest

import hostcheck
from conftest import not_applicable_on_fake_runtime


def test_nothing_left_on_host_after_delete(api, sbxd):
    not_applicable_on_fake_runtime("the fake runtime creates no kernel objects")
    sb = api.create_sandbox({"labels": {"e2e": "cleanup"}})["sandbox"]
    sid = sb["id"]
    # A process tree that would outlive a careless delete: a background child, a session still
    # running, and an exited session.
    api.run(sid, ["sh", "-c", "echo done"])
    session = api.create_session(sid, ["sh", "-c", "sleep 1000 & sleep 1000 & echo started; wait"])
    stream = api.attach(session)
    first = next(stream.events())
    assert first.event == "stdout" and base64.b64decode(first.data["data_b64"]) == b"started\n", first
    stream.close()

    # `sh` has forked both children before it echoes, but a child may not have reached exec
    # yet (it then still shows as `sh -c ...`): give them a moment on a loaded machine.
    deadline = time.monotonic() + 10
    while True:
        before = hostcheck.leftovers(sid, sbxd.state_dir)
        sleepers = [p for p in before.get("processes", []) if p["cmdline"] == "sleep 1000"]
        if len(sleepers) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # The check below is only meaningful if the sandbox's objects can be found by its id.
    assert before.get("processes"), f"no host process is in a cgroup named after {sid}: {before}"
    assert before.get("cgroups"), f"no cgroup directory named after {sid}"
    assert len(sleepers) == 2, f"expected the two sleep processes in the sandbox's cgroup: {before['processes']}"

    op = api.delete_sandbox(sid)
    assert op["state"] == "succeeded", op
    after = hostcheck.leftovers_after_delete(sid, sbxd.state_dir)
    if after:
        time.sleep(3)
        later = hostcheck.leftovers(sid, sbxd.state_dir)
        pytest.fail(f"left on the host after the delete operation succeeded: {after}\n"
                    f"still there 3 s later: {later or 'nothing'}")
    for p in sleepers:
        assert not os.path.exists(f"/proc/{p['pid']}"), f"sandbox process {p} survived the delete"

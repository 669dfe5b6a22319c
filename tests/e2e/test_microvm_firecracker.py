"""The microvm runtime's Firecracker driver (docs/microvm.md, "Firecracker").

Firecracker is not in Debian and needs KVM that runs stock guests, which the project's machines
lack (research/feasibility.md rows 8a-8d). So:
  - the refusal cases run everywhere: a host without Firecracker (or without such KVM) keeps
    sbxd up, and GET /v1/runtimes and every microvm create say why;
  - the lifecycle case runs where SBX_FIRECRACKER names a directory holding `firecracker` and
    `jailer` (a release's binaries, renamed) on a KVM host, and is reported as not run
    elsewhere (tools/test.sh prints the row).
"""

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from conftest import Daemon, not_run_without_optional_component, ns_runtime_only, shutdown
from sbx_client import SbxClient

pytestmark = ns_runtime_only("sbxd on the fake runtime offers no microvm")

FIRECRACKER_DIR = os.environ.get("SBX_FIRECRACKER", "")


def firecracker_flags(directory: str) -> list[str]:
    return ["--microvm-vmm", "firecracker", "--microvm-firecracker", f"{directory}/firecracker",
            "--microvm-jailer", f"{directory}/jailer"]


def test_a_host_without_firecracker_says_why_and_serves_the_rest(validator, sbxd, tmp_path):
    # A directory that has no Firecracker: sbxd starts on ns, microvm is unavailable with the
    # reason, and a create asking for it is 501 with the same reason before anything is made.
    d = Daemon(firecracker_flags(str(tmp_path / "no-firecracker")))
    d.start()
    api = SbxClient(d.url, d.token, validator)
    try:
        mv = next(r for r in api.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
        assert mv["available"] is False, mv
        assert "Firecracker" in mv["reason"] and "runtime.microvm.firecracker" in mv["reason"], mv
        resp = api.call("POST", "/v1/sandboxes", json_body={"runtime": "microvm"}, expect=501)
        assert resp.body["error"]["code"] == "not_implemented", resp.body
        assert "Firecracker" in resp.body["error"]["message"], resp.body
        assert api.list_sandboxes() == []
        sb = api.create_sandbox({})["sandbox"]  # the default runtime is unaffected
        assert api.run(sb["id"], ["true"]).exit["exit_code"] == 0
        api.delete_sandbox(sb["id"])
    finally:
        ids = list(api.created_sandboxes)
        api.close()
        problems = shutdown(d, validator, ids)
    assert not problems, problems


def test_firecracker_without_kvm_for_stock_guests_is_unavailable(validator, sbxd, tmp_path):
    """Binaries present (stand-ins here: Firecracker is not run), but this host's KVM cannot
    boot a stock kernel: Firecracker has no emulator to fall back on, and the reason says so."""
    runtimes = SbxClient(sbxd.url, sbxd.token, validator).call("GET", "/v1/runtimes").body["runtimes"]
    mv = next(r for r in runtimes if r["name"] == "microvm")
    if mv["available"] and mv["details"].get("accel") == "kvm":
        not_run_without_optional_component("this host's KVM runs stock guests: the refusal does not apply")
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("firecracker", "jailer"):
        (fake / name).write_text("#!/bin/sh\nexit 1\n")
        (fake / name).chmod(0o755)
    d = Daemon(firecracker_flags(str(fake)))
    d.start()
    api = SbxClient(d.url, d.token, validator)
    try:
        mv = next(r for r in api.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
        assert mv["available"] is False, mv
        assert "Firecracker needs KVM" in mv["reason"], mv
    finally:
        api.close()
        problems = shutdown(d, validator, [])
    assert not problems, problems


def fc_processes(jailer_id: str) -> list[int]:
    needle = b"--id\0" + jailer_id.encode() + b"\0"
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def test_with_firecracker_a_vm_boots_runs_suspends_wakes_and_leaves_nothing(validator, tmp_path):
    if not FIRECRACKER_DIR:
        not_run_without_optional_component(
            "no Firecracker here (SBX_FIRECRACKER=<dir with firecracker and jailer> runs it on a KVM host)")
    import images
    from test_microvm import read_counter

    d = Daemon(firecracker_flags(FIRECRACKER_DIR))
    d.start()
    api = SbxClient(d.url, d.token, validator)
    try:
        mv = next(r for r in api.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
        assert mv["available"], f"SBX_FIRECRACKER is set but microvm is unavailable: {mv['reason']}"
        assert mv["details"]["vmm"] == "firecracker", mv
        layout = tmp_path / "layout"
        images.write_layout(layout, [images.busybox_layer().bytes()], env=["PATH=/bin"])
        archive = images.oci_archive(layout, tmp_path / "bb.tar")
        resp = api.call("POST", "/v1/templates:import", params={"name": "fcbb", "tag": "latest"},
                        data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"}, expect=202)
        assert api.wait_operation(resp.body["operation"]["id"], timeout=120)["state"] == "succeeded"
        # base binds host directories (9p), which Firecracker does not have: refused with why.
        resp = api.call("POST", "/v1/sandboxes", json_body={"runtime": "microvm"}, expect=202)
        op = api.wait_operation(resp.body["operation"]["id"], timeout=120)
        assert op["state"] == "failed" and "no 9p" in str(op["error"]), op

        sb = api.create_sandbox({"runtime": "microvm", "template": "fcbb:latest",
                                 "resources": {"memory_mib": 256}}, timeout=120)["sandbox"]
        sid = sb["id"]
        jailer_id = sid.replace("_", "-")
        assert len(fc_processes(jailer_id)) == 1, "one Firecracker process for the VM"
        r = api.run(sid, ["sh", "-c", "echo hello; cat /proc/cmdline"])
        assert r.exit["exit_code"] == 0 and r.stdout.startswith(b"hello\n"), r
        assert b"sbx.disks=order" in r.stdout, r.stdout
        api.call("PUT", f"/v1/sandboxes/{sid}/files", params={"path": "/root/in.txt"}, data=b"data", expect=200)
        assert api.call("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/root/in.txt"},
                        expect=200).content == b"data"

        api.create_session(sid, ["sh", "-c", "i=0; while :; do i=$((i+1)); echo $$ $i > /tmp/c; sleep 0.2; done"])
        pid, before = read_counter(api, sid)
        op = api.call("POST", f"/v1/sandboxes/{sid}/pause", expect=202).body["operation"]
        assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded"
        op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
        assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded"
        op = api.call("POST", f"/v1/sandboxes/{sid}/suspend", expect=202).body["operation"]
        done = api.wait_operation(op["id"], timeout=300)
        assert done["state"] == "succeeded" and done["result"]["memory_released"] is True, done
        assert fc_processes(jailer_id) == [], "Firecracker still runs while suspended"
        assert (d.state_dir / "vm" / sid / "state").is_file() and (d.state_dir / "vm" / sid / "state.mem").is_file()
        # sbxd dies meanwhile; the next one wakes it.
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(30)
        d2 = Daemon(firecracker_flags(FIRECRACKER_DIR))
        shutil.rmtree(d2.tmp, ignore_errors=True)
        d2.tmp, d2.state_dir, d2.log_path, d2.token = d.tmp, d.state_dir, d.log_path, d.token
        d2.start()
        api.close()
        d = d2
        api = SbxClient(d.url, d.token, validator)
        api.created_sandboxes.append(sid)
        op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
        assert api.wait_operation(op["id"], timeout=300)["state"] == "succeeded"
        pid2, after = read_counter(api, sid)
        time.sleep(1)
        assert pid2 == pid and read_counter(api, sid)[1] > after >= before, (pid, pid2, before, after)
        assert api.delete_sandbox(sid)["state"] == "succeeded"
        assert fc_processes(jailer_id) == [] and not (d.state_dir / "vm" / sid).exists()
    finally:
        ids = list(api.created_sandboxes)
        api.close()
        problems = shutdown(d, validator, ids)
    assert not problems, problems

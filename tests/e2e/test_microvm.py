"""The microvm runtime: a QEMU microVM per sandbox, behind the same API (docs/microvm.md).

Under TCG (these machines: research/feasibility.md, row 8c) a boot takes seconds, so the cases
are few and each does several things with one VM.
"""

import base64
import hashlib
import os
import time
from pathlib import Path

import pytest

import images
from hostcheck import vm_processes
from conftest import ns_runtime_only, skip_or_fail

pytestmark = ns_runtime_only("sbxd on the fake runtime offers no microvm")

MICROVM = {"runtime": "microvm", "resources": {"memory_mib": 256}}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.fixture
def microvm_available(api):
    runtimes = api.call("GET", "/v1/runtimes").body["runtimes"]
    mv = next(r for r in runtimes if r["name"] == "microvm")
    if not mv["available"]:
        skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
    return mv


def test_create_exec_files_pause_delete_leave_nothing(api, sbxd, microvm_available, metrics):
    t0 = time.monotonic()
    sb = api.create_sandbox(MICROVM, timeout=300)["sandbox"]
    boot = time.monotonic() - t0
    sid = sb["id"]
    assert sb["runtime"] == "microvm", sb
    procs = vm_processes(sbxd.state_dir, sid)
    assert len(procs) == 2, f"QEMU and its bridge, got {procs}"

    # The VMM's jail (docs/isolation.md §8): its own uid, no network, a root of its own files.
    qemu = next(p for p in procs if b"qemu" in Path(f"/proc/{p}/cmdline").read_bytes())
    status = Path(f"/proc/{qemu}/status").read_text()
    uids = next(l for l in status.splitlines() if l.startswith("Uid:")).split()[1:]
    assert all(int(u) >= 0x80000 for u in uids), status
    assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status, status
    for ns in ("net", "mnt", "ipc"):
        assert os.readlink(f"/proc/{qemu}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    # The console log a guest can write without end is bounded: no file QEMU writes may outgrow
    # the larger of its disk and its memory (+64 MiB), and SIGXFSZ is ignored (EFBIG, no kill).
    res = {k: sb["resources"].get(k) or microvm_available["defaults"][k] for k in ("disk_mib", "memory_mib")}
    cap = (max(res["disk_mib"], res["memory_mib"]) + 64) << 20
    limits = Path(f"/proc/{qemu}/limits").read_text()
    fsize = next(l for l in limits.splitlines() if l.startswith("Max file size")).split()[3:5]
    assert fsize == [str(cap), str(cap)], limits
    sig_ign = int(next(l for l in status.splitlines() if l.startswith("SigIgn:")).split()[1], 16)
    assert sig_ign & (1 << (25 - 1)), status  # SIGXFSZ
    cgroups = Path(f"/proc/{qemu}/cgroup").read_text()
    assert f"/sbx-vm/{sid}" in cgroups, cgroups
    # The bridge, the first host process to parse what the guest sends, is confined once its
    # sockets are open: the VMM's uid, no capabilities, not dumpable, no network, an empty root.
    bridge = next(p for p in procs if p != qemu)
    bstatus = Path(f"/proc/{bridge}/status").read_text()
    buids = next(l for l in bstatus.splitlines() if l.startswith("Uid:")).split()[1:]
    assert buids == uids, (bstatus, status)
    assert next(l for l in bstatus.splitlines() if l.startswith("Groups:")).split()[1:] == [], bstatus
    assert "NoNewPrivs:\t1" in bstatus and "CapEff:\t0000000000000000" in bstatus, bstatus
    assert "CapPrm:\t0000000000000000" in bstatus, bstatus
    for ns in ("net", "ipc"):
        assert os.readlink(f"/proc/{bridge}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    assert os.readlink(f"/proc/{bridge}/root") == str(sbxd.state_dir / "vm" / sid / "bridge-root")
    assert os.listdir(f"/proc/{bridge}/root") == []
    assert Path(f"/proc/{bridge}/cgroup").read_text() == Path(f"/proc/{qemu}/cgroup").read_text()
    jail_root = Path(f"/proc/{qemu}/root")
    assert sorted(p.name for p in (jail_root / str(sbxd.state_dir).lstrip("/") / "vm").iterdir()) == [sid]
    assert not (jail_root / "etc").exists() and not (jail_root / "home").exists()
    assert not (jail_root / str(sbxd.state_dir).lstrip("/") / "vm" / sid / "vm.json").exists()

    # A kernel of its own: no host process (sbxd, pytest) and no host file (sbxd's state
    # dir) is visible, and its PID 1 is the agent.
    r = api.run(sid, ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | "
                      "grep -c -e 'sbx[d]' -e 'pytes[t]'; tr '\\0' ' ' < /proc/1/cmdline; echo; "
                      f"test -e {sbxd.state_dir} && echo host-visible || echo host-hidden"])
    lines = r.stdout.decode().splitlines()
    assert lines[0] == "0", r
    assert "--listen /run/sbx/agent.sock" in lines[1], r
    assert lines[2] == "host-hidden", r

    # stdout, stderr and the exit code come back as from any runtime.
    r = api.run(sid, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert r.stdout == b"out\n" and r.stderr == b"err\n" and r.exit["exit_code"] == 7, r

    # Files in and out.
    payload = os.urandom(300_000)
    api.call("PUT", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/in.bin"}, data=payload,
             headers={"Content-Type": "application/octet-stream"}, expect=200)
    r = api.run(sid, ["sha256sum", "/tmp/in.bin"])
    assert r.stdout.decode().split()[0] == hashlib.sha256(payload).hexdigest(), r
    r = api.run(sid, ["sh", "-c", "head -c 100000 /dev/urandom > /tmp/out.bin; sha256sum /tmp/out.bin"])
    want = r.stdout.decode().split()[0]
    got = api.call("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/out.bin"}, expect=200)
    assert hashlib.sha256(got.content).hexdigest() == want

    # Pause stops the vCPUs: a counter does not move; wake lets it continue.
    counting = api.create_session(sid, ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/c.n; "
                                   "mv /tmp/c.n /tmp/c; sleep 0.05; done"])
    api.attach(counting).close()  # the first attach starts it; it runs on without a client

    def counter() -> int:
        deadline = time.monotonic() + 30
        while True:
            r = api.run(sid, ["cat", "/tmp/c"])
            if r.exit["exit_code"] == 0:
                return int(r.stdout)
            assert time.monotonic() < deadline, (r, counting)
    c0 = counter()
    op = api.call("POST", f"/v1/sandboxes/{sid}/pause", expect=202).body["operation"]
    assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded"
    assert api.get_sandbox(sid)["state"] == "paused"
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
    assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded"
    c1 = counter()
    time.sleep(0.5)
    c2 = counter()
    assert c0 <= c1 < c2, (c0, c1, c2)

    # The base template shares host directories over 9p, which QEMU cannot save: its suspend
    # is a pause, and the operation says so.
    op = api.call("POST", f"/v1/sandboxes/{sid}/suspend", expect=202).body["operation"]
    done = api.wait_operation(op["id"], timeout=60)
    assert done["state"] == "succeeded", done
    assert done["result"]["memory_preserved"] is True and done["result"]["memory_released"] is False, done
    assert "9p" in done["result"]["memory"], done
    assert sorted(vm_processes(sbxd.state_dir, sid)) == sorted(procs)
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
    assert api.wait_operation(op["id"], timeout=60)["state"] == "succeeded"
    deadline = time.monotonic() + 30
    while counter() <= c2:
        assert time.monotonic() < deadline, "the counter did not move after a wake from suspend"
        time.sleep(0.1)

    vmm_rss = rss_kib(procs[0])
    metrics.append(f"microvm: create -> running {boot:.2f} s (TCG here), VMM RSS {vmm_rss // 1024} MiB "
                   "with a 256 MiB guest (informational)")

    api.delete_sandbox(sid)
    assert vm_processes(sbxd.state_dir, sid) == []
    assert not (sbxd.state_dir / "vm" / sid).exists()
    left = [p for p in [*Path("/sys/fs/cgroup").glob(f"*/sbx-vm/{sid}"), Path(f"/sys/fs/cgroup/sbx-vm/{sid}")]
            if p.exists()]
    assert not left, f"the VMM's cgroup was left: {left}"


def test_a_guest_that_dies_marks_its_sandbox_failed(api, sbxd, microvm_available):
    sid = api.create_sandbox(MICROVM, timeout=300)["sandbox"]["id"]
    qemu = [p for p in vm_processes(sbxd.state_dir, sid)
            if b"qemu" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(qemu) == 1
    # The guest's root crashes its kernel: sysrq-trigger 'c'.
    # Its console says a lot first: sbxd reads only the log's tail for the reason.
    crash = api.create_session(sid, ["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x > /dev/console; "
                                     "echo c > /proc/sysrq-trigger"])
    api.attach(crash).close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sb = api.get_sandbox(sid)
        if sb["state"] == "failed":
            break
        time.sleep(0.2)
    assert sb["state"] == "failed", sb
    assert "panic" in sb["error"]["message"] or "VMM" in sb["error"]["message"], sb
    assert len(sb["error"]["message"]) < 4000, sb
    api.delete_sandbox(sid)
    assert vm_processes(sbxd.state_dir, sid) == []


def test_unknown_runtime_and_too_little_memory_are_refused(api, microvm_available):
    resp = api.call("POST", "/v1/sandboxes", json_body={"runtime": "microvm", "resources": {"memory_mib": 64}})
    assert resp.status_code in (400, 422), resp.body
    assert "memory_mib" in resp.body["error"]["message"], resp.body


def test_a_vm_outlives_a_kill_9_of_sbxd_and_its_session_replays(restartable):
    """QEMU and the bridge lead sessions of their own: a crash of sbxd leaves the VM serving,
    and the next sbxd adopts it; a session that ran on meanwhile replays from its first byte."""
    api = restartable.start()
    restartable.track(api)
    mv = next(r for r in api.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
    if not mv["available"]:
        skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
    state_dir = restartable.daemon.state_dir
    sid = api.create_sandbox(MICROVM, timeout=300)["sandbox"]["id"]
    before = sorted(vm_processes(state_dir, sid))
    session = api.create_session(sid, ["sh", "-c", "for i in $(seq 1 60); do echo line$i; sleep 0.05; done"])
    api.attach(session).close()
    api = restartable.restart(kill=True)
    assert api.get_sandbox(sid)["state"] == "running"
    assert sorted(vm_processes(state_dir, sid)) == before, "the VM was not adopted as it ran"
    with api.attach(session["session_id"], last_event_id=0) as stream:
        r = api.collect(stream, first_id=1)
    assert r.exit is not None and r.exit["exit_code"] == 0, r
    assert r.stdout.decode().split() == [f"line{i}" for i in range(1, 61)], r.stdout
    assert api.run(sid, ["echo", "after"]).stdout == b"after\n"
    api.delete_sandbox(sid)
    assert vm_processes(state_dir, sid) == []


def test_ports_of_a_microvm_without_a_network_reach_its_loopback(api, sbxd, microvm_available):
    """Port exposure goes through the VM's bridge to the guest's own loopback (protocol/mux.h,
    kOpen's port target), as the ns runtime dials a sandbox's: a `none` VM has no NIC, and a
    server bound to 127.0.0.1 only is still reached. A port nobody listens on is 502 at once."""
    from port_helpers import start_server
    from test_ports import Ports

    sb = api.create_sandbox(MICROVM, timeout=300)["sandbox"]
    start_server(api, sb["id"], 8000, "127.0.0.1")
    p = Ports(sbxd, sb)
    try:
        r = p.get(8000, "/headers?a=1")
        assert r.status_code == 200, r.text[:300]
        assert r.json()["path"] == "/headers?a=1"
        t0 = time.monotonic()
        r = p.get(8999, "/x")
        assert r.status_code == 502 and r.json()["error"]["code"] == "port_unreachable", r.text[:300]
        assert time.monotonic() - t0 < 15
    finally:
        p.http.close()
    api.delete_sandbox(sb["id"])


def busybox_template(api, work: Path, name: str) -> str:
    """An image template of busybox (no host directory in it): its trees reach the VM as disks."""
    layout = work / f"{name}-layout"
    images.write_layout(layout, [images.busybox_layer().bytes()], env=["PATH=/bin"])
    archive = images.oci_archive(layout, work / f"{name}.tar")
    resp = api.call("POST", "/v1/templates:import", params={"name": name, "tag": "latest"},
                    data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"}, expect=202)
    op = api.wait_operation(resp.body["operation"]["id"], timeout=120)
    assert op["state"] == "succeeded", op
    return f"{name}:latest"


def read_counter(api, sid: str) -> tuple[int, int]:
    """(pid, count) of the counting shell, from the file it rewrites."""
    deadline = time.monotonic() + 60
    while True:
        r = api.run(sid, ["cat", "/tmp/c"])
        words = r.stdout.decode().split()
        if r.exit["exit_code"] == 0 and len(words) == 2:
            return int(words[0]), int(words[1])
        assert time.monotonic() < deadline, r


def test_suspend_saves_the_vm_to_disk_releases_its_memory_and_survives_a_kill_9(restartable, tmp_path):
    """Suspend writes the VM's whole state to disk and QEMU exits (its memory goes back to the
    host); a crash of sbxd meanwhile, and a reboot's loss of the VMM's cgroup, change nothing;
    wake loads it (its cgroup made again), and a shell's counter
    continues from where it stood, in the same process, with its session's output kept."""
    api = restartable.start()
    restartable.track(api)
    mv = next(r for r in api.call("GET", "/v1/runtimes").body["runtimes"] if r["name"] == "microvm")
    if not mv["available"]:
        skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
    assert mv["capabilities"]["suspend_releases_memory"] is True, mv
    state_dir = restartable.daemon.state_dir
    tmpl = busybox_template(api, tmp_path, "mvbb")
    sid = api.create_sandbox({**MICROVM, "template": tmpl}, timeout=300)["sandbox"]["id"]
    procs = vm_processes(state_dir, sid)
    assert len(procs) == 2, procs
    qemu = next(p for p in procs if b"qemu" in Path(f"/proc/{p}/cmdline").read_bytes())
    rss_before = rss_kib(qemu)
    counting = api.create_session(sid, ["sh", "-c", "i=0; while true; do i=$((i+1)); echo \"$$ $i\" > /tmp/c; "
                                        "echo tick$i; sleep 0.05; done"])
    api.attach(counting).close()
    pid0, c0 = read_counter(api, sid)

    # A client attached across the suspend: its stream ends when the VM's connections do.
    import threading
    seen = {"events": [], "ended": False}
    held = api.attach(counting["session_id"], last_event_id=0)

    def read_held():
        try:
            for ev in held.events():
                seen["events"].append((time.monotonic(), ev.event if ev.event != "error" else f"error {ev.data}"))
        except Exception as e:  # noqa: BLE001 - what ended it is the finding
            seen["events"].append((time.monotonic(), f"raised {type(e).__name__}"))
        seen["ended"] = time.monotonic()
    reader = threading.Thread(target=read_held, daemon=True)
    reader.start()
    time.sleep(0.5)

    t0 = time.monotonic()
    op = api.call("POST", f"/v1/sandboxes/{sid}/suspend", expect=202).body["operation"]
    done = api.wait_operation(op["id"], timeout=300)
    suspend_s = time.monotonic() - t0
    reader.join(30)
    held.close()
    assert seen["ended"], "an attach stream stayed open across a suspend that stopped QEMU"
    last = seen["events"][-1][1]
    assert last.startswith("error") and "sandbox_not_running" in last, seen["events"][-3:]
    assert done["state"] == "succeeded", done
    res = done["result"]
    assert res["memory_preserved"] is True and res["memory_released"] is True, res
    assert res["snapshot_bytes"] > 0, res
    assert api.get_sandbox(sid)["state"] == "suspended"
    assert vm_processes(state_dir, sid) == [], "QEMU (and the guest's memory) should be gone"
    assert (state_dir / "vm" / sid / "state").stat().st_size == res["snapshot_bytes"]
    # Nothing answers while suspended, and nothing hangs.
    resp = api.call("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/c"}, validate=False)
    assert resp.status_code == 409, (resp.status_code, resp.text[:300])

    # A crash of sbxd and, meanwhile, what a host reboot clears: the VMM's cgroup (the state
    # file and the record are on disk and stay).
    import glob
    vm_cgroups = glob.glob(f"/sys/fs/cgroup/sbx-vm/{sid}") + glob.glob(f"/sys/fs/cgroup/*/sbx-vm/{sid}")

    def reboot_clears_cgroups():
        assert vm_cgroups, "the suspended VM's cgroup should be there until the reboot"
        for d in vm_cgroups:
            os.rmdir(d)

    api = restartable.restart(kill=True, between=reboot_clears_cgroups)
    assert api.get_sandbox(sid)["state"] == "suspended"
    assert vm_processes(state_dir, sid) == []
    assert not any(os.path.exists(d) for d in vm_cgroups)

    t0 = time.monotonic()
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
    assert api.wait_operation(op["id"], timeout=300)["state"] == "succeeded"
    wake_s = time.monotonic() - t0
    assert api.get_sandbox(sid)["state"] == "running"
    assert all(os.path.isdir(d) for d in vm_cgroups), "the wake makes the VMM's cgroup again"
    pid1, c1 = read_counter(api, sid)
    assert pid1 == pid0 and c1 >= c0, ((pid0, c0), (pid1, c1))
    time.sleep(0.5)
    pid2, c2 = read_counter(api, sid)
    assert pid2 == pid0 and c2 > c1, ((pid1, c1), (pid2, c2))
    assert not (state_dir / "vm" / sid / "state").exists()
    # The session's output from before the suspend is still in the agent's buffer.
    with api.attach(counting["session_id"], last_event_id=0) as stream:
        first = next(ev for ev in stream.events() if ev.event == "stdout")
    assert base64.b64decode(first.data["data_b64"]).startswith(b"tick1\n"), first
    assert len(vm_processes(state_dir, sid)) == 2
    api.delete_sandbox(sid)
    assert vm_processes(state_dir, sid) == []
    assert not (state_dir / "vm" / sid).exists()
    print(f"microvm suspend {suspend_s:.2f} s, wake {wake_s:.2f} s, state {res['snapshot_bytes'] >> 20} MiB "
          f"for a 256 MiB guest (VMM RSS before {rss_before >> 10} MiB)")


def test_microvm_as_the_deployment_default_with_a_warm_pool_and_ns_beside(sbxd, validator, tmp_path):
    """runtime.default = "microvm": a create that names no runtime gets a VM, from a warm pool
    of booted VMs when one is ready; ns is offered beside it. A template build that names no
    runtime runs its steps in VMs: the guest's agent ends what a RUN left running and streams
    its overlay's upper as the layer (files, a deletion, a symlink, a hard link, an owner), and
    the template runs the same on microvm and on ns."""
    import json
    import re

    from conftest import Daemon, shutdown
    from sbx_client import SbxClient
    from test_template_builds import context_tar

    d = Daemon(["--runtime", "microvm", "--warm-pool", "base=1", "--default-memory-mib", "256"])
    d.start()
    api = SbxClient(d.url, d.token, validator)
    try:
        runtimes = {r["name"]: r for r in api.call("GET", "/v1/runtimes").body["runtimes"]}
        mv = runtimes["microvm"]
        if not mv["available"]:
            skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
        assert mv["default"] is True and runtimes["ns"]["default"] is False, runtimes
        assert runtimes["ns"]["available"] is True, runtimes["ns"]
        assert mv["capabilities"]["template_builds"] is True, mv
        assert runtimes["ns"]["capabilities"]["template_builds"] is True, runtimes["ns"]

        ready = 'sbx_warm_pool_ready{runtime="microvm",template="base",egress="none"}'
        deadline = time.monotonic() + 240
        while True:
            text = api.call("GET", "/metrics", validate=False, expect=200).text
            m = re.search(rf"^{re.escape(ready)} (\S+)$", text, re.M)
            if m and float(m.group(1)) == 1:
                break
            assert time.monotonic() < deadline, f"no warm microVM after 240 s: {d.log_tail(30)}"
            time.sleep(0.5)
        t0 = time.monotonic()
        made = api.create_sandbox({}, timeout=60)
        took = time.monotonic() - t0
        sb = made["sandbox"]
        assert sb["runtime"] == "microvm", sb
        assert made["operation"]["result"] == {"warm_pool": True}, made["operation"]
        assert len(vm_processes(d.state_dir, sb["id"])) == 2, "a warm sandbox is a running VM"
        r = api.run(sb["id"], ["sh", "-c", "echo from-the-pool; uname -r"])
        assert r.exit["exit_code"] == 0 and r.stdout.startswith(b"from-the-pool\n"), r
        print(f"warm microvm create: {took * 1000:.0f} ms")
        assert api.delete_sandbox(sb["id"])["state"] == "succeeded"

        # A build that names no runtime runs its COPY and RUN steps in microVMs.
        import images
        layout = tmp_path / "bb-layout"
        images.write_layout(layout, [images.busybox_layer().dir("data").file("data/old", "old\n").bytes()],
                            env=["PATH=/bin"])
        archive = images.docker_archive(layout, tmp_path / "bb.tar")
        resp = api.call("POST", "/v1/templates:import", params={"name": "bbdef"},
                        data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                        expect=202)
        assert api.wait_operation(resp.body["operation"]["id"], timeout=120)["state"] == "succeeded"
        files = {"Dockerfile": "FROM bbdef\nCOPY hello.txt /etc/hello\n"
                               "RUN echo built > /built && rm /data/old && mkdir -p /data/new && "
                               "ln -s /built /data/new/link && ln /built /built2 && chown 1234:55 /built && "
                               "(sleep 1000 >/dev/null 2>&1 &) && echo step-ran-in $(uname -r)\n",
                 "hello.txt": "hello from the context\n"}
        t0 = time.monotonic()
        resp = api.call("POST", "/v1/templates:build", params={"name": "bbvm", "tag": "latest"},
                        data=context_tar(files), headers={"Content-Type": "application/x-tar"},
                        expect=202)
        op = api.wait_operation(resp.body["operation"]["id"], timeout=300)
        log = "\n".join(op["progress"]["log"])
        assert op["state"] == "succeeded", "\n".join([str(op["error"]), log])
        # The step ran in the guest's kernel: a sandbox of the template on microvm names the same.
        guest_kernel = re.search(r"step-ran-in (\d\S*)", log)
        assert guest_kernel, log
        print(f"microvm build of 2 steps: {time.monotonic() - t0:.1f} s")
        script = ("cat /built /etc/hello; test -e /data/old || echo gone; readlink /data/new/link; "
                  "stat -c '%u %g %h' /built; test /built -ef /built2 && echo same; uname -r")
        outs = {}
        for runtime in ("microvm", "ns"):
            sb = api.create_sandbox({"template": "bbvm", "runtime": runtime}, timeout=120)["sandbox"]
            r = api.run(sb["id"], ["sh", "-c", script])
            assert r.exit["exit_code"] == 0, (runtime, r)
            outs[runtime] = r.stdout.decode().split("\n")
            api.delete_sandbox(sb["id"])
        for runtime, lines in outs.items():
            assert lines[:6] == ["built", "hello from the context", "gone", "/built", "1234 55 2",
                                 "same"], (runtime, lines)
        assert outs["microvm"][6] == guest_kernel.group(1), outs
        # ns still builds beside it when asked.
        params = {"name": "bbns", "tag": "latest", "build": json.dumps({"sandbox": {"runtime": "ns"}})}
        resp = api.call("POST", "/v1/templates:build", params=params,
                        data=context_tar({"Dockerfile": "FROM bbdef\nRUN echo on-ns > /n\n"}),
                        headers={"Content-Type": "application/x-tar"}, expect=202)
        op = api.wait_operation(resp.body["operation"]["id"], timeout=120)
        assert op["state"] == "succeeded", op
    finally:
        ids = list(api.created_sandboxes)
        api.close()
        problems = shutdown(d, validator, ids)
    vm_dir = d.state_dir / "vm"
    assert not problems, problems
    assert not vm_dir.is_dir() or not any(vm_dir.iterdir()) or not d.tmp.exists(), \
        f"VMs left after sbxd stopped: {list(vm_dir.iterdir())}"

"""Limits that hold: what a sandbox reports as applied, and OOM kills reported per session."""

from conftest import ns_runtime_only

# sbxd's defaults (the e2e daemon runs without limit flags): README "sbxd flags".
DEFAULTS = {"vcpu": 1, "memory_mib": 512, "disk_mib": 1024, "pids": 512, "open_files": 4096,
            "tmp_mib": 256, "shm_mib": 64, "output_buffer_bytes": 8 << 20}


def test_effective_resources_report_every_limit_with_defaults(api):
    created = api.create_sandbox({}, wait=False)
    assert created["sandbox"]["effective_resources"] == DEFAULTS, created["sandbox"]
    sb = api.get_sandbox(created["sandbox"]["id"])
    assert sb["effective_resources"] == DEFAULTS, sb
    listed = {s["id"]: s for s in api.list_sandboxes()}
    assert listed[sb["id"]]["effective_resources"] == DEFAULTS, listed[sb["id"]]


def test_effective_resources_take_the_requested_values(api):
    asked = {"vcpu": 2, "memory_mib": 256, "disk_mib": 512}
    created = api.create_sandbox({"resources": asked}, wait=False)
    sb = created["sandbox"]
    assert sb["resources"] == asked, sb
    assert sb["effective_resources"] == {**DEFAULTS, **asked}, sb
    op = api.wait_operation(created["operation"]["id"])
    assert op["state"] == "succeeded", op
    assert api.get_sandbox(sb["id"])["effective_resources"] == {**DEFAULTS, **asked}


def test_partial_request_keeps_the_other_defaults(api):
    created = api.create_sandbox({"resources": {"memory_mib": 128, "vcpu": None}}, wait=False)
    sb = created["sandbox"]
    assert sb["resources"] == {"vcpu": None, "memory_mib": 128, "disk_mib": None}, sb
    assert sb["effective_resources"] == {**DEFAULTS, "memory_mib": 128}, sb


@ns_runtime_only("the fake runtime has no memory limit")
def test_oom_kill_is_reported_and_the_sandbox_survives(api):
    sb = api.create_sandbox({"resources": {"memory_mib": 64}})["sandbox"]
    # A child in the same session keeps running unless the agent contains the session.
    result = api.run(sb["id"], ["python3", "-c",
                                "import subprocess, time\n"
                                "subprocess.Popen(['sleep', '300'])\n"
                                "b = bytearray(400 * 1024 * 1024)\n"
                                "print('allocated')"])
    assert result.exit["signal"] == "SIGKILL" and result.exit["oom_killed"] is True, result.exit
    assert b"allocated" not in result.stdout
    info = api.get_session(result.session["session_id"])
    assert info["oom_killed"] is True and info["signal"] == "SIGKILL", info
    # The agent and the sandbox live on; nothing of the OOM-killed session is left.
    count_sleeps = ("import glob\n"
                    "n = 0\n"
                    "for p in glob.glob('/proc/[0-9]*/comm'):\n"
                    "    try:\n"
                    "        n += open(p).read() == 'sleep\\n'\n"
                    "    except OSError:\n"
                    "        pass\n"
                    "print(n)\n")
    after = api.run(sb["id"], ["python3", "-c", count_sleeps])
    assert after.exit["exit_code"] == 0, (after.exit, after.stderr)
    assert after.stdout.strip() == b"0", after.stdout
    assert api.get_sandbox(sb["id"])["state"] == "running"


@ns_runtime_only("the fake runtime has no namespaces")
def test_root_inside_binds_low_ports_and_writes_its_files(api):
    # Sandbox root is an unprivileged host uid whose CAP_NET_BIND_SERVICE does not count in the
    # host-owned network namespace; sbxd lowers ip_unprivileged_port_start there so that a web
    # server on :80 still works, and the idmapped template lets root change its own files.
    sb = api.create_sandbox({})["sandbox"]
    script = ("import socket, os\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 80)); s.listen()\n"
              "c = socket.create_connection(('127.0.0.1', 80)); a, _ = s.accept()\n"
              "c.sendall(b'hi'); print(a.recv(2).decode(), os.getuid())\n"
              "open('/root/f', 'w').write('x')\n"
              "os.chown('/root', 0, 0); print(os.stat('/root/f').st_uid)\n")
    r = api.run(sb["id"], ["python3", "-c", script])
    assert r.exit["exit_code"] == 0, r.stderr
    assert r.stdout == b"hi 0\n0\n", r.stdout

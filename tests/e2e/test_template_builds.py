"""Template builds (docs/templates.md, "Builds"): a Dockerfile subset over an imported busybox
image, RUN steps in sandboxes whose writable layer becomes the step's layer, COPY from an
uploaded context, the config steps, the step cache (a rebuild with one changed step redoes only
what follows it), failures that name the step and leave nothing behind, and the CLI."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

import images
from conftest import ns_runtime_only
from sbx_client import SbxClient

pytestmark = ns_runtime_only("builds run their steps in ns sandboxes")


@pytest.fixture(scope="module")
def work():
    d = Path(tempfile.mkdtemp(prefix="sbx-e2e-builds-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def parent(api, work):
    """`bbuild:latest`, busybox with a file a build deletes."""
    layout = work / "bb-layout"
    if layout.exists():
        return "bbuild"
    images.write_layout(layout, [images.busybox_layer().dir("data").file("data/old", "old\n")
                                 .bytes()], env=["PATH=/bin"])
    archive = images.docker_archive(layout, work / "bb.tar")
    resp = api.call("POST", "/v1/templates:import", params={"name": "bbuild"},
                    data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                    expect=202)
    op = api.wait_operation(resp.body["operation"]["id"], timeout=120)
    assert op["state"] == "succeeded", op
    return "bbuild"


def context_tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build(api: SbxClient, name: str, files: dict[str, str], build=None, expect_state="succeeded"):
    params = {"name": name, "tag": "latest"}
    if build is not None:
        params["build"] = json.dumps(build)
    resp = api.call("POST", "/v1/templates:build", params=params, data=context_tar(files),
                    headers={"Content-Type": "application/x-tar"}, expect=202)
    op = api.wait_operation(resp.body["operation"]["id"], timeout=300)
    assert op["state"] == expect_state, "\n".join([str(op["error"])] + op["progress"]["log"])
    assert op["kind"] == "template_build"
    return op


def run_out(api: SbxClient, template: str, script: str) -> str:
    sb = api.create_sandbox({"template": template})["sandbox"]
    try:
        r = api.run(sb["id"], ["sh", "-c", script])
        assert r.exit and r.exit.get("exit_code") == 0, (r.stdout, r.stderr, r.exit)
        return r.stdout.decode()
    finally:
        api.delete_sandbox(sb["id"])


DOCKERFILE = """\
# a comment
FROM bbuild
ARG V=1
ENV APP_HOME=/srv/app \\
    MODE=prod
WORKDIR $APP_HOME
COPY app/ ./
COPY hello.txt /etc/hello
RUN echo "run $V in $(pwd) as $(id -u)" && cat /etc/hello > copied && echo $V > v \\
    && rm /data/old && mkdir /data/new
LABEL org.example.team=agents
USER app
CMD ["cat", "v"]
"""

FILES = {"Dockerfile": DOCKERFILE, "app/main.py": "print('hi')\n", "app/lib/util.py": "X = 1\n",
         "hello.txt": "hello from the context\n"}


def test_a_build_runs_its_steps_and_the_template_has_their_files_and_config(api, parent, work,
                                                                            sbxd):
    op = build(api, "built", FILES)
    prog = op["progress"]
    assert prog["steps_total"] == 10 and prog["steps_done"] == 10, prog
    log = "\n".join(prog["log"])
    assert "run 1 in /srv/app as 0" in log, log
    assert "step 7/10 (Dockerfile line 9): RUN echo" in log, log
    tpl = api.call("GET", "/v1/templates/built").body
    digest = tpl["tags"]["latest"]
    release = next(r for r in tpl["releases"] if r["digest"] == digest)
    assert release["source"]["kind"] == "build"
    cfg = release["config"]
    assert cfg["working_dir"] == "/srv/app" and cfg["user"] == "app" and cfg["cmd"] == ["cat", "v"]
    assert "MODE=prod" in cfg["env"] and cfg["labels"]["org.example.team"] == "agents"
    out = run_out(api, "built", "pwd; id -u; echo $MODE; cat main.py lib/util.py copied v; "
                                "test -e /data/old || echo gone; test -d /data/new && echo newdir")
    assert out.split("\n")[:-1] == ["/srv/app", "1000", "prod", "print('hi')", "X = 1",
                                    "hello from the context", "1", "gone", "newdir"], out
    # Nothing of the build is left: its directory, its step sandboxes.
    assert not list((sbxd.state_dir / "templates" / "builds").glob("*"))
    sandboxes = api.call("GET", "/v1/sandboxes").body["sandboxes"]
    assert not any(s.get("template_ref", "").startswith("build") for s in sandboxes)


def test_a_rebuild_redoes_only_what_follows_a_changed_step(api, parent):
    first = build(api, "cached", FILES)
    again = build(api, "cached", FILES)
    log = "\n".join(again["progress"]["log"])
    assert log.count("cached:") == 4, log  # WORKDIR, both COPYs and the RUN
    assert again["result"]["template"]["digest"] == first["result"]["template"]["digest"]
    # A changed ARG value changes what the RUN sees: the COPYs before it stay cached.
    changed = build(api, "cached", FILES, build={"args": {"V": "2"}})
    log = "\n".join(changed["progress"]["log"])
    assert log.count("cached:") == 3 and "run 2 in" in log, log
    assert run_out(api, "cached", "cat v").strip() == "2"
    # A changed file of the context: its COPY and everything after it run again.
    files = dict(FILES, **{"hello.txt": "changed\n"})
    third = build(api, "cached", files)
    log = "\n".join(third["progress"]["log"])
    assert log.count("cached:") == 2, log  # WORKDIR and the first COPY
    assert run_out(api, "cached", "cat copied").strip() == "changed"
    no_cache = build(api, "cached", FILES, build={"no_cache": True})
    assert "cached:" not in "\n".join(no_cache["progress"]["log"])


def test_failures_name_the_step_and_leave_nothing(api, parent, sbxd):
    failing = "FROM bbuild\nRUN echo about to fail && exit 3\n"
    op = build(api, "failing", {"Dockerfile": failing}, expect_state="failed")
    assert op["error"]["code"] == "build_step_failed", op
    assert "line 2" in op["error"]["message"] and "exited with code 3" in op["error"]["message"]
    assert "about to fail" in "\n".join(op["progress"]["log"])
    missing = build(api, "failing", {"Dockerfile": "FROM bbuild\nCOPY nothere /x\n"},
                    expect_state="failed")
    assert missing["error"]["code"] == "invalid_build_context", missing
    assert "nothere" in missing["error"]["message"]
    unknown = build(api, "failing", {"Dockerfile": "FROM nosuchtemplate\nRUN true\n"},
                    expect_state="failed")
    assert unknown["error"]["code"] == "template_not_found", unknown
    from_base = build(api, "failing", {"Dockerfile": "FROM base\n"}, expect_state="failed")
    assert from_base["error"]["code"] == "invalid_dockerfile", from_base
    # A Dockerfile given as text is parsed at once: 400 naming the line.
    bad = api.call("POST", "/v1/templates", json_body={
        "name": "failing", "source": {"build": {"dockerfile": "FROM bbuild\nRUN true\nEXPOSE 80\n"}}},
        expect=400)
    assert bad.body["error"]["code"] == "invalid_dockerfile"
    assert "line 3" in bad.body["error"]["message"], bad.body
    api.call("GET", "/v1/templates/failing", expect=404)
    assert not list((sbxd.state_dir / "templates" / "builds").glob("*"))
    assert not list((sbxd.state_dir / "templates" / "uploads").glob("*"))


def test_a_build_from_json_without_context_and_from_the_cli(api, parent, sbxd, work):
    resp = api.call("POST", "/v1/templates", json_body={
        "name": "jsonbuild", "tag": "1",
        "source": {"build": {"dockerfile": "FROM bbuild\nRUN echo json > /made\n"}}}, expect=202)
    op = api.wait_operation(resp.body["operation"]["id"], timeout=300)
    assert op["state"] == "succeeded", op
    assert run_out(api, "jsonbuild:1", "cat /made").strip() == "json"

    from conftest import build_dir
    ctx = work / "cli-ctx"
    (ctx / "sub").mkdir(parents=True)
    (ctx / "sub" / "Buildfile").write_text("FROM bbuild\nARG WHO\nCOPY msg /msg\n"
                                           "RUN echo \"$WHO\" >> /msg\n")
    (ctx / "msg").write_text("from the cli\n")
    cli = [str(build_dir() / "bin" / "sbx"), "--url", sbxd.url, "--token", sbxd.token]
    p = subprocess.run([*cli, "template", "build", "-f", str(ctx / "sub" / "Buildfile"), str(ctx),
                        "-t", "clibuild:1", "--build-arg", "WHO=me"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.startswith("clibuild:1 sha256:"), p.stdout
    # --progress: the build's log on stderr as it happens (the SSE events).
    p = subprocess.run([*cli, "template", "build", "--progress", "-f", str(ctx / "sub" / "Buildfile"),
                        str(ctx), "-t", "clibuild:2", "--build-arg", "WHO=you", "--no-cache"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "step 4/4 (Dockerfile line 4): RUN" in p.stderr, p.stderr
    (ctx / "sub" / "Failfile").write_text("FROM bbuild\nRUN echo broken-step-output && exit 7\n")
    p = subprocess.run([*cli, "template", "build", "--progress", "-f", str(ctx / "sub" / "Failfile"),
                        str(ctx), "-t", "clibuild:3"], capture_output=True, text=True, timeout=300)
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "broken-step-output" in p.stderr and "build_step_failed" in p.stderr, p.stderr
    assert "exited with code 7" in p.stderr, p.stderr
    assert run_out(api, "clibuild:1", "cat /msg").split("\n")[:2] == ["from the cli", "me"]


def step_sandboxes(sbxd) -> list[str]:
    d = sbxd.state_dir / "sandboxes"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_a_build_is_cancelled_and_a_hung_step_times_out(api, parent, sbxd):
    before = step_sandboxes(sbxd)
    resp = api.call("POST", "/v1/templates", json_body={
        "name": "slow", "source": {"build": {"dockerfile": "FROM bbuild\nRUN sleep 60\n"}}},
        expect=202)
    op_id = resp.body["operation"]["id"]
    deadline = time.monotonic() + 60
    while True:
        op = api.call("GET", f"/v1/operations/{op_id}", params={"wait_ms": 200}).body
        if any("step 2/2" in line for line in (op.get("progress") or {}).get("log", [])):
            break
        assert op["state"] in ("pending", "running") and time.monotonic() < deadline, op
    started = time.monotonic()
    api.call("DELETE", f"/v1/operations/{op_id}", expect=202)
    op = api.wait_operation(op_id, timeout=30)
    assert op["state"] == "failed" and op["error"]["code"] == "cancelled", op
    assert time.monotonic() - started < 10
    assert step_sandboxes(sbxd) == before, "the step's sandbox is destroyed with the build"
    hung = api.call("POST", "/v1/templates", json_body={
        "name": "slow", "source": {"build": {"dockerfile": "FROM bbuild\nRUN sleep 60\n",
                                             "sandbox": {"timeout_s": 1}}}}, expect=202)
    op = api.wait_operation(hung.body["operation"]["id"], timeout=60)
    assert op["state"] == "failed" and op["error"]["code"] == "build_step_failed", op
    assert "timed out" in op["error"]["message"], op
    assert step_sandboxes(sbxd) == before


def test_the_operation_streams_its_log_as_server_sent_events(api, parent):
    from sbx_client import SseStream
    dockerfile = "FROM bbuild\nRUN for i in 1 2 3; do echo line-$i; sleep 0.2; done\n"
    resp = api.call("POST", "/v1/templates", json_body={
        "name": "events", "source": {"build": {"dockerfile": dockerfile, "no_cache": True}}},
        expect=202)
    op_id = resp.body["operation"]["id"]

    def follow(**kw):
        r = api.call("GET", f"/v1/operations/{op_id}/events", stream=True, timeout=60,
                     expect=200, **kw)
        return list(SseStream(r, api.validator).events())

    events = follow()  # from while it runs to its end
    logs = [e for e in events if e.event == "log"]
    lines = [e.data["line"] for e in logs]
    assert ["line-1", "line-2", "line-3"] == [l for l in lines if l.startswith("line-")], lines
    assert any(l.startswith("step 2/2 (Dockerfile line 2): RUN") for l in lines), lines
    ids = [e.id for e in logs]
    assert ids == list(range(1, len(ids) + 1)), ids
    assert events[-1].event == "done" and events[-1].data["state"] == "succeeded", events[-1]
    assert any(e.event == "progress" and e.data.get("steps_total") == 2 for e in events)
    # Resumed after a line: only what came after it, then done at once (it has finished).
    again = follow(headers={"Last-Event-ID": str(ids[2])})
    assert [e.id for e in again if e.event == "log"] == ids[3:]
    assert again[-1].event == "done"
    bad = api.call("GET", f"/v1/operations/{op_id}/events", params={"after": "x"}, expect=400)
    assert bad.body["error"]["details"]["field"] == "after"
    api.call("GET", "/v1/operations/op_aaaaaaaaaaaaaaaaaaaa/events", expect=404)


def test_a_template_start_command_runs_in_every_sandbox_before_it_is_running(api, parent):
    # The server of an E2B-like template: it writes a file when it has started; the readiness
    # check waits for that file. CMD is the start command (start.cmd = true).
    dockerfile = ("FROM bbuild\nCMD [\"sh\", \"-c\", \"sleep 0.3; echo up > /tmp/ready; "
                  "exec sleep 1000\"]\n")
    resp = api.call("POST", "/v1/templates", json_body={
        "name": "served", "source": {"build": {"dockerfile": dockerfile}},
        "start": {"cmd": True, "ready": ["test", "-e", "/tmp/ready"], "timeout_s": 30}},
        expect=202)
    op = api.wait_operation(resp.body["operation"]["id"], timeout=300)
    assert op["state"] == "succeeded", op
    release = api.call("GET", "/v1/templates/served").body["releases"][0]
    assert release["config"]["start"]["cmd"] == ["sh", "-c", "sleep 0.3; echo up > /tmp/ready; "
                                                 "exec sleep 1000"]
    sb = api.create_sandbox({"template": "served"})["sandbox"]
    # Running means ready: the file is there at once, and the process still runs.
    r = api.run(sb["id"], ["sh", "-c", "cat /tmp/ready; ps 2>/dev/null | grep -c 'sleep 1000' || "
                                       "ls /proc | grep -c '^[0-9]'"])
    assert r.stdout.decode().split("\n")[0] == "up", r
    api.delete_sandbox(sb["id"])
    # A start command that dies, or a check that never passes: the create fails, saying so.
    for start, words in (({"cmd": ["sh", "-c", "exit 4"], "ready": ["false"], "timeout_s": 5},
                          "exited with code 4"),
                         ({"cmd": ["sleep", "100"], "ready": ["false"], "timeout_s": 1},
                          "did not pass")):
        resp = api.call("POST", "/v1/templates", json_body={
            "name": "broken", "source": {"build": {"dockerfile": "FROM bbuild\n"}}, "start": start},
            expect=202)
        assert api.wait_operation(resp.body["operation"]["id"], timeout=300)["state"] == "succeeded"
        made = api.create_sandbox({"template": "broken"}, wait=False)
        op = api.wait_operation(made["operation"]["id"], timeout=60)
        assert op["state"] == "failed", op
        assert op["error"]["code"] == "template_start_failed", op
        assert words in op["error"]["message"], op
        api.delete_sandbox(made["sandbox"]["id"])
    bad = api.call("POST", "/v1/templates", json_body={
        "name": "broken", "source": {"build": {"dockerfile": "FROM bbuild\n"}},
        "start": {"ready": ["true"]}}, expect=400)
    assert bad.body["error"]["details"]["field"] == "start.cmd"


def test_a_build_takes_the_resources_of_its_step_sandboxes(api, parent):
    dockerfile = "FROM bbuild\nRUN head -c 1000000 /dev/zero > /big\n"
    op = build(api, "sized", {"Dockerfile": dockerfile},
               build={"sandbox": {"resources": {"memory_mib": 128, "disk_mib": 64}}})
    assert op["state"] == "succeeded"
    bad = api.call("POST", "/v1/templates", json_body={
        "name": "sized", "source": {"build": {"dockerfile": dockerfile,
                                              "sandbox": {"vcpu": 1}}}}, expect=400)
    assert bad.body["error"]["details"]["field"] == "source.build.sandbox.vcpu"


def test_workdir_chown_hard_links(api, parent):
    """WORKDIR makes its directory even when no RUN follows; COPY --chown owns what it copies
    by the image's own users; hard links of the context stay hard links; ADD unpacks a local
    archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dockerfile = ("FROM bbuild\nARG OWNER=app\nWORKDIR /w/x\n"
                      "COPY --chown=${OWNER}:app tree/ /owned/\nCOPY --chown=1234:55 one /num\n"
                      "COPY links/ /links/\nADD --chown=app app.tgz /opt/app\n"
                      "COPY app.tgz /opt/kept/\nWORKDIR rel\n")
        inner = io.BytesIO()
        with tarfile.open(fileobj=inner, mode="w:gz") as z:
            for name, text in (("bin/run", "#!/bin/sh\n"), ("lib/x.txt", "x\n")):
                info = tarfile.TarInfo(name)
                info.size = len(text)
                z.addfile(info, io.BytesIO(text.encode()))
        info = tarfile.TarInfo("app.tgz")
        info.size = len(inner.getvalue())
        t.addfile(info, io.BytesIO(inner.getvalue()))
        for name, text in (("Dockerfile", dockerfile), ("tree/a", "a\n"), ("tree/sub/b", "b\n"),
                           ("one", "1\n"), ("links/f", "linked\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))
        hard = tarfile.TarInfo("links/g")
        hard.type = tarfile.LNKTYPE
        hard.linkname = "links/f"
        t.addfile(hard)
    resp = api.call("POST", "/v1/templates:build", params={"name": "owned", "tag": "latest"},
                    data=buf.getvalue(), headers={"Content-Type": "application/x-tar"}, expect=202)
    op = api.wait_operation(resp.body["operation"]["id"], timeout=300)
    assert op["state"] == "succeeded", "\n".join([str(op["error"])] + op["progress"]["log"])
    cfg = api.call("GET", "/v1/templates/owned").body["releases"][0]["config"]
    assert cfg["working_dir"] == "/w/x/rel", cfg
    out = run_out(api, "owned", "pwd; stat -c '%n %u %g' /owned/a /owned/sub /owned/sub/b /num; "
                                "stat -c '%i %h' /links/f /links/g; cat /links/g; "
                                "stat -c '%n %u' /opt/app/bin/run /opt/app/lib/x.txt; "
                                "test -f /opt/kept/app.tgz && echo kept")
    lines = out.split("\n")
    assert lines[0] == "/w/x/rel", out
    assert lines[1:5] == ["/owned/a 1000 1000", "/owned/sub 1000 1000", "/owned/sub/b 1000 1000",
                          "/num 1234 55"], out
    f, g = lines[5].split(), lines[6].split()
    assert f == g and f[1] == "2", out
    assert lines[7] == "linked", out
    # ADD unpacks a local archive into DEST (with --chown); COPY keeps it a file.
    assert lines[8:11] == ["/opt/app/bin/run 1000", "/opt/app/lib/x.txt 1000", "kept"], out
    # A user the image does not know: the COPY fails, naming it.
    bad = build(api, "owned", {"Dockerfile": "FROM bbuild\nCOPY --chown=nobody-here x /x\n",
                               "x": "x"}, expect_state="failed")
    assert "nobody-here" in bad["error"]["message"], bad
    assert "line 2" in bad["error"]["message"], bad

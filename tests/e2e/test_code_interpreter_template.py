"""The E2B code-interpreter template (issue 19, clients/e2b/code-interpreter): the script
tools/e2b/code-interpreter.py builds `code-interpreter-v1` on a real sbxd (the parent and the
wheels fetched on the host, cached in SBX_CACHE_DIR or ~/.cache/sbx), then a sandbox of it
answers the API the code-interpreter SDKs call on port 49999, reached through sbxd's port
relay with the traffic token in E2B's header as the SDKs send it: stdout and stderr, results
(text, a matplotlib PNG), errors, contexts, restart, env_vars, the errors of bad requests, and
a client that goes away does not leave the context busy. Traffic goes only to 127.0.0.1."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time

import pytest
import requests

from conftest import ALL_SANDBOXES, METRICS, REPO, _ALL_LOCK, ns_runtime_only
from sbx_client import SbxClient

pytestmark = ns_runtime_only("templates are built and run in ns sandboxes")

SCRIPT = REPO / "tools" / "e2b" / "code-interpreter.py"
TEMPLATE = "code-interpreter-v1"
PORT = 49999
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def template(sbxd) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("SBX_URL", "SBX_TOKEN")}
    env.update(SBX_URL=sbxd.url, SBX_TOKEN=sbxd.token)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(SCRIPT)], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=2400)
    took = time.monotonic() - t0
    assert p.returncode == 0, f"{SCRIPT.name} exited with {p.returncode}:\n{p.stderr[-6000:]}"
    assert p.stdout.startswith(f"{TEMPLATE}:latest sha256:"), p.stdout
    timing = [line for line in p.stderr.splitlines() if "timing:" in line]
    METRICS.append(f"code-interpreter template: {took:.1f} s in all; "
                   f"{timing[-1].split('timing:')[1].strip() if timing else '?'}")
    # A second run with the same inputs finds the template up to date and builds nothing.
    t0 = time.monotonic()
    again = subprocess.run([sys.executable, str(SCRIPT)], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is up to date" in again.stderr and again.stdout == p.stdout, again.stderr
    METRICS.append(f"code-interpreter template, second run: {time.monotonic() - t0:.1f} s")
    return TEMPLATE


class Jupyter:
    """The code-interpreter API of one sandbox, as the SDKs call it."""

    def __init__(self, sbxd, sandbox: dict):
        self.base = f"{sbxd.url}/v1/sandboxes/{sandbox['id']}/ports/{PORT}"
        self.http = requests.Session()
        self.http.trust_env = False
        self.http.headers.update({"E2B-Traffic-Access-Token": sandbox["traffic_token"],
                                  "Content-Type": "application/json"})

    def execute(self, code: str, **fields) -> list[dict]:
        with self.http.post(self.base + "/execute", data=json.dumps({"code": code, **fields}),
                            stream=True, timeout=120) as r:
            assert r.status_code == 200, (r.status_code, r.text)
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert lines and lines[-1] == {"type": "end_of_execution"}, lines
        return [x for x in lines if x["type"] != "keepalive"]

    def call(self, method: str, path: str, body=None, expect: int = 200):
        r = self.http.request(method, self.base + path, timeout=120,
                              data=None if body is None else json.dumps(body))
        assert r.status_code == expect, (method, path, r.status_code, r.text)
        return r.json() if r.content else None


def of(lines: list[dict], kind: str) -> list[dict]:
    return [x for x in lines if x["type"] == kind]


# Module scope: the sandbox is gone before other modules count sandboxes or capacity.
@pytest.fixture(scope="module")
def jupyter(sbxd, validator, template):
    client = SbxClient(sbxd.url, sbxd.token, validator)
    t0 = time.monotonic()
    try:
        sb = client.create_sandbox({"template": template, "labels": {"e2e": "code-interpreter"}},
                                   timeout=300)["sandbox"]
        METRICS.append(f"code-interpreter sandbox create (to running, kernel up): "
                       f"{time.monotonic() - t0:.2f} s")
        j = Jupyter(sbxd, sb)
        yield j
        j.http.close()
    finally:
        ids = list(client.created_sandboxes)
        with _ALL_LOCK:
            ALL_SANDBOXES.extend(ids)
        t0 = time.monotonic()
        for sid in ids:
            client.delete_sandbox(sid)
        METRICS.append(f"code-interpreter sandbox delete: {time.monotonic() - t0:.2f} s")
        client.close()


def test_print_reaches_stdout_and_stderr(jupyter):
    # The Python SDK sends every field, null when not given.
    lines = jupyter.execute("import sys\nprint('hello')\nprint('oops', file=sys.stderr)",
                            context_id=None, language=None, env_vars=None)
    assert "".join(x["text"] for x in of(lines, "stdout")) == "hello\n", lines
    assert "".join(x["text"] for x in of(lines, "stderr")) == "oops\n", lines
    assert all(x["timestamp"] for x in of(lines, "stdout") + of(lines, "stderr")), lines
    assert of(lines, "number_of_executions")[0]["execution_count"] >= 1, lines
    assert not of(lines, "error") and not of(lines, "result"), lines


def test_the_last_expression_is_the_main_result(jupyter):
    lines = jupyter.execute("1 + 1")
    assert of(lines, "result") == [{"type": "result", "is_main_result": True, "text": "2"}], lines
    # A string shows without its repr quotes, as E2B's server shows it (execution.text).
    assert of(jupyter.execute("'abc'"), "result")[0]["text"] == "abc"


def test_a_matplotlib_plot_comes_back_as_png(jupyter):
    lines = jupyter.execute("import matplotlib.pyplot as plt\n"
                            "plt.plot([1, 3, 2])\nplt.title('sbx')\nplt.show()")
    assert not of(lines, "error"), lines
    pngs = [x for x in of(lines, "result") if "png" in x]
    assert len(pngs) == 1, lines
    assert pngs[0]["is_main_result"] is False and pngs[0]["text"].startswith("<Figure"), pngs
    data = base64.b64decode(pngs[0]["png"], validate=True)
    assert data.startswith(PNG_MAGIC), data[:16]
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 100 and height > 100, (width, height)


def test_an_exception_is_an_error_with_name_value_and_traceback(jupyter):
    lines = jupyter.execute("x = 1\n1 / 0")
    errors = of(lines, "error")
    assert len(errors) == 1, lines
    e = errors[0]
    assert e["name"] == "ZeroDivisionError" and e["value"] == "division by zero", e
    assert "1 / 0" in e["traceback"] and "ZeroDivisionError" in e["traceback"], e
    assert not re.search(r"\x1b\[", e["traceback"]), e["traceback"]  # plain text, no colours
    # The context goes on.
    assert of(jupyter.execute("x + 1"), "result")[0]["text"] == "2"


def test_a_context_keeps_its_own_variables_until_restarted(jupyter):
    ctx = jupyter.call("POST", "/contexts", {"cwd": "/tmp"})
    assert ctx["language"] == "python" and ctx["cwd"] == "/tmp" and ctx["id"], ctx
    cid = ctx["id"]
    try:
        assert of(jupyter.execute("only_here = 41\nimport os\nos.getcwd()", context_id=cid),
                  "result")[0]["text"] == "/tmp"
        assert of(jupyter.execute("only_here + 1", context_id=cid), "result")[0]["text"] == "42"
        err = of(jupyter.execute("only_here"), "error")  # the default context never saw it
        assert err and err[0]["name"] == "NameError", err
        assert ctx in jupyter.call("GET", "/contexts")

        assert jupyter.call("POST", f"/contexts/{cid}/restart", expect=204) is None
        err = of(jupyter.execute("only_here", context_id=cid), "error")
        assert err and err[0]["name"] == "NameError", err
    finally:
        jupyter.call("DELETE", f"/contexts/{cid}", expect=204)
    assert all(c["id"] != cid for c in jupyter.call("GET", "/contexts"))
    gone = jupyter.call("DELETE", f"/contexts/{cid}", expect=404)
    assert gone["code"] == 404 and cid in gone["message"], gone
    r = jupyter.http.post(jupyter.base + "/execute", timeout=60,
                          data=json.dumps({"code": "1", "context_id": cid}))
    assert r.status_code == 404 and r.json()["code"] == 404, r.text


def test_env_vars_hold_for_one_execution(jupyter):
    code = "import os\nos.environ.get('SBX_E2E_VAR', 'unset')"
    assert of(jupyter.execute(code, env_vars={"SBX_E2E_VAR": "it's set"}),
              "result")[0]["text"] == "it's set"
    assert of(jupyter.execute(code), "result")[0]["text"] == "unset"


def test_bad_requests_are_json_errors(jupyter):
    for body, status in [({"code": "1", "language": "cobol"}, 400),
                         ({"code": "1", "language": "python", "context_id": "x"}, 400),
                         ({"code": 1}, 400),
                         ({"code": "1", "env_vars": {"A": 1}}, 400),
                         ({"code": "1", "context_id": "no-such-context"}, 404)]:
        r = jupyter.http.post(jupyter.base + "/execute", data=json.dumps(body), timeout=60)
        assert r.status_code == status, (body, r.status_code, r.text)
        assert r.headers["Content-Type"] == "application/json" and r.json()["code"] == status
    r = jupyter.http.post(jupyter.base + "/execute", data="{not json", timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["message"], r.text
    r = jupyter.http.post(jupyter.base + "/contexts", data=json.dumps({"cwd": "/nonexistent"}),
                          timeout=60)
    assert r.status_code == 400, r.text
    assert jupyter.http.get(jupyter.base + "/nowhere", timeout=60).status_code == 404
    assert jupyter.http.get(jupyter.base + "/execute", timeout=60).status_code == 405
    assert jupyter.http.get(jupyter.base + "/health", timeout=60).json() == "OK"


def test_a_kernel_that_dies_is_reported_and_replaced(jupyter):
    ctx = jupyter.call("POST", "/contexts", {})
    try:
        lines = jupyter.execute("lost = 1\nimport os\nos._exit(3)", context_id=ctx["id"])
        assert [e["name"] for e in of(lines, "error")] == ["KernelDied"], lines
        err = of(jupyter.execute("lost", context_id=ctx["id"]), "error")
        assert err and err[0]["name"] == "NameError", err  # a new kernel, not a hang
    finally:
        jupyter.call("DELETE", f"/contexts/{ctx['id']}", expect=204)


def test_a_client_that_goes_away_frees_the_context(jupyter):
    # The code would run for 10 minutes; the client reads its first line and leaves. The
    # server interrupts the kernel, so the next execution in the same context runs at once.
    r = jupyter.http.post(jupyter.base + "/execute", stream=True, timeout=60,
                          data=json.dumps({"code": "import time\ntime.sleep(600)"}))
    assert r.status_code == 200
    first = json.loads(next(r.iter_lines()))
    assert first["type"] == "number_of_executions", first
    r.close()
    t0 = time.monotonic()
    lines = jupyter.execute("'free'")
    assert of(lines, "result")[0]["text"] == "free", lines
    assert time.monotonic() - t0 < 60

"""What the E2B compatibility layer costs (issue 19): `Sandbox.create()` + `commands.run("echo hi")`
through the official Python SDK (`e2b`, pinned in tests/e2b/python/requirements.lock) against the
same flow through sbx's own API, from the same Python process and the same sbxd, rounds
alternating between the two so that a drifting host weighs on both alike.

  E2B:  Sandbox.create(allow_internet_access=False) (POST /sandboxes, returns once usable) -> commands.run("echo hi")
        (Connect stream /process.Process/Start) -> kill() (DELETE /sandboxes/{id})
  sbx:  POST /v1/sandboxes + GET /v1/operations/{id}?wait_ms (until running) -> POST sessions
        + GET attach (SSE until process_exited) -> DELETE /v1/sandboxes/{id} (not waited for,
        as E2B's kill)

The command is the SDK's own argv for it on both sides (`/bin/bash -l -c "echo hi"`), and both
clients keep their connections alive. Reported: the medians of create, first command, create
-> first command (the figure the target is about: E2B <= 1.3x sbx) and kill, the ratio, and
E2B cloud's published ~440 ms create -> first command (../shared/research/peers.md section 2):
a published number, not measured here.

Usage (root; in the SDKs' venv: `eval "$(bash tools/e2b/sdk-env.sh)"`):
  $SBX_TEST_E2B_PYTHON bench/e2b_create_run.py [--rounds 20 | --quick] [--json OUT] [--build DIR]
  $SBX_TEST_E2B_PYTHON bench/e2b_create_run.py --url URL --admin-token T   (an sbxd already running)
Exits 1 if a flow fails; the ratio is reported, not enforced (a loaded host skews one round).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
ARGV = ["/bin/bash", "-l", "-c", "echo hi"]  # what commands.run("echo hi") starts
E2B_CLOUD_PUBLISHED_MS = 440  # create -> first command, E2B's published figure (peers.md section 2)
TARGET_RATIO = 1.3


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class SbxApi:
    """sbx's own API over one keep-alive session: the comparison's other side."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body=None, expect=(200,), **kw):
        r = self.http.request(method, self.url + path, json=body, timeout=120, **kw)
        if r.status_code not in expect:
            raise RuntimeError(f"{method} {path} -> {r.status_code}: {r.text[:300]}")
        return r

    def create(self) -> str:
        b = self.call("POST", "/v1/sandboxes", {"template": "base", "timeout_s": 300},
                      expect=(202,)).json()
        op = b["operation"]
        while op["state"] not in ("succeeded", "failed"):
            op = self.call("GET", f"/v1/operations/{op['id']}", params={"wait_ms": 60000}).json()
        if op["state"] != "succeeded":
            raise RuntimeError(f"create failed: {op}")
        return b["sandbox"]["id"]

    def run(self, sid: str) -> str:
        s = self.call("POST", f"/v1/sandboxes/{sid}/sessions", {"argv": ARGV}, expect=(201,)).json()
        out, event = [], None
        with self.http.get(self.url + s["attach"]["url"], stream=True, timeout=120) as r:
            if r.status_code != 200:
                raise RuntimeError(f"attach -> {r.status_code}: {r.text[:300]}")
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "stdout":
                    out.append(base64.b64decode(json.loads(line[5:])["data_b64"]).decode())
                elif line.startswith("data:") and event == "process_exited":
                    code = json.loads(line[5:])["exit_code"]
                    if code != 0:
                        raise RuntimeError(f"exit {code}")
                    break
        return "".join(out)

    def delete(self, sid: str) -> None:
        self.call("DELETE", f"/v1/sandboxes/{sid}", expect=(202,))

    def wait_gone(self, sids, timeout=120) -> None:
        deadline = time.monotonic() + timeout
        for sid in sids:
            while self.call("GET", f"/v1/sandboxes/{sid}").json()["state"] != "deleted":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{sid} not deleted after {timeout}s")
                time.sleep(0.05)


def ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0


def e2b_round(Sandbox) -> dict:
    t0 = time.perf_counter()
    # No network on either side: sbx's flow creates with egress profile none (the default), and
    # the SDK's default allow_internet_access=True would ask for `open` (another launch path).
    sbx = Sandbox.create(allow_internet_access=False)
    t1 = time.perf_counter()
    try:
        r = sbx.commands.run("echo hi")
        t2 = time.perf_counter()
        if r.stdout != "hi\n":
            raise RuntimeError(f"E2B run: {r.stdout!r}")
    finally:
        t3 = time.perf_counter()
        killed = sbx.kill()
        t4 = time.perf_counter()
    if killed is not True:
        raise RuntimeError(f"E2B kill returned {killed}")
    return {"create": ms(t0, t1), "run": ms(t1, t2), "create_run": ms(t0, t2), "kill": ms(t3, t4),
            # E2B spells the id with `-` for its `_` (docs/e2b.md); sbx's own API takes `_`.
            "id": sbx.sandbox_id.replace("sbx-", "sbx_", 1)}


def sbx_round(api: SbxApi) -> dict:
    t0 = time.perf_counter()
    sid = api.create()
    t1 = time.perf_counter()
    try:
        out = api.run(sid)
        t2 = time.perf_counter()
        if out != "hi\n":
            raise RuntimeError(f"sbx run: {out!r}")
    finally:
        t3 = time.perf_counter()
        api.delete(sid)
        t4 = time.perf_counter()
    return {"create": ms(t0, t1), "run": ms(t1, t2), "create_run": ms(t0, t2), "kill": ms(t3, t4),
            "id": sid}


def start_sbxd(build: Path, work: Path) -> tuple[subprocess.Popen, str, str]:
    admin = secrets.token_urlsafe(32)
    url = f"http://127.0.0.1:{free_port()}"
    log = open(work / "sbxd.log", "wb")
    # No warm pool: both flows build every sandbox cold, as E2B's create does from a template.
    proc = subprocess.Popen([str(build / "bin/sbxd"), "--listen", url.removeprefix("http://"),
                             "--state-dir", str(work / "state"), "--admin-token", admin,
                             "--warm-pool", "base=0"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url, admin
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sbxd did not start; see {work / 'sbxd.log'}")
        time.sleep(0.05)


def stop_sbxd(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="3 rounds (CI's bench-smoke)")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--url", help="an sbxd already running (else one is started from --build)")
    ap.add_argument("--admin-token", help="its admin token (with --url)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    rounds = 3 if args.quick else args.rounds
    try:
        from e2b import Sandbox
    except ImportError:
        print("e2b_create_run: the e2b SDK is not importable: run it with the python that "
              "tools/e2b/sdk-env.sh prints (SBX_TEST_E2B_PYTHON)", file=sys.stderr)
        return 2
    from importlib.metadata import version

    work = Path(tempfile.mkdtemp(prefix="sbx-e2b-bench-"))
    proc = None
    url = admin = ten = ""
    made: list[str] = []
    try:
        if args.url:
            url, admin = args.url, args.admin_token
        else:
            proc, url, admin = start_sbxd(Path(args.build), work)
        root = SbxApi(url, admin)
        ten = root.call("POST", "/v1/admin/tenants", {"name": f"e2b-bench-{secrets.token_hex(3)}"},
                        expect=(201,)).json()["tenant"]["id"]
        key = root.call("POST", f"/v1/admin/tenants/{ten}/tokens",
                        {"name": "e2b-bench", "scopes": ["read", "sandboxes", "sessions", "files"]},
                        expect=(201,)).json()["token"]["token"]
        # The SDK reads these, as an application moved to sbx would.
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
        api = SbxApi(url, key)
        # One warm-up round each (imports, first connections, page cache), not counted.
        for r in (e2b_round(Sandbox), sbx_round(api)):
            made.append(r["id"])
        res = {"e2b": [], "sbx": []}
        for i in range(rounds):
            order = [("e2b", lambda: e2b_round(Sandbox)), ("sbx", lambda: sbx_round(api))]
            for name, fn in (order if i % 2 == 0 else order[::-1]):
                r = fn()
                made.append(r["id"])
                res[name].append(r)
        api.wait_gone(made)
        summary = {name: {k: median(rows, k) for k in ("create", "run", "create_run", "kill")}
                   for name, rows in res.items()}
        ratio = round(summary["e2b"]["create_run"] / summary["sbx"]["create_run"], 3)
        out = {
            "rounds": rounds, "e2b_sdk": f"e2b {version('e2b')} (python)",
            "median_ms": summary, "ratio_create_run": ratio, "target_ratio": TARGET_RATIO,
            "within_target": ratio <= TARGET_RATIO,
            "e2b_cloud_published_create_run_ms": E2B_CLOUD_PUBLISHED_MS,
            "samples_ms": {n: [{k: round(v, 2) for k, v in r.items() if k != "id"} for r in rows]
                           for n, rows in res.items()},
        }
        print(f"e2b_create_run: {rounds} rounds, medians in ms ({out['e2b_sdk']}, sbx's API "
              f"with requests {requests.__version__}):")
        print(f"  {'flow':<26} {'create':>8} {'run':>8} {'create+run':>11} {'kill':>8}")
        for name, label in (("e2b", "E2B SDK -> sbx"), ("sbx", "sbx API")):
            s = summary[name]
            print(f"  {label:<26} {s['create']:>8} {s['run']:>8} {s['create_run']:>11} {s['kill']:>8}")
        print(f"  {'E2B cloud (published)':<26} {'':>8} {'':>8} {'~' + str(E2B_CLOUD_PUBLISHED_MS):>11}"
              f"   (peers.md section 2; not measured here)")
        print(f"  ratio E2B SDK / sbx API, create+run: {ratio}x (target <= {TARGET_RATIO}x: "
              f"{'met' if ratio <= TARGET_RATIO else 'NOT met'})")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        return 0
    except Exception as e:  # noqa: BLE001 - a failed flow is the result: print it, exit 1
        print(f"e2b_create_run: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        # Deleting the bench's tenant deletes whatever a failed round left (sbxd leaves its
        # sandboxes running when it stops: they must go first, through sbxd itself).
        if ten:
            try:
                root = SbxApi(url, admin)
                root.call("DELETE", f"/v1/admin/tenants/{ten}", expect=(202, 404))
                deadline = time.monotonic() + 120
                while root.call("GET", f"/v1/admin/tenants/{ten}", expect=(200, 404)).status_code != 404:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"tenant {ten} still there after 120 s")
                    time.sleep(0.05)
            except Exception as e:  # noqa: BLE001
                print(f"e2b_create_run: cleanup: {e}", file=sys.stderr)
        if proc is not None:
            stop_sbxd(proc)
        if any(f" {work}/" in line for line in open("/proc/self/mountinfo")):
            print(f"e2b_create_run: mounts remain under {work}; leaving it in place", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

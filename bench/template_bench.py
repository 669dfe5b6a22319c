#!/usr/bin/env python3
"""Templates against the tools a user would use instead, in the same run (issue 17):

  import   POST /v1/templates:import of a ~100 MiB two-layer docker-archive, to `done`
           peer: `skopeo copy docker-archive: oci:` + `umoci unpack` of the same archive
  pull     POST /v1/templates from a loopback docker-registry, to `done`
           peer: `skopeo copy docker:// oci:` + `umoci unpack`
  create   create -> running, cold (no warm pool), from the imported template vs from `base`
  share    twenty templates on one base layer: the store's bytes vs the unique bytes

Each timed step runs --runs times (the template deleted and collected in between, so every
import unpacks again); medians are reported with the ratio to the peer. Starts its own sbxd and
docker-registry on loopback with temporary state, and removes everything it made.
Usage: python3 bench/template_bench.py [--runs 3] [--mib 100] [--json PATH]   (root)
"""
from __future__ import annotations

import argparse
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import images  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: bytes | dict | None = None, ctype=None):
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if isinstance(body, dict):
            req.add_header("Content-Type", "application/json")
        elif ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def wait(self, op_id: str) -> dict:
        while True:
            _, op = self.call("GET", f"/v1/operations/{op_id}?wait_ms=10000")
            if op["state"] in ("succeeded", "failed"):
                return op


def file_tree_layer(paths: list[Path], budget: int) -> bytes:
    """A layer of real files (binaries, libraries) of about `budget` bytes."""
    layer = images.Layer()
    seen_dirs, total = set(), 0
    for base in paths:
        for p in sorted(base.rglob("*")):
            if total >= budget:
                break
            if not p.is_file() or p.is_symlink():
                continue
            rel = str(p)[1:]
            parts = rel.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in seen_dirs:
                    seen_dirs.add(d)
                    layer.dir(d)
            data = p.read_bytes()
            layer.file(rel, data, 0o755 if os.access(p, os.X_OK) else 0o644)
            total += len(data)
    return layer.bytes()


def median_s(f, runs: int) -> float:
    out = []
    for _ in range(runs):
        out.append(f())
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--creates", type=int, default=20)
    ap.add_argument("--json", default=str(ROOT / "bench/results/template.json"))
    args = ap.parse_args()
    build = Path(os.environ.get("SBX_BUILD_DIR", ROOT / "build"))
    work = Path(tempfile.mkdtemp(prefix="sbx-tpl-bench-", dir="/var/tmp"))
    procs: list[subprocess.Popen] = []
    results: dict = {"mib": args.mib, "runs": args.runs}
    try:
        # The image: two layers of real files, gzip-compressed as registries hold them.
        big = file_tree_layer([Path("/usr/lib/x86_64-linux-gnu")], args.mib * 6 // 10 << 20)
        small = file_tree_layer([Path("/usr/share/locale"), Path("/usr/share/doc")],
                                args.mib * 4 // 10 << 20)
        layout = work / "layout"
        images.write_layout(layout, [big, small], gzip_layers=(0, 1))
        archive = images.docker_archive(layout, work / "img.tar")
        results["archive_bytes"] = archive.stat().st_size
        results["unpacked_bytes"] = len(big) + len(small)

        state = work / "state"
        state.mkdir()
        token = secrets.token_hex(16)
        port = free_port()
        reg_port = free_port()
        (work / "reg.yml").write_text(json.dumps({
            "version": 0.1, "storage": {"filesystem": {"rootdirectory": str(work / "reg")}},
            "http": {"addr": f"127.0.0.1:{reg_port}"}}))
        procs.append(subprocess.Popen(["docker-registry", "serve", str(work / "reg.yml")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        log = open(work / "sbxd.log", "wb")
        procs.append(subprocess.Popen(
            [str(build / "bin/sbxd"), "--listen", f"127.0.0.1:{port}", "--state-dir", str(state),
             "--admin-token", token, "--warm-pool", "base=0",
             "--templates-registry-insecure", f"127.0.0.1:{reg_port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        api = Api(f"http://127.0.0.1:{port}", token)
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(api.url + "/readyz", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (work / "sbxd.log").read_text()[-2000:]
            time.sleep(0.1)
        images.skopeo("copy", "-q", "--dest-tls-verify=false", f"oci:{layout}:t",
                      f"docker://127.0.0.1:{reg_port}/bench/img:1")
        body = archive.read_bytes()

        def forget(name: str) -> None:
            api.call("DELETE", f"/v1/templates/{name}")
            api.call("POST", "/v1/templates:gc", {})

        def sbx_import() -> float:
            t0 = time.monotonic()
            status, ans = api.call("POST", "/v1/templates:import?name=imp&tag=1", body,
                                   "application/x-tar")
            assert status == 202, ans
            op = api.wait(ans["operation"]["id"])
            assert op["state"] == "succeeded", op
            dt = time.monotonic() - t0
            forget("imp")
            return dt

        def peer(src: str) -> float:
            out = work / "peer"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            t0 = time.monotonic()
            tls = ["--src-tls-verify=false"] if src.startswith("docker://") else []
            images.skopeo("copy", "-q", *tls, src, f"oci:{out}/oci:t")
            subprocess.run(["umoci", "unpack", "--image", f"{out}/oci:t", f"{out}/bundle"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dt = time.monotonic() - t0
            shutil.rmtree(out, ignore_errors=True)
            return dt

        def sbx_pull() -> float:
            t0 = time.monotonic()
            status, ans = api.call("POST", "/v1/templates", {
                "name": "pull", "tag": "1",
                "source": {"image": f"127.0.0.1:{reg_port}/bench/img:1"}})
            assert status == 202, ans
            op = api.wait(ans["operation"]["id"])
            assert op["state"] == "succeeded", op
            dt = time.monotonic() - t0
            forget("pull")
            return dt

        results["import_s"] = median_s(sbx_import, args.runs)
        results["import_peer_s"] = median_s(lambda: peer(f"docker-archive:{archive}"), args.runs)
        results["pull_s"] = median_s(sbx_pull, args.runs)
        results["pull_peer_s"] = median_s(
            lambda: peer(f"docker://127.0.0.1:{reg_port}/bench/img:1"), args.runs)

        # create -> running, cold, from the template and from base, interleaved.
        status, ans = api.call("POST", "/v1/templates:import?name=imp&tag=1", body, "application/x-tar")
        assert api.wait(ans["operation"]["id"])["state"] == "succeeded"
        times: dict[str, list[float]] = {"base": [], "imp:1": []}
        for _ in range(args.creates):
            for tpl in times:
                t0 = time.monotonic()
                status, ans = api.call("POST", "/v1/sandboxes", {"template": tpl})
                assert status == 202, ans
                op = api.wait(ans["operation"]["id"])
                times[tpl].append(time.monotonic() - t0)
                assert op["state"] == "succeeded", op
                api.wait(api.call("DELETE", f"/v1/sandboxes/{ans['sandbox']['id']}")[1]["operation"]["id"])
        results["create_base_p50_ms"] = statistics.median(times["base"]) * 1000
        results["create_template_p50_ms"] = statistics.median(times["imp:1"]) * 1000

        # A build step: a RUN over busybox, uncached (no_cache) and cached, beside bwrap running
        # the same command (one isolated process, no layer kept: the floor of a step).
        bb = work / "bb-layout"
        images.write_layout(bb, [images.busybox_layer().bytes()], env=["PATH=/bin"])
        status, ans = api.call("POST", "/v1/templates:import?name=bb", images.docker_archive(
            bb, work / "bb.tar").read_bytes(), "application/x-tar")
        assert api.wait(ans["operation"]["id"])["state"] == "succeeded"
        dockerfile = "FROM bb\nRUN echo built > /built\n"

        def sbx_build(no_cache: bool) -> float:
            t0 = time.monotonic()
            status, ans = api.call("POST", "/v1/templates", {
                "name": "built", "source": {"build": {"dockerfile": dockerfile,
                                                      "no_cache": no_cache}}})
            assert status == 202, ans
            op = api.wait(ans["operation"]["id"])
            assert op["state"] == "succeeded", op
            return time.monotonic() - t0

        def bwrap_step() -> float:
            t0 = time.monotonic()
            subprocess.run(["bwrap", "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--unshare-all",
                            "--die-with-parent", "sh", "-c", "echo built > /tmp/built"],
                           check=True)
            return time.monotonic() - t0

        sbx_build(True)  # the first one pays for the parent's tree in the page cache
        results["build_run_step_ms"] = median_s(lambda: sbx_build(True), args.creates) * 1000
        results["build_cached_ms"] = median_s(lambda: sbx_build(False), args.creates) * 1000
        results["build_peer_bwrap_ms"] = median_s(bwrap_step, args.creates) * 1000

        # Twenty templates on one base layer: each adds a small layer of its own.
        unique = len(big)
        for i in range(20):
            own = images.Layer().file(f"own/{i}", os.urandom(64 << 10)).bytes()
            unique += len(own)
            lay = work / f"share{i}"
            images.write_layout(lay, [big, own], gzip_layers=(0,))
            arc = images.oci_archive(lay, work / f"share{i}.tar")
            status, ans = api.call("POST", f"/v1/templates:import?name=share{i}", arc.read_bytes(),
                                   "application/x-tar")
            assert api.wait(ans["operation"]["id"])["state"] == "succeeded"
            arc.unlink()
        du = subprocess.run(["du", "-sb", str(state / "templates/store/layers")], check=True,
                            capture_output=True, text=True).stdout.split()[0]
        results["share_store_bytes"] = int(du)
        results["share_unique_bytes"] = unique + len(small)  # imp:1's second layer is there too
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
        # Sandboxes outlive sbxd: the bench deleted its own; the store is plain files.
        subprocess.run(["umount", "-R", str(work / "state")], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)

    r = results
    rows = [
        ("import ~%d MiB archive (s)" % r["mib"], r["import_s"], r["import_peer_s"], "skopeo+umoci"),
        ("pull from local registry (s)", r["pull_s"], r["pull_peer_s"], "skopeo+umoci"),
        ("create->running p50 (ms)", r["create_template_p50_ms"], r["create_base_p50_ms"], "base"),
        ("20 templates, store bytes", r["share_store_bytes"], r["share_unique_bytes"], "unique bytes"),
        ("build, one RUN step, uncached (ms)", r["build_run_step_ms"], r["build_peer_bwrap_ms"],
         "bwrap, same command"),
        ("build, one RUN step, cached (ms)", r["build_cached_ms"], r["build_peer_bwrap_ms"],
         "bwrap, same command"),
    ]
    print(f"{'figure':34} {'sbx':>12} {'peer':>12} {'ratio':>7}  peer")
    for name, ours, theirs, peer_name in rows:
        print(f"{name:34} {ours:12.3f} {theirs:12.3f} {ours / theirs:7.2f}  {peer_name}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

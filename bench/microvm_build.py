"""Template builds on microvm (issue 20): a build's COPY and RUN steps each in a VM of their own,
the layer streamed by the guest's agent, against the same build on ns in the same sbxd and run.

Per round, interleaved: one build of `FROM bb` + COPY + RUN (its RUN text made unique, so the
cache serves nothing) with `"sandbox": {"runtime": "microvm"}`, then the same with `"ns"`;
timed from `POST /v1/templates:build` to the operation's success. The peer is the ns build: the
difference is what two VM boots (TCG here) and the guest's layer stream cost.

Usage: python3 bench/microvm_build.py [--build build] [--runs 5]   (root)
"""
from __future__ import annotations

import argparse
import io
import json
import secrets
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests/e2e"))
from template_pool_bench import Sbxd  # noqa: E402
import images  # noqa: E402


def context(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build(sbxd: Sbxd, name: str, runtime: str, n: int) -> float:
    files = {"Dockerfile": f"FROM bb\nCOPY a.txt /a.txt\nRUN echo {runtime}-{n}-{secrets.token_hex(4)} > /b && "
                           "mkdir -p /d && for i in 1 2 3 4 5 6 7 8; do echo $i > /d/$i; done\n",
             "a.txt": "from the context\n"}
    q = urllib.parse.urlencode({"name": name, "tag": "latest",
                                "build": json.dumps({"sandbox": {"runtime": runtime}})})
    t0 = time.monotonic()
    op = sbxd.call("POST", f"/v1/templates:build?{q}", context(files), ctype="application/x-tar")["operation"]
    done = sbxd.wait(op["id"])
    took = time.monotonic() - t0
    if done["state"] != "succeeded":
        raise RuntimeError(f"{runtime} build: {done.get('error')}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sbx-bench-mvbuild-"))
    sbxd = None
    try:
        sbxd = Sbxd(Path(args.build), work / "state", secrets.token_hex(16), work / "sbxd.log",
                    ["--runtime", "microvm", "--default-memory-mib", "256", "--warm-pool", "base=0"])
        layout = work / "bb-layout"
        images.write_layout(layout, [images.busybox_layer().bytes()], env=["PATH=/bin"])
        archive = images.docker_archive(layout, work / "bb.tar")
        op = sbxd.call("POST", "/v1/templates:import?name=bb", archive.read_bytes(),
                       ctype="application/x-tar")["operation"]
        assert sbxd.wait(op["id"])["state"] == "succeeded"
        times: dict[str, list[float]] = {"microvm": [], "ns": []}
        for n in range(args.runs):
            for runtime in ("microvm", "ns"):
                times[runtime].append(build(sbxd, f"b{runtime}", runtime, n))
        mv, ns = statistics.median(times["microvm"]), statistics.median(times["ns"])
        print(f"| build FROM + COPY + RUN, {args.runs} each, interleaved | p50 | min–max |")
        print("|---|---|---|")
        for runtime in ("microvm", "ns"):
            t = times[runtime]
            print(f"| on {runtime} | {statistics.median(t) * 1000:,.0f} ms | "
                  f"{min(t) * 1000:,.0f}–{max(t) * 1000:,.0f} ms |")
        print(f"| ratio microvm / ns (p50) | {mv / ns:.1f}× | |")
        return 0
    finally:
        if sbxd is not None:
            sbxd.proc.terminate()
            sbxd.proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

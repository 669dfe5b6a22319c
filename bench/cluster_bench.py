"""Scale-out (issue 21, docs/scale.md): what an api replica in front of the nodes costs, and
whether three nodes on one machine keep up with one.

In one run, on one PostgreSQL (Debian's, started here on a unix socket by
tools/pg_test_server.sh):
  single     sbxd --role all on SQLite: today's single process (the peer)
  single_pg  sbxd --role all on the PostgreSQL: one process on the cluster's store, so that
             what the split into replica and node costs is seen apart from what the database
             costs
  cluster    sbxd --role api in front of nodes (--role node), each with its own state dir and
             cgroup parent
Rounds alternate between them and the node addressed directly (the same node, no replica: what
PostgreSQL costs apart from the forwarding). Scenarios (sbx-load): create_cold (create ->
running) and exec (session, attach, exit) p50, through the replica vs the single process and vs
the node itself, as ratios; then
`sustained` (create+exec+delete from 8 workers) through the replica with one node and with
three, cycles/s as a ratio.

Usage: python3 bench/cluster_bench.py [--rounds 3] [--create-n 60] [--exec-n 200]
                                      [--sustained-s 20] [--out bench/results/cluster.json]
(root; uses build/bin)
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

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proc:
    def __init__(self, build: Path, work: Path, name: str, args: list[str], token: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / f"{name}.log", "wb")
        state = work / name
        state.mkdir()
        self.proc = subprocess.Popen(
            [str(build / "bin/sbxd"), "--listen", f"127.0.0.1:{self.port}", "--state-dir",
             str(state), "--admin-token", token, "--log-level", "warn"] + args,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(self.url + "/readyz", timeout=2).status == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, f"sbxd exited: see {self.log.name}"
            assert time.monotonic() < deadline, "sbxd not ready"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def load(build: Path, url: str, token: str, scenarios: str, out: Path, extra: list[str]) -> dict:
    subprocess.run([str(build / "bin/sbx-load"), "--url", url, "--token", token,
                    "--scenarios", scenarios, "--peers", "none", "--out", str(out)] + extra,
                   check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return json.loads(out.read_text())["scenarios"]


def delete_all(url: str, token: str) -> None:
    req = urllib.request.Request(url + "/v1/sandboxes?limit=500",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        for sb in json.loads(r.read())["sandboxes"]:
            if sb["state"] not in ("deleted",):
                d = urllib.request.Request(url + f"/v1/sandboxes/{sb['id']}", method="DELETE",
                                           headers={"Authorization": f"Bearer {token}"})
                try:
                    urllib.request.urlopen(d, timeout=30).read()
                except OSError:
                    pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--create-n", type=int, default=60)
    ap.add_argument("--exec-n", type=int, default=200)
    ap.add_argument("--sustained-s", type=float, default=20)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    build = Path(args.build)
    work = Path(tempfile.mkdtemp(prefix="sbx-cluster-bench-"))
    work.chmod(0o755)
    pg = work / "pg"
    subprocess.run(["bash", str(ROOT / "tools/pg_test_server.sh"), "start", str(pg)], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    token = secrets.token_urlsafe(32)
    tag = secrets.token_hex(3)
    procs: list[Proc] = []
    psql = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))[-1]

    def database() -> str:
        name = "sbxbench_" + secrets.token_hex(4)
        subprocess.run([str(psql), f"postgresql:///postgres?host={pg}&user=sbx", "-qc",
                        f"CREATE DATABASE {name}"], check=True, timeout=60)
        return f"postgresql:///{name}?host={pg}&user=sbx"

    def start(name: str, extra: list[str]) -> Proc:
        p = Proc(build, work, name, extra, token)
        procs.append(p)
        return p

    def cluster(nodes: int) -> tuple[Proc, list[Proc]]:
        url = database()
        common = ["--store", url, "--node-heartbeat-ms", "500", "--node-lost-after-ms", "5000"]
        ns = [start(f"node{nodes}-{i}", ["--role", "node", "--node-name", f"n{i}",
                                          "--cgroup-parent", f"/sbx-bench-{tag}-{nodes}-{i}"]
                    + common) for i in range(nodes)]
        for n in ns:
            n.wait_ready()
        api = start(f"api{nodes}", ["--role", "api"] + common)
        api.wait_ready()
        return api, ns

    result: dict = {"rounds": args.rounds}
    try:
        single = start("single", ["--cgroup-parent", f"/sbx-bench-{tag}-single"])
        single.wait_ready()
        single_pg = start("single_pg", ["--cgroup-parent", f"/sbx-bench-{tag}-single-pg",
                                        "--store", database()])
        single_pg.wait_ready()
        api, nodes = cluster(1)
        who_all = ("single", "single_pg", "node", "replica")
        p50 = {w: {"create_cold": [], "exec": []} for w in who_all}
        for r in range(args.rounds):
            for who, url in (("single", single.url), ("single_pg", single_pg.url),
                             ("node", nodes[0].url), ("replica", api.url)):
                s = load(build, url, token, "create_cold,exec", work / f"{who}-{r}.json",
                         ["--create-n", str(args.create_n), "--exec-n", str(args.exec_n)])
                for k in ("create_cold", "exec"):
                    p50[who][k].append(s[k]["p50_ms"])
                delete_all(url, token)
        for k in ("create_cold", "exec"):
            a, g, n, b = (statistics.median(p50[w][k]) for w in who_all)
            result[k] = {"single_p50_ms": p50["single"][k],
                         "single_pg_p50_ms": p50["single_pg"][k],
                         "node_p50_ms": p50["node"][k],
                         "replica_p50_ms": p50["replica"][k], "ratio": round(b / a, 3),
                         "ratio_to_single_pg": round(b / g, 3),
                         "ratio_to_node": round(b / n, 3)}
            print(f"{k}: p50 single process on SQLite {a:.2f} ms, on PostgreSQL {g:.2f} ms, "
                  f"the node itself {n:.2f} ms, through a replica {b:.2f} ms; replica/single "
                  f"{b / a:.3f}, replica/single on PostgreSQL {b / g:.3f}, replica/node "
                  f"{b / n:.3f}")
        for p in (single, single_pg):  # idle from here on, but not to share the CPU
            p.stop()
        sustained = {}
        s1 = load(build, api.url, token, "sustained", work / "sustained-1.json",
                  ["--sustained-s", str(args.sustained_s)])["sustained"]
        sustained["one_node_cycles_s"] = s1["throughput"]["value"]
        delete_all(api.url, token)
        for p in [api] + nodes:
            p.stop()
        api3, nodes3 = cluster(3)
        s3 = load(build, api3.url, token, "sustained", work / "sustained-3.json",
                  ["--sustained-s", str(args.sustained_s)])["sustained"]
        sustained["three_nodes_cycles_s"] = s3["throughput"]["value"]
        sustained["one_node"] = s1
        sustained["three_nodes"] = s3
        if sustained["one_node_cycles_s"] and sustained["three_nodes_cycles_s"]:
            sustained["ratio"] = round(sustained["three_nodes_cycles_s"] / sustained["one_node_cycles_s"], 3)
        result["sustained"] = sustained
        print(f"sustained create+exec+delete through a replica: one node "
              f"{sustained['one_node_cycles_s']} cycles/s, three nodes {sustained['three_nodes_cycles_s']} "
              f"cycles/s, ratio {sustained.get('ratio')}")
        delete_all(api3.url, token)
        text = json.dumps(result, indent=2)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 0
    finally:
        for p in procs:
            p.stop()
        # The cgroup parents sbxd made (empty once every sandbox went); a non-empty one stays.
        for root in [Path("/sys/fs/cgroup")] + list(Path("/sys/fs/cgroup").iterdir()):
            for d in root.glob(f"sbx-bench-{tag}-*") if root.is_dir() else []:
                try:
                    d.rmdir()
                except OSError as e:
                    print(f"cgroup parent left: {d}: {e}")
        subprocess.run(["bash", str(ROOT / "tools/pg_test_server.sh"), "stop", str(pg)],
                       timeout=120, stdout=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

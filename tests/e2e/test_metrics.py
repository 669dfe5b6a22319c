"""GET /metrics: the Prometheus exposition, and counters that move by exactly what happened.

The daemon is shared by the whole pytest session, so the checks compare two scrapes taken
around a known sequence of calls; tests run one at a time, and a test's sandboxes are deleted
(and waited for) before the next test starts, so nothing else moves these counters meanwhile.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections import Counter, defaultdict

import pytest

from conftest import not_applicable_on_fake_runtime, skip_or_fail

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # Debian's python3-prometheus-client (tools/install-deps.sh)
    text_string_to_metric_families = None

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STDOUT_BYTES = 200_003  # more than one agent read, so the attach batches several events
STDERR_BYTES = 4_321
KINDS = ("create", "delete", "pause", "suspend", "wake")
RESULTS = ("succeeded", "failed", "cancelled")
LIVE_STATES = ("creating", "running", "paused", "suspended", "failed", "deleting", "lost")


class Scrape:
    """One parsed scrape: sample (name, labels) -> value, and the families' types."""

    def __init__(self, text: str):
        self.text = text
        self.samples: dict[tuple[str, frozenset], float] = {}
        self.types: dict[str, str] = {}
        self.families = list(text_string_to_metric_families(text))
        for fam in self.families:
            self.types[fam.name] = fam.type
            for s in fam.samples:
                key = (s.name, frozenset(s.labels.items()))
                assert key not in self.samples, f"duplicate series {s.name}{s.labels}"
                self.samples[key] = s.value

    def get(self, name: str, **labels) -> float:
        key = (name, frozenset(labels.items()))
        assert key in self.samples, f"{name}{labels} is not exposed; have: " + \
            ", ".join(sorted({n for n, _ in self.samples}))
        return self.samples[key]

    def series(self, name: str) -> dict[frozenset, float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


@pytest.fixture
def prom():
    if text_string_to_metric_families is None:
        skip_or_fail("prometheus_client is not importable: run the suite with /usr/bin/python3 "
                     "(Debian's python3-prometheus-client, tools/install-deps.sh)")


def scrape(api) -> Scrape:
    resp = api.call("GET", "/metrics", expect=200)
    assert resp.headers["Content-Type"] == CONTENT_TYPE, resp.headers
    assert resp.headers.get("Cache-Control") == "no-store", resp.headers
    return Scrape(resp.text)


def check_histograms(s: Scrape) -> int:
    """Every histogram: cumulative buckets never decrease, +Inf is last and equals _count."""
    checked = 0
    for fam in s.families:
        if fam.type != "histogram":
            continue
        buckets: dict[frozenset, list[tuple[float, float]]] = defaultdict(list)
        counts: dict[frozenset, float] = {}
        sums: dict[frozenset, float] = {}
        for smp in fam.samples:
            rest = frozenset((k, v) for k, v in smp.labels.items() if k != "le")
            if smp.name.endswith("_bucket"):
                buckets[rest].append((float(smp.labels["le"]), smp.value))
            elif smp.name.endswith("_count"):
                counts[rest] = smp.value
            elif smp.name.endswith("_sum"):
                sums[rest] = smp.value
        assert buckets, f"histogram {fam.name} has no series"
        for labels, bs in buckets.items():
            where = f"{fam.name}{dict(labels)}"
            les = [le for le, _ in bs]
            assert les == sorted(les) and len(set(les)) == len(les), f"{where}: le out of order: {les}"
            assert math.isinf(les[-1]) and les[-1] > 0, f"{where}: last bucket must be +Inf: {les}"
            values = [v for _, v in bs]
            assert all(a <= b for a, b in zip(values, values[1:])), f"{where}: buckets decrease: {values}"
            assert values[-1] == counts[labels], f"{where}: +Inf {values[-1]} != _count {counts[labels]}"
            assert sums[labels] >= 0, f"{where}: negative _sum"
            if counts[labels] == 0:
                assert sums[labels] == 0, f"{where}: _sum without observations"
            checked += 1
    return checked


def test_metrics_requires_the_admin_token(api, prom):
    for token in (None, "not-the-token"):
        resp = api.call("GET", "/metrics", token=token, expect=401)
        assert resp.body["error"]["code"] == "unauthenticated", resp.body
    # Another method is 405 once authenticated (the contract documents GET only).
    resp = api.call("POST", "/metrics", json_body={}, validate=False, expect=405)
    assert resp.body["error"]["code"] == "method_not_allowed", resp.body


def test_metrics_refuse_an_attach_token(api, sandbox, prom):
    session = api.create_session(sandbox["id"], ["true"])
    resp = api.call("GET", "/metrics", token=session["attach"]["token"], expect=401)
    assert resp.body["error"]["code"] == "unauthenticated", resp.body
    # Not started: nothing attached, so the session never ran.
    assert api.get_session(session["session_id"])["state"] == "created"


def test_metrics_move_by_exactly_what_happened(api, sbxd, prom):
    # Every response this client receives, by (method, code): what sbx_http_requests_total
    # must have counted between the scrapes.
    responses: Counter = Counter()

    def count(resp, *args, **kwargs):
        responses[(resp.request.method, str(resp.status_code))] += 1

    before = scrape(api)
    api.session.hooks["response"].append(count)
    t_before = time.time()

    created = api.create_sandbox({"labels": {"e2e": "metrics"}})
    sid = created["sandbox"]["id"]
    warm = created["operation"]["result"] == {"warm_pool": True}
    code = (f"import sys\n"
            f"sys.stdout.write('o' * {STDOUT_BYTES}); sys.stdout.flush()\n"
            f"sys.stderr.write('e' * {STDERR_BYTES}); sys.stderr.flush()\n")
    result = api.run(sid, ["python3", "-c", code])
    assert result.exit["exit_code"] == 0, result.exit
    assert len(result.stdout) == STDOUT_BYTES and len(result.stderr) == STDERR_BYTES
    op = api.delete_sandbox(sid)
    assert op["state"] == "succeeded", op

    api.session.hooks["response"].remove(count)
    # The delete's job counts it just after committing it, so a scrape can come a moment
    # early; scrape again (bounded) until it is counted. Each scrape is a GET 200 of its own.
    scrapes = 0
    for _ in range(100):
        after = scrape(api)
        scrapes += 1
        if after.get("sbx_operations_total", kind="delete", result="succeeded") > \
                before.get("sbx_operations_total", kind="delete", result="succeeded"):
            break
        time.sleep(0.05)

    def delta(name, **labels):
        return after.get(name, **labels) - before.get(name, **labels)

    # Operations: exactly one create and one delete, both succeeded; nothing else finished.
    for kind in KINDS:
        for res in RESULTS:
            want = 1 if (kind, res) in (("create", "succeeded"), ("delete", "succeeded")) else 0
            assert delta("sbx_operations_total", kind=kind, result=res) == want, (kind, res)
        want = 1 if kind in ("create", "delete") else 0
        assert delta("sbx_operation_duration_seconds_count", kind=kind) == want, kind
    # The create reached running once, from the pool or launched, as its operation says.
    for source in ("warm", "cold"):
        want = 1 if (source == "warm") == warm else 0
        assert delta("sbx_sandbox_create_to_running_seconds_count", runtime=sbxd.runtime,
                     source=source) == want, (source, created["operation"])
    took = delta("sbx_sandbox_create_to_running_seconds_sum", runtime=sbxd.runtime,
                 source="warm" if warm else "cold")
    assert 0 < took < 120, took

    # Sessions and output: one session started and ended; every byte printed reached us once.
    assert delta("sbx_sessions_started_total") == 1
    assert delta("sbx_sessions_active") == 0
    assert delta("sbx_oom_kills_total") == 0
    assert delta("sbx_streamed_bytes_total", stream="stdout") == STDOUT_BYTES
    assert delta("sbx_streamed_bytes_total", stream="stderr") == STDERR_BYTES
    assert after.get("sbx_attach_streams_active") == before.get("sbx_attach_streams_active")

    # Every live state is reported, and the sandbox left them as it found them.
    assert set(after.series("sbx_sandboxes")) == {frozenset({("state", s)}) for s in LIVE_STATES}
    for state in LIVE_STATES:
        assert delta("sbx_sandboxes", state=state) == 0, state

    # HTTP: the server counted exactly the responses this client received (the first scrape
    # and all but the last of the others included; the last is counted after its body was built).
    responses[("GET", "200")] += scrapes
    got = {(dict(k)["method"], dict(k)["code"]): v for k, v in after.series("sbx_http_requests_total").items()}
    had = {(dict(k)["method"], dict(k)["code"]): v for k, v in before.series("sbx_http_requests_total").items()}
    moved = {k: got[k] - had.get(k, 0) for k in got if got[k] != had.get(k, 0)}
    assert moved == dict(responses), f"server counted {moved}, client received {dict(responses)}"
    assert responses[("POST", "202")] == 1 and responses[("DELETE", "202")] == 1

    # The store was timed: the create and delete wrote operations and committed.
    for op_name in ("PutOperation", "PutSandbox", "Commit", "CountLiveSandboxesByState"):
        assert delta("sbx_store_query_duration_seconds_count", op=op_name) >= 1, op_name

    # Histograms are well-formed in both scrapes.
    assert check_histograms(before) > 0 and check_histograms(after) > 0

    # Build info: one series, this daemon's runtime, a version and a commit.
    info = after.series("sbx_build_info")
    assert len(info) == 1, info
    labels, value = next(iter(info.items()))
    labels = dict(labels)
    assert value == 1 and labels["runtime"] == sbxd.runtime, labels
    assert labels["version"] and labels["commit"], labels

    # Process metrics are this process's, read at scrape.
    assert after.types["process_cpu_seconds"] == "counter"
    assert after.get("process_cpu_seconds_total") >= before.get("process_cpu_seconds_total") > 0
    assert after.get("process_resident_memory_bytes") > 1 << 20
    assert after.get("process_open_fds") > 3
    assert after.get("process_max_fds") >= after.get("process_open_fds")
    start = after.get("process_start_time_seconds")
    assert start == before.get("process_start_time_seconds")
    assert sbxd.proc is not None and start <= t_before and start > t_before - 24 * 3600, start


def test_exits_nobody_watched_reach_the_metrics(api, sandbox, sbxd, prom):
    """A session that exits while no client is attached, and one killed by the OOM killer the
    same way, leave sbx_sessions_active and reach sbx_oom_kills_total without anyone reading
    them: the timers ask the agent every few seconds (kSessionRefresh, 5 s)."""
    sid = sandbox["id"]

    def start_and_detach(argv):
        session = api.create_session(sid, argv)
        with api.attach(session) as stream:
            for ev in stream.events():
                if ev.event == "stdout":
                    break  # it printed: started; detach and leave it running
                assert ev.event != "process_exited", ev
        return session["session_id"]

    # Each prints for a while after we detach, so that sbxd's next write finds the client
    # gone and ends its side of the stream, then goes quiet and ends with nobody attached.
    ticks = "i=0; while [ $i -lt 20 ]; do echo tick; i=$((i+1)); sleep 0.1; done; sleep 2"
    short = start_and_detach(["sh", "-c", f"echo started; {ticks}; exit 3"])
    oom = None
    if sbxd.runtime == "ns":
        bomb = ("import time\n"
                "for _ in range(20): print('tick', flush=True); time.sleep(0.1)\n"
                "time.sleep(2)\n"
                "chunks = []\n"
                "while True: chunks.append(bytearray(64 << 20))\n")
        oom = start_and_detach(["python3", "-c", bomb])
    mid = scrape(api)
    ours = 1 if oom is None else 2
    assert mid.get("sbx_sessions_active") >= ours

    deadline = time.monotonic() + 60
    while True:
        now = scrape(api)
        done = now.get("sbx_sessions_active") <= mid.get("sbx_sessions_active") - ours
        if oom is not None:
            done = done and now.get("sbx_oom_kills_total") >= mid.get("sbx_oom_kills_total") + 1
        if done:
            break
        assert time.monotonic() < deadline, \
            f"unwatched exits never reached the metrics: active {now.get('sbx_sessions_active')}, " \
            f"oom kills {now.get('sbx_oom_kills_total')} (at start {mid.get('sbx_sessions_active')}, " \
            f"{mid.get('sbx_oom_kills_total')})"
        time.sleep(0.5)
    # The store has the results too (the refresh recorded them; these reads find them there).
    info = api.get_session(short)
    assert info["state"] == "exited" and info["exit_code"] == 3, info
    if oom is not None:
        info = api.get_session(oom)
        assert info["state"] == "exited" and info["oom_killed"] is True, info


# "The internet" for the egress test: a network namespace this test makes, whose one host has
# these addresses (on its lo) and listens on TCP 80 and UDP 53 of both.
INTERNET_V4 = "10.254.0.1"
INTERNET_V6 = "fd00:5b::1"
LISTENER = f"""
import select, socket, sys, json
socks, got = [], {{"accepted": 0, "datagrams": 0}}
for fam, addr in ((socket.AF_INET, "{INTERNET_V4}"), (socket.AF_INET6, "{INTERNET_V6}")):
    t = socket.socket(fam, socket.SOCK_STREAM); t.bind((addr, 80)); t.listen(8); socks.append(t)
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((addr, 53)); socks.append(u)
def take(ready):
    for s in ready:
        if s is sys.stdin:
            continue
        if s.type == socket.SOCK_STREAM:
            s.accept()[0].close(); got["accepted"] += 1
        else:
            s.recvfrom(64); got["datagrams"] += 1
print("ready", flush=True)
while True:
    r, _, _ = select.select(socks + [sys.stdin], [], [], 60)
    take(r)
    if not r or sys.stdin in r:
        break  # the test closed our stdin (or forgot us: bounded)
while True:  # what arrived before the end is queued: take it all
    r, _, _ = select.select(socks, [], [], 0.5)
    if not r:
        break
    take(r)
print(json.dumps(got), flush=True)
"""


@pytest.fixture
def internet():
    """Yields a function that stops the stand-in internet's listener and returns what reached it
    besides its own probe."""
    name = f"sbx-e2e-inet-{os.getpid()}"
    ip = lambda *args: subprocess.run(["ip", "-n", name, *args], check=True, capture_output=True)
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    listener = None
    try:
        ip("link", "set", "lo", "up")
        ip("addr", "add", f"{INTERNET_V4}/32", "dev", "lo")
        ip("addr", "add", f"{INTERNET_V6}/128", "dev", "lo")
        listener = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c", LISTENER],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "ready"

        def stop() -> dict:
            # A probe from inside the namespace first, so a listener that hears nothing is
            # known to be able to hear: it must report exactly the probe.
            probe = (f"import socket\n"
                     f"socket.create_connection(('{INTERNET_V4}', 80), timeout=5).close()\n"
                     f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'p', ('{INTERNET_V4}', 53))\n")
            subprocess.run(["ip", "netns", "exec", name, "python3", "-c", probe], check=True,
                           timeout=30)
            out, _ = listener.communicate(timeout=30)
            got = json.loads(out)
            got["accepted"] -= 1
            got["datagrams"] -= 1
            return got

        yield stop
    finally:
        if listener is not None and listener.poll() is None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_denied_egress_is_counted(api, sbxd, prom, internet):
    """Egress profile none: a sandbox's connects and sends to a host outside it fail at once
    (no route), nothing reaches the host, and sbx_egress_denied_total{sandbox, reason="no_route"}
    counts each one, as the sandbox's GET egress does: read from the sandbox's network namespace
    every 5 s, and a last time at delete (the series stays a while for the scrapers)."""
    not_applicable_on_fake_runtime("the fake runtime runs sandboxes in the host's network namespace")
    sid = api.create_sandbox({"labels": {"e2e": "egress"}})["sandbox"]["id"]
    key = ("sbx_egress_denied_total", frozenset({"sandbox": sid, "reason": "no_route"}.items()))
    code = (f"import errno, json, socket\n"
            f"out = {{}}\n"
            f"for fam, addr in ((socket.AF_INET, '{INTERNET_V4}'), (socket.AF_INET6, '{INTERNET_V6}')):\n"
            f"    for kind in ('tcp', 'udp'):\n"
            f"        try:\n"
            f"            if kind == 'tcp':\n"
            f"                s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(5); s.connect((addr, 80))\n"
            f"            else:\n"
            f"                socket.socket(fam, socket.SOCK_DGRAM).sendto(b'x', (addr, 53))\n"
            f"            out[kind + addr] = 'sent'\n"
            f"        except OSError as e:\n"
            f"            out[kind + addr] = errno.errorcode.get(e.errno, str(e))\n"
            f"print(json.dumps(out))\n")
    result = api.run(sid, ["python3", "-c", code])
    assert result.exit["exit_code"] == 0, (result.exit, result.stderr)
    outcomes = json.loads(result.stdout)
    assert set(outcomes.values()) == {"ENETUNREACH"}, outcomes

    # The periodic reading.
    deadline = time.monotonic() + 30
    while True:
        moved = scrape(api).samples.get(key, 0)
        if moved >= len(outcomes) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert moved == len(outcomes), f"counted {moved} denied packets, the sandbox tried {len(outcomes)}"
    eg = api.call("GET", f"/v1/sandboxes/{sid}/egress", expect=200).body
    assert eg["denied"]["no_route"] == len(outcomes), eg

    # Two more, then the delete: its last reading counts them, and nothing is counted twice.
    result = api.run(sid, ["python3", "-c", code])
    assert set(json.loads(result.stdout).values()) == {"ENETUNREACH"}, result.stdout
    op = api.delete_sandbox(sid)
    assert op["state"] == "succeeded", op
    assert scrape(api).samples.get(key) == 2 * len(outcomes)

    got = internet()
    assert got == {"accepted": 0, "datagrams": 0}, f"traffic reached the host outside: {got}"


def test_warm_pool_gauges(api, prom):
    s = scrape(api)
    ready = s.series("sbx_warm_pool_ready")
    target = s.series("sbx_warm_pool_target")
    # sbxd's default is --warm-pool base=2 on its default runtime.
    assert set(ready) == set(target) and ready, (ready, target)
    for labels, n in target.items():
        assert n >= 1 and 0 <= ready[labels] <= n, (dict(labels), ready[labels], n)

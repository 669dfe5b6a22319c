"""Guest file I/O: /v1/sandboxes/{id}/files[:list|:stat|:mkdir|:move] (docs/api.md, "Files")."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import tarfile
import time
import uuid
from urllib.parse import urlencode, urlsplit

import pytest

from conftest import ns_runtime_only
from sbx_client import SseStream


def files_url(sid: str, what: str = "files") -> str:
    return f"/v1/sandboxes/{sid}/{what}"


def put(api, sid, path, data, expect=200, **params):
    return api.call("PUT", files_url(sid), params={"path": path, **params}, data=data,
                    headers={"Content-Type": "application/octet-stream"}, expect=expect)


def get(api, sid, path, expect=200, headers=None):
    return api.call("GET", files_url(sid), params={"path": path}, headers=headers, expect=expect)


def stat(api, sid, path, expect=200):
    return api.call("GET", files_url(sid, "files:stat"), params={"path": path}, expect=expect).body


def listing(api, sid, path, depth=None):
    params = {"path": path}
    if depth is not None:
        params["depth"] = str(depth)
    return api.call("GET", files_url(sid, "files:list"), params=params, expect=200).body


def in_sandbox(api, sid, script: str) -> bytes:
    r = api.run(sid, ["sh", "-c", script])
    assert r.exit["exit_code"] == 0, (script, r.exit, r.stderr)
    return r.stdout


def still_works(api, sid):
    """The sandbox keeps serving files and sessions after a bad request."""
    probe = f"/srv/probe-{uuid.uuid4().hex}"
    put(api, sid, probe, b"alive", mkdirs="true")
    assert get(api, sid, probe).content == b"alive"
    assert in_sandbox(api, sid, f"cat {probe}") == b"alive"
    api.call("DELETE", files_url(sid), params={"path": probe}, expect=200)


def test_write_read_stat_list_delete(api, sandbox):
    sid = sandbox["id"]
    body = put(api, sid, "/srv/e2e/dir/hello.txt", b"hello files\n", mkdirs="true").body
    e = body["entry"]
    assert e["path"] == "/srv/e2e/dir/hello.txt" and e["type"] == "file" and e["size"] == 12, e
    assert e["mode"] == 0o644, e
    resp = get(api, sid, "/srv/e2e/dir/hello.txt")
    assert resp.content == b"hello files\n"
    assert resp.headers["Content-Type"] == "application/octet-stream"
    # The sandbox's own processes see the same file.
    assert in_sandbox(api, sid, "cat /srv/e2e/dir/hello.txt") == b"hello files\n"
    # Relative paths are relative to the workdir (/).
    assert get(api, sid, "srv/e2e/dir/hello.txt").content == b"hello files\n"

    st = stat(api, sid, "/srv/e2e/dir")["entry"]
    assert st["type"] == "directory" and st["name"] == "dir", st
    names = [x["path"] for x in listing(api, sid, "/srv/e2e")["entries"]]
    assert names == ["/srv/e2e/dir"], names
    deep = listing(api, sid, "/srv/e2e", depth=2)
    assert [x["path"] for x in deep["entries"]] == ["/srv/e2e/dir", "/srv/e2e/dir/hello.txt"]
    assert deep["truncated"] is False

    # Overwrite is atomic and leaves no temporary file behind.
    put(api, sid, "/srv/e2e/dir/hello.txt", b"second")
    assert get(api, sid, "/srv/e2e/dir/hello.txt").content == b"second"
    assert [x["name"] for x in listing(api, sid, "/srv/e2e/dir")["entries"]] == ["hello.txt"]

    # A body with a Content-Length far above the 1 MiB limit of other routes, announced with
    # Expect: 100-continue (sbxd answers 100 before reading it).
    big = os.urandom(3 << 20)
    api.call("PUT", files_url(sid), params={"path": "/srv/e2e/3mib"}, data=big,
             headers={"Content-Type": "application/octet-stream", "Expect": "100-continue"},
             expect=200)
    assert get(api, sid, "/srv/e2e/3mib").content == big
    # Other routes keep their 1 MiB limit.
    r = api.call("POST", f"/v1/sandboxes/{sid}/sessions", data=b"{" + b" " * (2 << 20) + b"}",
                 headers={"Content-Type": "application/json"}, expect=413)
    assert r.body["error"]["code"] == "payload_too_large"

    # An empty body makes an empty file.
    put(api, sid, "/srv/e2e/empty", b"")
    assert get(api, sid, "/srv/e2e/empty").content == b""

    api.call("DELETE", files_url(sid), params={"path": "/srv/e2e/dir/hello.txt"}, expect=200)
    r = get(api, sid, "/srv/e2e/dir/hello.txt", expect=404)
    assert r.body["error"]["code"] == "not_found"
    still_works(api, sid)


def test_mode_and_owner(api, sandbox):
    sid = sandbox["id"]
    e = put(api, sid, "/srv/owned", b"x", mode="600", uid="1000", gid="1001").body["entry"]
    assert e["mode"] == 0o600 and e["uid"] == 1000 and e["gid"] == 1001, e
    assert in_sandbox(api, sid, "stat -c '%a %u %g' /srv/owned") == b"600 1000 1001\n"
    e = put(api, sid, "/srv/rootowned", b"x", owner="root", mode="0755").body["entry"]
    assert e["mode"] == 0o755 and e["uid"] == 0 and e["gid"] == 0, e
    r = put(api, sid, "/srv/bad", b"x", mode="999", expect=400)
    assert r.body["error"]["details"]["field"] == "mode"
    r = put(api, sid, "/srv/bad", b"x", owner="no-such-user-e2e", expect=400)
    assert r.body["error"]["code"] == "unknown_user"
    # The directories a write makes (mkdirs) go to the file's owner, as `mkdir -p` run by that
    # user would leave them; one that was there keeps its owner.
    put(api, sid, "/srv/made/deeper/f", b"x", uid="1000", gid="1001", mkdirs="true")
    assert in_sandbox(api, sid, "stat -c '%u %g' /srv /srv/made /srv/made/deeper /srv/made/deeper/f") == \
        b"0 0\n1000 1001\n1000 1001\n1000 1001\n"
    put(api, sid, "/srv/made/root/f", b"x", mkdirs="true")
    assert in_sandbox(api, sid, "stat -c '%u' /srv/made/root") == b"0\n"
    still_works(api, sid)


def test_range_requests(api, sandbox):
    sid = sandbox["id"]
    data = bytes(range(256)) * 4
    put(api, sid, "/srv/range.bin", data)
    r = get(api, sid, "/srv/range.bin", expect=206, headers={"Range": "bytes=10-19"})
    assert r.content == data[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    r = get(api, sid, "/srv/range.bin", expect=206, headers={"Range": "bytes=1000-"})
    assert r.content == data[1000:]
    r = get(api, sid, "/srv/range.bin", expect=206, headers={"Range": "bytes=-5"})
    assert r.content == data[-5:]
    r = get(api, sid, "/srv/range.bin", expect=206, headers={"Range": "bytes=1020-5000"})
    assert r.content == data[1020:]
    r = get(api, sid, "/srv/range.bin", expect=416, headers={"Range": "bytes=1024-"})
    assert r.headers["Content-Range"] == f"bytes */{len(data)}"
    assert r.body["error"]["code"] == "range_not_satisfiable"
    # Several ranges are not supported: the whole file, as RFC 9110 allows.
    r = get(api, sid, "/srv/range.bin", expect=200, headers={"Range": "bytes=0-1,5-6"})
    assert r.content == data
    still_works(api, sid)


def test_mkdir_move_delete(api, sandbox):
    sid = sandbox["id"]
    mk = lambda body, expect: api.call("POST", files_url(sid, "files:mkdir"), json_body=body,
                                       expect=expect).body
    e = mk({"path": "/srv/m/a/b", "parents": True, "mode": "0700"}, 201)["entry"]
    assert e["type"] == "directory" and e["mode"] == 0o700, e
    assert mk({"path": "/srv/m/a/b", "parents": True}, 201)["entry"]["type"] == "directory"
    assert mk({"path": "/srv/m/a/b"}, 409)["error"]["code"] == "already_exists"
    assert mk({"path": "/srv/nope/x"}, 404)["error"]["code"] == "not_found"
    assert mk({"path": "/srv/m", "bogus": 1}, 400)["error"]["details"]["field"] == "bogus"

    mv = lambda body, expect: api.call("POST", files_url(sid, "files:move"), json_body=body,
                                       expect=expect).body
    put(api, sid, "/srv/m/f1", b"one")
    put(api, sid, "/srv/m/f2", b"two")
    assert mv({"from": "/srv/m/f1", "to": "/srv/m/f2"}, 409)["error"]["code"] == "already_exists"
    e = mv({"from": "/srv/m/f1", "to": "/srv/m/f2", "overwrite": True}, 200)["entry"]
    assert e["path"] == "/srv/m/f2" and e["size"] == 3, e
    assert get(api, sid, "/srv/m/f2").content == b"one"
    get(api, sid, "/srv/m/f1", expect=404)
    mv({"from": "/srv/m/a", "to": "/srv/m/a/b/c"}, 400)

    r = api.call("DELETE", files_url(sid), params={"path": "/srv/m"}, expect=409)
    assert r.body["error"]["code"] == "directory_not_empty"
    api.call("DELETE", files_url(sid), params={"path": "/srv/m", "recursive": "true"}, expect=200)
    stat(api, sid, "/srv/m", expect=404)
    r = api.call("DELETE", files_url(sid), params={"path": "/"}, expect=400)
    still_works(api, sid)


def test_bad_paths(api, sandbox):
    sid = sandbox["id"]
    in_sandbox(api, sid, "mkdir -p /srv/d && echo hi > /srv/d/f")
    # Missing path parameter, empty path, NUL.
    r = api.call("GET", files_url(sid), expect=400)
    assert r.body["error"]["code"] == "invalid_path"
    api.call("GET", files_url(sid), params={"path": ""}, expect=400)
    api.call("GET", files_url(sid) + "?path=/srv/d%00x", expect=400)
    # Invalid UTF-8.
    r = api.call("GET", files_url(sid) + "?path=/srv/%FF%FE", expect=400)
    assert r.body["error"]["code"] == "invalid_path"
    r = api.call("PUT", files_url(sid) + "?path=/srv/%C0%AF", data=b"x", expect=400)
    # Climbing above the root.
    r = get(api, sid, "../../etc/passwd", expect=400)
    assert r.body["error"]["code"] == "path_outside_root"
    r = get(api, sid, "/srv/../../../etc/passwd", expect=400)
    assert r.body["error"]["code"] == "path_outside_root"
    # Over-long names.
    r = get(api, sid, "/srv/" + "a" * 300, expect=400)
    # Missing file, directory where a file is expected (409 is_a_directory), file as a dir.
    assert get(api, sid, "/srv/none", expect=404).body["error"]["code"] == "not_found"
    assert get(api, sid, "/srv/d", expect=409).body["error"]["code"] == "is_a_directory"
    assert put(api, sid, "/srv/d", b"x", expect=409).body["error"]["code"] == "is_a_directory"
    assert get(api, sid, "/srv/d/f/x", expect=409).body["error"]["code"] == "not_a_directory"
    # Unknown route under files, wrong method.
    api.call("GET", files_url(sid, "files:nope"), params={"path": "/"}, expect=404, validate=False)
    api.call("POST", files_url(sid), params={"path": "/srv/d/f"}, expect=405, validate=False)
    # Another sandbox id that does not exist.
    api.call("GET", files_url("sbx_" + "a" * 20), params={"path": "/"}, expect=404)
    still_works(api, sid)


@ns_runtime_only("the fake runtime's files are the host's own")
def test_kernel_file_systems_are_403_and_absent_parents_404(api, sandbox):
    """Changes under /proc (and any kernel interface file system) are refused with 403 whatever
    errno the kernel would give (procfs answers a create with ENOENT); a parent that really is
    absent (the sandbox has no sysfs below /sys) stays 404."""
    sid = sandbox["id"]
    before = in_sandbox(api, sid, "cat /proc/1/oom_score_adj /proc/sys/kernel/hostname")

    def code(resp):
        return resp.body["error"]["code"]

    mk = lambda body, expect: api.call("POST", files_url(sid, "files:mkdir"), json_body=body,
                                       expect=expect)
    mv = lambda body, expect: api.call("POST", files_url(sid, "files:move"), json_body=body,
                                       expect=expect)
    rm = lambda path, expect, **params: api.call("DELETE", files_url(sid),
                                                 params={"path": path, **params}, expect=expect)
    refused = [
        put(api, sid, "/proc/sys/kernel/hostname", b"pwned", expect=403),
        put(api, sid, "/proc/sys/kernel/sbx-new", b"x", expect=403),
        put(api, sid, "/proc/sys/vm/sbx/new", b"x", expect=403, mkdirs="true"),
        put(api, sid, "/proc/1/oom_score_adj", b"1000", expect=403),
        put(api, sid, "/proc/sbx-new", b"x", expect=403),
        api.call("PUT", files_url(sid), params={"path": "/proc/sys/kernel"},
                 data=_tar_bytes([(_info("hostname"), b"pwned")]),
                 headers={"Content-Type": "application/x-tar"}, expect=403),
        mk({"path": "/proc/sys/sbx-dir"}, 403),
        mk({"path": "/proc/1/sbx-dir"}, 403),
        mk({"path": "/proc/sys/sbx-a/b", "parents": True}, 403),
        mv({"from": "/etc/hostname", "to": "/proc/sys/kernel/sbx-moved"}, 403),
        mv({"from": "/proc/sys/kernel/hostname", "to": "/srv/moved"}, 403),
        mv({"from": "/proc/1/environ", "to": "/proc/1/sbx-moved"}, 403),
        rm("/proc/sys/kernel/hostname", 403),
        rm("/proc/sys/sbx-absent", 403),
        rm("/proc/1/environ", 403),
        rm("/proc/1", 403),
        # Mount points of the sandbox: refused before a recursive delete empties them.
        rm("/proc", 403, recursive="true"),
        rm("/tmp", 403, recursive="true"),
        mv({"from": "/tmp", "to": "/srv/tmp-moved"}, 403),
    ]
    for r in refused:
        assert code(r) in ("permission_denied", "read_only_filesystem"), r.body
    absent = [
        put(api, sid, "/sys/kernel/sbx-new", b"x", expect=404),
        mk({"path": "/sys/kernel/sbx-dir"}, 404),
        rm("/sys/kernel/sbx-absent", 404),
        mv({"from": "/sys/kernel/sbx-absent", "to": "/srv/x"}, 404),
        mv({"from": "/etc/hostname", "to": "/sys/kernel/sbx-moved"}, 404),
    ]
    for r in absent:
        assert code(r) == "not_found", r.body
    # Nothing changed, /tmp kept what the sandbox had in it, and the sandbox still works.
    in_sandbox(api, sid, "echo kept > /tmp/kept")
    rm("/tmp", 403, recursive="true")
    assert in_sandbox(api, sid, "cat /tmp/kept") == b"kept\n"
    assert in_sandbox(api, sid, "cat /proc/1/oom_score_adj /proc/sys/kernel/hostname") == before
    assert get(api, sid, "/etc/hostname").status_code == 200
    still_works(api, sid)


def test_symlink_escapes_stay_inside(api, sandbox, sbxd):
    sid = sandbox["id"]
    # A file of the host that the sandbox cannot see.
    host_secret = sbxd.tmp / f"host-secret-{uuid.uuid4().hex}"
    host_secret.write_bytes(b"host only\n")
    try:
        in_sandbox(api, sid, f"mkdir -p /srv/s && cd /srv/s && ln -s / escape && "
                             f"ln -s {host_secret} abs && ln -s ../../../../../.. up && "
                             f"ln -s {sbxd.tmp} hostdir && echo mine > /srv/s/own")
        # Through `escape` (-> /) the sandbox's own files are reached, never the host's.
        assert get(api, sid, "/srv/s/escape/srv/s/own").content == b"mine\n"
        get(api, sid, f"/srv/s/escape{host_secret}", expect=404)
        get(api, sid, "/srv/s/abs", expect=404)
        get(api, sid, f"/srv/s/hostdir/{host_secret.name}", expect=404)
        get(api, sid, f"/srv/s/up{host_secret}", expect=404)
        assert get(api, sid, "/srv/s/up/srv/s/own").content == b"mine\n"
        # /etc/shadow through the escape is the sandbox's view of /etc/shadow.
        via_escape = api.call("GET", files_url(sid), params={"path": "/srv/s/escape/etc/shadow"})
        direct = api.call("GET", files_url(sid), params={"path": "/etc/shadow"})
        assert via_escape.status_code == direct.status_code
        if direct.status_code == 200:
            assert via_escape.content == direct.content
        # Writes through symlinks land inside too, and a symlink as the last component is
        # replaced, not followed.
        put(api, sid, f"/srv/s/escape/srv/s/written", b"w")
        assert in_sandbox(api, sid, "cat /srv/s/written") == b"w"
        put(api, sid, "/srv/s/abs", b"replaced")
        assert host_secret.read_bytes() == b"host only\n"
        assert stat(api, sid, "/srv/s/abs")["entry"]["type"] == "file"
        # Stat reports a symlink as one, with its target.
        e = stat(api, sid, "/srv/s/escape")["entry"]
        assert e["type"] == "symlink" and e["symlink_target"] == "/", e
        # Deleting through a symlinked directory deletes inside the sandbox.
        api.call("DELETE", files_url(sid), params={"path": "/srv/s/hostdir"}, expect=200)
        assert host_secret.exists()
    finally:
        host_secret.unlink(missing_ok=True)
    still_works(api, sid)


def _stream(total: int, seed: bytes):
    """Deterministic bytes generated on the fly (never all in memory)."""
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB
    sent = 0
    counter = 0
    while sent < total:
        n = min(len(block), total - sent)
        chunk = counter.to_bytes(8, "little") + block[8:n] if n >= 8 else block[:n]
        counter += 1
        sent += n
        yield chunk


def _vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


@ns_runtime_only("measured against the ns runtime's disk")
def test_large_streamed_round_trip(api, sandbox, sbxd, metrics):
    sid = sandbox["id"]
    total = 300 << 20
    want = hashlib.sha256()
    for c in _stream(total, b"e2e-files"):
        want.update(c)
    hwm_before = _vm_hwm_kib(sbxd.proc.pid)
    r = put(api, sid, "/srv/big.bin", _stream(total, b"e2e-files"))
    assert r.body["entry"]["size"] == total
    got = hashlib.sha256()
    size = 0
    with api.call("GET", files_url(sid), params={"path": "/srv/big.bin"}, stream=True,
                  expect=200) as resp:
        for chunk in resp.iter_content(1 << 20):
            got.update(chunk)
            size += len(chunk)
    assert size == total
    assert got.hexdigest() == want.hexdigest()
    out = in_sandbox(api, sid, "sha256sum /srv/big.bin")
    assert out.split()[0].decode() == want.hexdigest()
    hwm_after = _vm_hwm_kib(sbxd.proc.pid)
    metrics.append(f"files: 300 MiB up and down; sbxd VmHWM {hwm_before} KiB -> {hwm_after} KiB")
    # The transfer must not have been buffered: far less than its size.
    assert hwm_after - hwm_before < 100 * 1024, (hwm_before, hwm_after)


@ns_runtime_only("the fake runtime has no disk cap")
def test_upload_pipelined_with_the_next_request(api, sandbox):
    """A body of known length is read straight off the socket (issue 15): exactly its bytes go
    into the file, and the request sent right behind it on the connection is served."""
    sid = sandbox["id"]
    url = urlsplit(api.base_url)
    body = bytes((i * 31 + (i >> 12)) & 0xFF for i in range(700_000))
    query = urlencode({"path": "/srv/pipelined.bin"})
    head = (f"Host: {url.hostname}\r\nAuthorization: Bearer {api.token}\r\n").encode()
    first = (f"PUT /v1/sandboxes/{sid}/files?{query} HTTP/1.1\r\n".encode() + head +
             f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
             .encode() + body)
    second = (f"GET /v1/sandboxes/{sid}/files:stat?{query} HTTP/1.1\r\n".encode() + head +
              b"Connection: close\r\n\r\n")
    data = b""
    with socket.create_connection((url.hostname, url.port), timeout=60) as s:
        s.sendall(first + second)
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 2, data[:2000]
    assert b'"size":700000' in data.split(b"HTTP/1.1 200 OK\r\n")[2], data[:2000]
    assert get(api, sid, "/srv/pipelined.bin").content == body


def test_upload_over_the_disk_cap(api):
    sb = api.create_sandbox({"resources": {"disk_mib": 64}})["sandbox"]
    sid = sb["id"]
    # Known up front from Content-Length: 413 before anything is written.
    r = put(api, sid, "/srv/too-big", b"\0" * ((64 << 20) + 1), expect=413)
    assert r.body["error"]["code"] == "payload_too_large"
    # Chunked: the disk fills up first (507), and no temporary file is left behind.
    r = put(api, sid, "/srv/too-big", _stream(72 << 20, b"cap"), expect=(413, 507))
    assert r.body["error"]["code"] in ("insufficient_storage", "payload_too_large"), r.body
    assert [x["name"] for x in listing(api, sid, "/srv")["entries"]] == []
    stat(api, sid, "/srv/too-big", expect=404)
    still_works(api, sid)


def test_paused_sandbox_is_409(api, sandbox):
    sid = sandbox["id"]
    op = api.call("POST", f"/v1/sandboxes/{sid}/pause", expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    r = api.call("GET", files_url(sid, "files:stat"), params={"path": "/"}, expect=409)
    assert r.body["error"]["code"] == "sandbox_not_running"
    r = put(api, sid, "/srv/x", b"x", expect=409)
    op = api.call("POST", f"/v1/sandboxes/{sid}/wake", expect=202).body["operation"]
    assert api.wait_operation(op["id"])["state"] == "succeeded"
    still_works(api, sid)


def _tar_bytes(members) -> bytes:
    """members: (TarInfo, data or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def _info(name, kind=tarfile.REGTYPE, mode=0o644, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.mtime = 1700000000
    ti.linkname = linkname
    return ti


def test_directory_as_tar_round_trip(api, sandbox):
    sid = sandbox["id"]
    long_name = "n" * 180
    put(api, sid, f"/srv/tree/a/{long_name}", b"long name\n", mkdirs="true")
    put(api, sid, "/srv/tree/a/exec.sh", b"#!/bin/sh\n", mode="755")
    put(api, sid, "/srv/tree/b.bin", bytes(range(256)) * 300)
    in_sandbox(api, sid, "cd /srv/tree && ln -s a/exec.sh link && mkdir empty && mkfifo fifo")
    resp = api.call("GET", files_url(sid), params={"path": "/srv/tree"},
                    headers={"Accept": "application/x-tar"}, expect=200)
    assert resp.headers["Content-Type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tf:
        members = {m.name.rstrip("/"): m for m in tf.getmembers()}
        assert set(members) == {"a", f"a/{long_name}", "a/exec.sh", "b.bin", "link", "empty"}, \
            sorted(members)
        assert tf.extractfile(members[f"a/{long_name}"]).read() == b"long name\n"
        assert tf.extractfile(members["b.bin"]).read() == bytes(range(256)) * 300
        assert members["a/exec.sh"].mode == 0o755
        assert members["link"].issym() and members["link"].linkname == "a/exec.sh"
        assert members["empty"].isdir()

    # Extract it elsewhere in the sandbox and compare through the sandbox's own eyes.
    r = api.call("PUT", files_url(sid), params={"path": "/srv/copy", "mkdirs": "true"},
                 data=resp.content, headers={"Content-Type": "application/x-tar"}, expect=200)
    assert r.body == {"entries": 6, "skipped": 0}, r.body
    out = in_sandbox(api, sid, "cd /srv/tree && find . ! -name fifo | sort | xargs -d '\\n' ls -ld "
                               "--time-style=+ | awk '{print $1, $NF}' > /tmp/a; "
                               "cd /srv/copy && find . | sort | xargs -d '\\n' ls -ld --time-style=+ "
                               "| awk '{print $1, $NF}' > /tmp/b; diff /tmp/a /tmp/b && echo same; "
                               "cmp /srv/tree/b.bin /srv/copy/b.bin && readlink /srv/copy/link")
    assert out == b"same\na/exec.sh\n", out
    still_works(api, sid)


def test_malicious_tars_are_refused_or_contained(api, sandbox):
    sid = sandbox["id"]

    def untar(dest, data, expect):
        return api.call("PUT", files_url(sid), params={"path": dest, "mkdirs": "true"}, data=data,
                        headers={"Content-Type": "application/x-tar"}, expect=expect)

    r = untar("/srv/u1", _tar_bytes([(_info("../escaped"), b"x")]), 400)
    assert r.body["error"]["code"] == "path_outside_root" or r.body["error"]["code"] == "invalid_tar"
    r = untar("/srv/u1", _tar_bytes([(_info("/srv/absolute"), b"x")]), 400)
    assert r.body["error"]["code"] == "invalid_tar"
    stat(api, sid, "/srv/absolute", expect=404)
    stat(api, sid, "/srv/escaped", expect=404)
    # A hard link to a file the same archive made is kept; to anything else, refused.
    untar("/srv/u1", _tar_bytes([(_info("f"), b"x"), (_info("h", tarfile.LNKTYPE, linkname="f"), None)]),
          (200, 201, 204))
    assert stat(api, sid, "/srv/u1/h")["entry"]["size"] == 1
    for target in ("../u0/x", "/etc/hostname", "f", "missing"):
        r = untar("/srv/u3", _tar_bytes([(_info("h", tarfile.LNKTYPE, linkname=target), None)]), 400)
        assert r.body["error"]["code"] == "invalid_tar", (target, r.body)
        stat(api, sid, "/srv/u3/h", expect=404)
    r = untar("/srv/u1", b"this is not a tar archive" * 40, 400)
    assert r.body["error"]["code"] == "invalid_tar"

    # A symlink pointing out, then a file written through it: resolved with the target
    # directory as the root, so /srv means /srv/u2/srv, which does not exist: refused.
    evil = _tar_bytes([(_info("out", tarfile.SYMTYPE, mode=0o777, linkname="/srv"), None),
                       (_info("out/pwned"), b"escaped")])
    r = untar("/srv/u2", evil, 400)
    assert r.body["error"]["code"] == "invalid_tar"
    stat(api, sid, "/srv/pwned", expect=404)
    assert stat(api, sid, "/srv/u2/out")["entry"]["symlink_target"] == "/srv"
    # `..` through a symlink stops at the target directory: the file lands inside it.
    evil = _tar_bytes([(_info("up", tarfile.SYMTYPE, mode=0o777, linkname="../../.."), None),
                       (_info("up/srv/pwned2"), b"contained")])
    untar("/srv/u3", evil, 200)
    stat(api, sid, "/srv/pwned2", expect=404)
    assert get(api, sid, "/srv/u3/srv/pwned2").content == b"contained"
    still_works(api, sid)


_COUNT_WORKERS = ("me=$(cat /proc/1/comm); n=0; for d in /proc/[0-9]*; do "
                  "[ \"${d#/proc/}\" = 1 ] && continue; "
                  "[ \"$(cat $d/comm 2>/dev/null)\" = \"$me\" ] && "
                  "grep -q '^PPid:[[:space:]]*1$' $d/status 2>/dev/null && n=$((n+1)); done; echo $n")


def test_tar_names_keep_their_bytes(api, sandbox):
    # pax stores a non-ASCII name as a UTF-8 "path" record. The agent reads it with libarchive
    # in the C locale and without iconv (src/archive/no_iconv.cc): the name's bytes are kept.
    sid = sandbox["id"]
    name = "caf\u00e9-\u65e5\u672c.txt"
    r = api.call("PUT", files_url(sid), params={"path": "/srv/names", "mkdirs": "true"},
                 data=_tar_bytes([(_info(name), b"utf8")]),
                 headers={"Content-Type": "application/x-tar"}, expect=200)
    assert r.body == {"entries": 1, "skipped": 0}, r.body
    assert in_sandbox(api, sid, "ls /srv/names") == name.encode() + b"\n"
    assert get(api, sid, f"/srv/names/{name}").content == b"utf8"


def _agent_workers(api, sid) -> int:
    return int(in_sandbox(api, sid, _COUNT_WORKERS).strip())


def test_watch_reports_changes_and_ends_with_the_client(api, sandbox):
    sid = sandbox["id"]
    api.call("POST", files_url(sid, "files:mkdir"), json_body={"path": "/srv/w/sub", "parents": True},
             expect=201)
    before = _agent_workers(api, sid)
    watcher = api.clone()
    resp = watcher.call("GET", files_url(sid, "files:watch"),
                        params={"path": "/srv/w", "recursive": "true"},
                        headers={"Accept": "text/event-stream"}, stream=True, expect=200, timeout=60)
    stream = SseStream(resp, watcher.validator)
    events = stream.events()
    assert _agent_workers(api, sid) == before + 1
    seen = []
    ids = []

    def until(event, path):
        """Reads events up to the one given. A sentinel file written last makes a missing event
        fail the test instead of waiting forever (inotify reports in order)."""
        for ev in events:
            assert ev.data["type"] == ev.event, ev
            ids.append(int(ev.id))
            seen.append((ev.event, ev.data["path"], ev.data.get("from")))
            if (ev.event, ev.data["path"]) == (event, path):
                return
            assert ev.data["path"] != "/srv/w/zz-sentinel", (event, path, seen)
        raise AssertionError(f"stream ended before {event} {path}: {seen}")

    # Uploads land by renaming a temporary file: create + modify of the temporary, then move.
    put(api, sid, "/srv/w/a.txt", b"1")
    until("move", "/srv/w/a.txt")
    put(api, sid, "/srv/w/sub/b.txt", b"2")
    until("move", "/srv/w/sub/b.txt")
    api.call("POST", files_url(sid, "files:mkdir"), json_body={"path": "/srv/w/new"}, expect=201)
    # Once its create event is out, a new directory is watched too.
    until("create", "/srv/w/new")
    put(api, sid, "/srv/w/new/c.txt", b"3")
    api.call("POST", files_url(sid, "files:move"),
             json_body={"from": "/srv/w/a.txt", "to": "/srv/w/renamed.txt"}, expect=200)
    api.call("DELETE", files_url(sid), params={"path": "/srv/w/sub/b.txt"}, expect=200)
    put(api, sid, "/srv/w/zz-sentinel", b"")
    until("move", "/srv/w/new/c.txt")
    until("move", "/srv/w/renamed.txt")
    assert seen[-1][2] == "/srv/w/a.txt", seen[-1]
    until("delete", "/srv/w/sub/b.txt")
    assert ids == list(range(1, len(ids) + 1)), ids
    stream.close()
    watcher.close()
    # The worker in the sandbox exits once the client has gone (sbxd notices at its next
    # write, a keep-alive at the latest).
    deadline = time.monotonic() + 60
    while _agent_workers(api, sid) != before:
        assert time.monotonic() < deadline, "the watch worker outlived its client"
        time.sleep(1)
    still_works(api, sid)


def test_watch_errors(api, sandbox):
    sid = sandbox["id"]
    r = api.call("GET", files_url(sid, "files:watch"), params={"path": "/srv/nope"}, expect=404)
    assert r.body["error"]["code"] == "not_found"
    put(api, sid, "/srv/file", b"x")
    r = api.call("GET", files_url(sid, "files:watch"), params={"path": "/srv/file"}, expect=409)
    assert r.body["error"]["code"] == "not_a_directory"
    still_works(api, sid)


def _sbx(sbxd, *args, check=True):
    from conftest import build_dir
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SBX_URL": sbxd.url,
           "SBX_TOKEN": sbxd.token}
    proc = subprocess.run([str(build_dir() / "bin" / "sbx"), *args], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    if check:
        assert proc.returncode == 0, (args, proc.returncode, proc.stderr)
    return proc


def test_cli_cp_ls_rm_mkdir(api, sandbox, sbxd, tmp_path):
    sid = sandbox["id"]
    local = tmp_path / "up"
    (local / "sub").mkdir(parents=True)
    (local / "a.txt").write_bytes(b"alpha\n")
    (local / "sub" / ("n" * 150)).write_bytes(os.urandom(300_000))
    os.symlink("a.txt", local / "link")
    single = tmp_path / "single.bin"
    single.write_bytes(os.urandom(1_000_000))

    _sbx(sbxd, "files", "mkdir", "-p", f"{sid}:/srv/cli")
    _sbx(sbxd, "cp", str(single), f"{sid}:/srv/cli/")       # into the directory, same name
    _sbx(sbxd, "cp", str(local), f"{sid}:/srv/cli/tree")    # a directory, as tar
    assert get(api, sid, "/srv/cli/single.bin").content == single.read_bytes()
    assert get(api, sid, "/srv/cli/tree/a.txt").content == b"alpha\n"
    assert stat(api, sid, "/srv/cli/tree/link")["entry"]["symlink_target"] == "a.txt"

    out = _sbx(sbxd, "files", "ls", f"{sid}:/srv/cli").stdout.decode()
    assert "/srv/cli/single.bin" in out and "/srv/cli/tree" in out, out
    assert out.splitlines()[1].startswith("drwx"), out
    # `sbx ls ID:PATH` is the same listing; without an argument it lists sandboxes.
    assert _sbx(sbxd, "ls", f"{sid}:/srv/cli").stdout.decode() == out
    assert sid in _sbx(sbxd, "ls").stdout.decode()
    bad = _sbx(sbxd, "ls", "not-a-sandbox-path", check=False)
    assert bad.returncode == 2 and b"expected SANDBOX_ID:PATH" in bad.stderr, bad

    down = tmp_path / "down"
    down.mkdir()
    _sbx(sbxd, "cp", f"{sid}:/srv/cli/single.bin", str(down / "s.bin"))
    assert (down / "s.bin").read_bytes() == single.read_bytes()
    _sbx(sbxd, "cp", f"{sid}:/srv/cli/tree", str(down))     # into the existing directory
    got = down / "tree"
    assert (got / "a.txt").read_bytes() == b"alpha\n"
    assert (got / "sub" / ("n" * 150)).read_bytes() == (local / "sub" / ("n" * 150)).read_bytes()
    assert os.readlink(got / "link") == "a.txt"

    bad = _sbx(sbxd, "cp", f"{sid}:/srv/cli/missing", str(down / "x"), check=False)
    assert bad.returncode == 1 and b"no such file" in bad.stderr, bad
    assert not (down / "x").exists() and not (down / "x.sbx-partial").exists()
    bad = _sbx(sbxd, "files", "rm", f"{sid}:/srv/cli/tree", check=False)
    assert bad.returncode == 1 and b"directory_not_empty" in bad.stderr, bad
    _sbx(sbxd, "files", "rm", "-r", f"{sid}:/srv/cli/tree")
    stat(api, sid, "/srv/cli/tree", expect=404)
    usage = _sbx(sbxd, "cp", "a", "b", check=False)
    assert usage.returncode == 2, usage
    still_works(api, sid)

#!/usr/bin/env python3
"""Builds the E2B code-interpreter template `code-interpreter-v1` on an sbxd (issue 19), so that
`Sandbox.create()` of `e2b-code-interpreter` / `@e2b/code-interpreter` and `run_code()` work.

  SBX_URL=http://127.0.0.1:8080 SBX_TOKEN=<operator token> python3 tools/e2b/code-interpreter.py

With an https:// SBX_URL, sbxd's certificate is verified against the system's CAs, or against the
PEM file SBX_CACERT names (as the sbx CLI's --cacert).

1. The parent: a Debian bookworm rootfs made on this host with mmdebstrap (Python 3.11, bash,
   a user `user` 1000:1000 with home /home/user) from the host's configured apt sources, wrapped
   as an OCI archive. Cached by its inputs in $SBX_CACHE_DIR/e2b (default ~/.cache/sbx/e2b).
2. The wheels of clients/e2b/code-interpreter/requirements.lock, fetched with `pip download`
   (CPython 3.11, manylinux x86_64, binary only, hashes checked), cached the same way.
3. The parent is imported (`POST /v1/templates:import`) as code-interpreter-parent:py311-<hash>
   unless that tag already names it; then clients/e2b/code-interpreter/Dockerfile is built
   (`POST /v1/templates:build`) with the wheels and the server in its context, and a start
   command whose readiness check passes once the server answers on port 49999 with its default
   kernel up. The release carries a label with the hash of every input: when the template's
   latest release already has it, nothing is built.

Packages come from the network only here, on the host, through apt's and pip's own
configuration; the build's sandboxes have none.

Options: --lock rewrites requirements.lock from requirements.in (resolving with pip);
--fetch-only stops after steps 1 and 2; --name NAME (default code-interpreter-v1); --no-cache
builds every step again. Prints progress on stderr; at the end `NAME:latest DIGEST` on stdout
and one `timing:` line (seconds per phase) on stderr. Exits non-zero with the reason.
Python 3.11 standard library only.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "clients" / "e2b" / "code-interpreter"
LOCK = SRC / "requirements.lock"
PORT = 49999
PARENT_NAME = "code-interpreter-parent"
SUITE = "bookworm"
PACKAGES = ["python3", "python3-venv", "ca-certificates", "procps"]
# A fixed epoch makes mmdebstrap's tar the same bytes for the same packages.
SOURCE_DATE_EPOCH = "1700000000"
# E2B templates run code as `user`; the rootfs gets it without useradd (not in minbase).
USER_HOOK = ('echo "user:x:1000:1000::/home/user:/bin/bash" >> "$1/etc/passwd"; '
             'echo "user:x:1000:" >> "$1/etc/group"; '
             'echo "user:*:19000:0:99999:7:::" >> "$1/etc/shadow"; '
             'install -d -o 1000 -g 1000 -m 0755 "$1/home/user"')
DPKG_OPTS = ["path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
             "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/locale/*",
             "path-exclude=/usr/share/info/*"]
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
              "--abi", "cp311", "--platform", "manylinux_2_28_x86_64",
              "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
VENV_PY = "/opt/sbx-code-interpreter/venv/bin/python"
START = {
    "cmd": [VENV_PY, "/opt/sbx-code-interpreter/server.py"],
    "ready": [VENV_PY, "-c", "import urllib.request as u; "
              f"u.urlopen('http://127.0.0.1:{PORT}/health', timeout=5)"],
    # The default kernel starts before the check passes: ~1-2 s, more on a loaded host.
    "timeout_s": 120,
}
BUILD_SANDBOX = {"resources": {"memory_mib": 1024, "disk_mib": 4096}}
INPUTS_LABEL = "org.sbx.e2b.code-interpreter.inputs"
OP_TIMEOUT_S = 1800


class Failure(Exception):
    pass


def say(msg: str) -> None:
    print(f"code-interpreter: {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_root() -> Path:
    base = os.environ.get("SBX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sbx")
    return Path(base) / "e2b"


def apt_sources() -> list[Path]:
    """The host's apt sources, which mmdebstrap reads as its mirrors: the configured mirror."""
    found = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    found += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    main = Path("/etc/apt/sources.list")
    if main.is_file() and main.stat().st_size > 0:
        found.insert(0, main)
    return [p for p in found if any(SUITE in line for line in p.read_text().splitlines()
                                    if not line.lstrip().startswith("#"))]


# ---- 1. the parent ------------------------------------------------------------------------------

def parent_key(sources: list[Path]) -> str:
    h = hashlib.sha256()
    recipe = {"suite": SUITE, "packages": PACKAGES, "hook": USER_HOOK, "dpkg": DPKG_OPTS,
              "epoch": SOURCE_DATE_EPOCH, "variant": "minbase", "layout": 1}
    h.update(json.dumps(recipe, sort_keys=True).encode())
    for p in sources:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def fetch_parent(cache: Path) -> tuple[Path, str, str]:
    """Returns (OCI archive, manifest digest, key), from the cache or made now."""
    sources = apt_sources()
    if not sources:
        raise Failure(f"no apt source of this host names {SUITE}: mmdebstrap needs a Debian "
                      f"{SUITE} mirror in /etc/apt/sources.list(.d)")
    key = parent_key(sources)
    final = cache / f"parent-{key[:16]}"
    if (final / "digest").is_file() and (final / "image.tar").is_file():
        say(f"parent: cached {final}")
        return final / "image.tar", (final / "digest").read_text().strip(), key
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise Failure("mmdebstrap is not installed (apt-get install mmdebstrap; "
                      "tools/install-deps.sh installs it)")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="parent-", dir=cache))
    try:
        rootfs = work / "rootfs.tar"
        argv = [exe, "--variant=minbase", "--include=" + ",".join(PACKAGES), "--format=tar",
                "--customize-hook=" + USER_HOOK]
        argv += [f"--dpkgopt={o}" for o in DPKG_OPTS]
        if os.geteuid() != 0:
            argv.append("--mode=unshare")
        argv += [SUITE, str(rootfs)] + [str(p) for p in sources]
        say(f"parent: mmdebstrap {SUITE} with {', '.join(PACKAGES)} (a minute or two)")
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=1800)
        if p.returncode != 0:
            raise Failure(f"mmdebstrap exited with {p.returncode}:\n" + "\n".join(
                p.stdout.splitlines()[-30:]))
        digest = wrap_oci(rootfs, work / "image.tar")
        rootfs.unlink()
        (work / "digest").write_text(digest + "\n")
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
        say(f"parent: made {final} ({(final / 'image.tar').stat().st_size >> 20} MiB, {digest})")
        return final / "image.tar", digest, key
    finally:
        shutil.rmtree(work, ignore_errors=True)


def wrap_oci(rootfs: Path, out: Path) -> str:
    """Packs `rootfs` (a tar) as the only layer of an OCI image layout in the tar `out`; returns
    the manifest's digest, which is the release digest sbxd gives an imported OCI layout."""
    layer_hex, layer_size = sha256_file(rootfs), rootfs.stat().st_size
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                 "LANG=C.UTF-8"],
                         "Cmd": ["/bin/bash"], "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_hex]}}
    ctext = json.dumps(config, sort_keys=True).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": "sha256:" + hashlib.sha256(ctext).hexdigest(),
                           "size": len(ctext)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": "sha256:" + layer_hex, "size": layer_size}]}
    mtext = json.dumps(manifest, sort_keys=True).encode()
    mhex = hashlib.sha256(mtext).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + mhex,
        "size": len(mtext), "platform": {"os": "linux", "architecture": "amd64"},
        "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(SOURCE_DATE_EPOCH)
            t.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        add(f"blobs/sha256/{hashlib.sha256(ctext).hexdigest()}", ctext)
        add(f"blobs/sha256/{mhex}", mtext)
        info = tarfile.TarInfo(f"blobs/sha256/{layer_hex}")
        info.size, info.mode, info.mtime = layer_size, 0o644, int(SOURCE_DATE_EPOCH)
        with open(rootfs, "rb") as f:
            t.addfile(info, f)
    return "sha256:" + mhex


# ---- 2. the wheels ------------------------------------------------------------------------------

def pip() -> list[str]:
    if subprocess.run([sys.executable, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        raise Failure(f"{sys.executable} has no pip (apt-get install python3-pip)")
    return [sys.executable, "-m", "pip"]


def fetch_wheels(cache: Path) -> Path:
    lock = LOCK.read_bytes()
    key = hashlib.sha256(lock + json.dumps(PIP_TARGET).encode()).hexdigest()
    final = cache / f"wheels-{key[:16]}"
    if (final / ".complete").is_file():
        say(f"wheels: cached {final}")
        return final
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheels-", dir=cache))
    try:
        say(f"wheels: pip download of {LOCK.relative_to(REPO)}")
        argv = pip() + ["download", "--no-deps", "--require-hashes", "--disable-pip-version-check",
                        "-q", "-r", str(LOCK), "-d", str(work)] + PIP_TARGET
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=1800)
        if p.returncode != 0:
            raise Failure(f"pip download exited with {p.returncode}:\n" + "\n".join(
                p.stdout.splitlines()[-30:]))
        (work / ".complete").write_text("")
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
        n = len(list(final.glob("*.whl")))
        size = sum(f.stat().st_size for f in final.glob("*.whl")) >> 20
        say(f"wheels: {n} wheels, {size} MiB in {final}")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_lock() -> None:
    """Resolves requirements.in for the template's Python and writes requirements.lock."""
    with tempfile.TemporaryDirectory(prefix="ci-lock-") as d:
        p = subprocess.run(pip() + ["download", "--disable-pip-version-check", "-q", "-r",
                                    str(SRC / "requirements.in"), "-d", d] + PIP_TARGET,
                           stdin=subprocess.DEVNULL, timeout=1800)
        if p.returncode != 0:
            raise Failure(f"pip download exited with {p.returncode}")
        lines = ["# Generated by tools/e2b/code-interpreter.py --lock from requirements.in:",
                 "# CPython 3.11, manylinux x86_64, wheels only. Do not edit by hand."]
        for whl in sorted(Path(d).glob("*.whl"), key=lambda f: f.name.lower()):
            name, version = whl.name.split("-")[:2]
            lines.append(f"{name}=={version} --hash=sha256:{sha256_file(whl)}")
        LOCK.write_text("\n".join(lines) + "\n")
    say(f"wrote {LOCK.relative_to(REPO)}")


# ---- 3. sbxd ------------------------------------------------------------------------------------

class Sbxd:
    def __init__(self, url: str, token: str, cafile: str | None = None):
        self.url = url.rstrip("/")
        self.token = token
        # sbxd is usually on loopback: no proxy from the environment stands between.
        handlers: list = [urllib.request.ProxyHandler({})]
        if cafile:
            try:
                ctx = ssl.create_default_context(cafile=cafile)
            except (OSError, ssl.SSLError) as e:
                raise Failure(f"SBX_CACERT {cafile}: {e}")
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self.opener = urllib.request.build_opener(*handlers)

    def call(self, method: str, path: str, params: dict | None = None, body=None,
             headers: dict | None = None, timeout: float = 60, ok=(200,)):
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        h = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        req = urllib.request.Request(url, data=body, method=method, headers=h)
        try:
            with self.opener.open(req, timeout=timeout) as resp:
                status, data = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise Failure(f"{method} {self.url}{path}: sbxd did not answer: {e}")
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data.decode(errors="replace")
        if status not in ok:
            if status == 401:
                raise Failure(f"{method} {path}: 401: SBX_TOKEN is not a token of this sbxd")
            raise Failure(f"{method} {path}: {status}: {parsed}")
        return status, parsed

    def template(self, name: str) -> dict | None:
        status, body = self.call("GET", f"/v1/templates/{name}", ok=(200, 404))
        return body if status == 200 else None

    def upload(self, path: str, params: dict, archive: Path) -> dict:
        with open(archive, "rb") as f:
            _, body = self.call("POST", path, params=params, body=f, timeout=1800, ok=(202,),
                                headers={"Content-Type": "application/x-tar",
                                         "Content-Length": str(archive.stat().st_size)})
        return body["operation"]

    def wait(self, op: dict, what: str) -> dict:
        """Follows the operation's log (SSE) until it ends; returns it, or fails with its error."""
        deadline = time.monotonic() + OP_TIMEOUT_S
        after, done = 0, None
        while done is None and time.monotonic() < deadline:
            req = urllib.request.Request(
                f"{self.url}/v1/operations/{op['id']}/events?after={after}",
                headers={"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"})
            try:
                with self.opener.open(req, timeout=120) as resp:
                    event, data = "", []
                    for raw in resp:
                        line = raw.decode(errors="replace").rstrip("\r\n")
                        if line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:"):
                            data.append(line[5:].lstrip())
                        elif line.startswith("id:") and line[3:].strip().isdigit():
                            after = int(line[3:].strip())
                        elif line == "":
                            if event == "log" and data:
                                say(f"{what}: {json.loads(chr(10).join(data)).get('line', '')}")
                            elif event == "done" and data:
                                done = json.loads("\n".join(data))
                                break
                            event, data = "", []
            except (urllib.error.URLError, OSError, ValueError) as e:
                # The stream broke (sbxd restarting, a proxy): the operation itself tells.
                say(f"{what}: event stream interrupted ({e}); polling")
                _, cur = self.call("GET", f"/v1/operations/{op['id']}", {"wait_ms": "5000"})
                if cur["state"] in ("succeeded", "failed"):
                    done = cur
        if done is None:
            raise Failure(f"{what}: operation {op['id']} did not end within {OP_TIMEOUT_S} s")
        if done["state"] != "succeeded":
            err = done.get("error") or {}
            raise Failure(f"{what} failed: {err.get('code')}: {err.get('message')}")
        return done


def context_tar(wheels: Path, out: Path) -> None:
    """The build context, written the same way every time so that its bytes (and sbxd's step
    cache) depend only on the files."""
    files = [("Dockerfile", SRC / "Dockerfile"), ("requirements.lock", LOCK),
             ("server/server.py", SRC / "server" / "server.py")]
    files += [(f"wheels/{w.name}", w) for w in sorted(wheels.glob("*.whl"))]
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        for name, path in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, int(SOURCE_DATE_EPOCH)
            with open(path, "rb") as f:
                t.addfile(info, f)


def ensure(args) -> int:
    url, token = os.environ.get("SBX_URL", ""), os.environ.get("SBX_TOKEN", "")
    if not args.fetch_only and (not url or not token):
        raise Failure("set SBX_URL (sbxd's address, e.g. http://127.0.0.1:8080) and SBX_TOKEN "
                      "(an operator token: the template is shared with every tenant)")
    timing = {}
    cache = cache_root()
    t0 = time.monotonic()
    archive, parent_digest, key = fetch_parent(cache)
    timing["fetch_parent"] = time.monotonic() - t0
    t0 = time.monotonic()
    wheels = fetch_wheels(cache)
    timing["fetch_wheels"] = time.monotonic() - t0
    if args.fetch_only:
        print(f"{archive} {parent_digest}\n{wheels}")
        say("timing: " + " ".join(f"{k}={v:.1f}s" for k, v in timing.items()))
        return 0

    sbxd = Sbxd(url, token, os.environ.get("SBX_CACERT") or None)
    parent_ref = f"{PARENT_NAME}:py311-{key[:12]}"
    with tempfile.TemporaryDirectory(prefix="ci-context-") as d:
        ctx = Path(d) / "context.tar"
        context_tar(wheels, ctx)
        inputs = hashlib.sha256(json.dumps({
            "parent": parent_digest, "context": sha256_file(ctx), "start": START,
            "sandbox": BUILD_SANDBOX}, sort_keys=True).encode()).hexdigest()

        have = sbxd.template(args.name)
        if have and not args.no_cache:
            digest = have.get("tags", {}).get("latest")
            rel = next((r for r in have.get("releases", []) if r.get("digest") == digest), {})
            if (rel.get("config") or {}).get("labels", {}).get(INPUTS_LABEL) == inputs:
                say(f"{args.name}:latest is up to date ({digest})")
                print(f"{args.name}:latest {digest}")
                say("timing: " + " ".join(f"{k}={v:.1f}s" for k, v in timing.items()))
                return 0

        t0 = time.monotonic()
        tpl = sbxd.template(PARENT_NAME)
        tag = parent_ref.split(":")[1]
        if tpl and tpl.get("tags", {}).get(tag) == parent_digest:
            say(f"parent: {parent_ref} already imported")
        else:
            say(f"parent: importing {parent_ref} ({archive.stat().st_size >> 20} MiB)")
            op = sbxd.upload("/v1/templates:import", {"name": PARENT_NAME, "tag": tag}, archive)
            done = sbxd.wait(op, "import")
            got = done["result"]["template"]["digest"]
            if got != parent_digest:
                raise Failure(f"the parent imported as {got}, not the {parent_digest} it was made as")
        timing["import"] = time.monotonic() - t0

        t0 = time.monotonic()
        build = {"args": {"PARENT": parent_ref, "INPUTS": inputs}, "sandbox": BUILD_SANDBOX}
        if args.no_cache:
            build["no_cache"] = True
        say(f"build: {args.name}:latest FROM {parent_ref} "
            f"({ctx.stat().st_size >> 20} MiB of context)")
        op = sbxd.upload("/v1/templates:build", {"name": args.name, "tag": "latest",
                                                  "build": json.dumps(build),
                                                  "start": json.dumps(START)}, ctx)
        done = sbxd.wait(op, "build")
        timing["build"] = time.monotonic() - t0
    digest = done["result"]["template"]["digest"]
    print(f"{args.name}:latest {digest}")
    say("timing: " + " ".join(f"{k}={v:.1f}s" for k, v in timing.items()))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", action="store_true", help="rewrite requirements.lock and stop")
    ap.add_argument("--fetch-only", action="store_true", help="fill the cache and stop")
    ap.add_argument("--name", default="code-interpreter-v1")
    ap.add_argument("--no-cache", action="store_true", help="build every step again")
    args = ap.parse_args()
    try:
        if args.lock:
            write_lock()
            return 0
        return ensure(args)
    except Failure as e:
        say(f"ERROR: {e}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""OCI images built by the tests themselves (docs/templates.md): layers as tars made with
Python's tarfile from Debian's busybox-static and small files, written as an OCI layout, and
turned into the archives users bring (docker-archive, oci-archive) or pushed to a registry with
Debian's skopeo. Nothing is fetched from a network."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "ls", "cat", "id", "echo", "test", "stat", "touch", "mkdir", "rm", "pwd",
           "env", "sleep", "true", "false", "wc", "head", "grep"]


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Layer:
    """A layer under construction: add files, dirs, links, whiteouts; bytes() is the tar."""

    def __init__(self):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)

    def _info(self, name, kind, mode, uid=0, gid=0):
        ti = tarfile.TarInfo(name)
        ti.type = kind
        ti.mode = mode
        ti.uid, ti.gid = uid, gid
        ti.mtime = 1700000000
        return ti

    def dir(self, name, mode=0o755, uid=0, gid=0):
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode, uid, gid))
        return self

    def file(self, name, data: bytes | str, mode=0o644, uid=0, gid=0):
        data = data.encode() if isinstance(data, str) else data
        ti = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        ti.size = len(data)
        self.tar.addfile(ti, io.BytesIO(data))
        return self

    def symlink(self, name, target):
        ti = self._info(name, tarfile.SYMTYPE, 0o777)
        ti.linkname = target
        self.tar.addfile(ti)
        return self

    def hardlink(self, name, target):
        ti = self._info(name, tarfile.LNKTYPE, 0o644)
        ti.linkname = target
        self.tar.addfile(ti)
        return self

    def whiteout(self, path):
        d, _, base = path.rpartition("/")
        return self.file((d + "/" if d else "") + ".wh." + base, b"")

    def opaque(self, dirpath):
        return self.file(dirpath.rstrip("/") + "/.wh..wh..opq", b"")

    def bytes(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def busybox_layer(extra_passwd: str = "") -> Layer:
    """A base layer: busybox and its applets in /bin, /etc/passwd and /etc/group."""
    layer = Layer().dir("bin").dir("etc").dir("tmp", 0o1777).dir("root", 0o700)
    layer.file("bin/busybox", Path(BUSYBOX).read_bytes(), 0o755)
    for a in APPLETS:
        layer.symlink(f"bin/{a}", "busybox")
    layer.file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
                             "app:x:1000:1000:app:/home/app:/bin/sh\n" + extra_passwd)
    layer.file("etc/group", "root:x:0:\napp:x:1000:\n")
    layer.dir("home").dir("home/app", 0o755, 1000, 1000)
    return layer


def write_layout(dir: Path, layers: list[bytes], *, env=None, workdir="", user="", cmd=None,
                 entrypoint=None, labels=None, gzip_layers=(), tag="t", arch="amd64",
                 extra_platforms=()) -> dict:
    """Writes an OCI layout of `layers` (bottom first; indexes in gzip_layers compressed) and
    returns {"manifest_digest", "diff_ids", "config_digest"}."""
    blobs = dir / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes) -> str:
        d = sha256(data)
        (blobs / d[7:]).write_bytes(data)
        return d

    diff_ids, descs = [], []
    for i, raw in enumerate(layers):
        diff_ids.append(sha256(raw))
        if i in gzip_layers:
            data = gzip.compress(raw, mtime=0)
            mt = "application/vnd.oci.image.layer.v1.tar+gzip"
        else:
            data = raw
            mt = "application/vnd.oci.image.layer.v1.tar"
        descs.append({"mediaType": mt, "digest": blob(data), "size": len(data)})
    cfg = {"architecture": arch, "os": "linux",
           "config": {"Env": env or ["PATH=/usr/local/bin:/usr/bin:/bin"], "WorkingDir": workdir,
                      "User": user, "Cmd": cmd, "Entrypoint": entrypoint,
                      "Labels": labels or {}},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    ctext = json.dumps(cfg).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": blob(ctext), "size": len(ctext)},
                "layers": descs}
    mtext = json.dumps(manifest).encode()
    mdigest = blob(mtext)
    entries = [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest,
                "size": len(mtext), "platform": {"os": "linux", "architecture": arch},
                "annotations": {"org.opencontainers.image.ref.name": tag}}]
    (dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))
    (dir / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"manifest_digest": mdigest, "diff_ids": diff_ids, "config_digest": sha256(ctext)}


def write_multiarch_layout(dir: Path, per_arch: dict[str, list[bytes]], tag="t") -> dict:
    """An OCI layout whose `tag` is an image index of one image per architecture (as `docker
    buildx` and `skopeo copy --all` write them). Returns {arch: manifest digest, "index": ...}."""
    out, entries = {}, []
    for arch, layers in per_arch.items():
        sub = dir / f".{arch}"
        info = write_layout(sub, layers, arch=arch)
        for blob in (sub / "blobs" / "sha256").iterdir():
            (dir / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(blob, dir / "blobs" / "sha256" / blob.name)
        shutil.rmtree(sub)
        mtext = (dir / "blobs" / "sha256" / info["manifest_digest"][7:]).read_bytes()
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": info["manifest_digest"], "size": len(mtext),
                        "platform": {"os": "linux", "architecture": arch}})
        out[arch] = info["manifest_digest"]
    itext = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": entries}).encode()
    idigest = sha256(itext)
    (dir / "blobs" / "sha256" / idigest[7:]).write_bytes(itext)
    (dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": idigest,
        "size": len(itext), "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    (dir / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    out["index"] = idigest
    return out


def skopeo(*args: str) -> None:
    exe = shutil.which("skopeo")
    assert exe, "skopeo is not installed (tools/install-deps.sh installs it)"
    subprocess.run([exe, "--insecure-policy", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=300)


def docker_archive(layout: Path, out: Path, tag="t", name="img:t") -> Path:
    skopeo("copy", "-q", f"oci:{layout}:{tag}", f"docker-archive:{out}:{name}")
    return out


def oci_archive(layout: Path, out: Path, tag="t") -> Path:
    skopeo("copy", "-q", f"oci:{layout}:{tag}", f"oci-archive:{out}:{tag}")
    return out

"""The escape suite's guest-side attacks on runtime microvm (docs/microvm.md, docs/isolation.md §8).

In a microVM the attacker is root of its own kernel: mount, raw block devices, the clock and
reboot all work inside. What must hold is outside: the host's files and clock, the disks and
shares other VMs read, the host's memory and sbxd. So each case lets the guest do its worst and
then checks the host and a bystander VM of the same template; where the guest must fail (a
read-only disk or share), the case says which error it got.

Under TCG (these machines) each VM boots in seconds: the VMs are made once per module.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest

import secutil
from secutil import attack

MICROVM = {"runtime": "microvm", "resources": {"memory_mib": 256, "disk_mib": 128}}
BOOT_TIMEOUT_S = 300
# Busybox applets the attacks use beyond tests/e2e/images.py's.
EXTRA_APPLETS = ["dd", "blockdev", "mount", "sed", "tail", "md5sum", "sync", "date", "hwclock", "df",
                 "tr", "cut", "awk", "sort"]


def mv_attack(cls: str, tried: str):
    return pytest.mark.attack(cls=cls, tried=tried, runtime="microvm")


@pytest.fixture(scope="module")
def microvm(session_sandboxes, sbxd):
    mv = next(r for r in session_sandboxes.client.call("GET", "/v1/runtimes").body["runtimes"]
              if r["name"] == "microvm")
    if not mv["available"]:
        from conftest import skip_or_fail
        skip_or_fail(f"the microvm runtime is not available here: {mv['reason']}")
    return mv


@pytest.fixture(scope="module")
def busybox_template(session_sandboxes, microvm):
    """An image template (busybox): its tree reaches every VM as one shared read-only disk."""
    import images  # tests/e2e

    work = Path(tempfile.mkdtemp(prefix="sbxsec-mv-"))
    try:
        layout = work / "layout"
        layer = images.busybox_layer().file("etc/motd", "template file\n")
        for applet in EXTRA_APPLETS:
            layer.symlink(f"bin/{applet}", "busybox")
        images.write_layout(layout, [layer.bytes()], env=["PATH=/bin"])
        archive = images.oci_archive(layout, work / "bb.tar")
        client = session_sandboxes.client
        resp = client.call("POST", "/v1/templates:import", params={"name": "sbxsecbb", "tag": "latest"},
                           data=archive.read_bytes(), headers={"Content-Type": "application/x-tar"},
                           expect=202)
        op = client.wait_operation(resp.body["operation"]["id"], timeout=120)
        assert op["state"] == "succeeded", op
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return "sbxsecbb:latest"


def boot(session_sandboxes, body: dict) -> dict:
    return session_sandboxes.client.create_sandbox(body, timeout=BOOT_TIMEOUT_S)["sandbox"]


@pytest.fixture(scope="module")
def mv_base(session_sandboxes, microvm):
    """A VM of the base template: python3 and /etc come from the host over read-only 9p shares
    of masked views."""
    return boot(session_sandboxes, {**MICROVM, "labels": {"security": "mv-base"}})


@pytest.fixture(scope="module")
def mv_pair(session_sandboxes, busybox_template, sbxd):
    """Two VMs of the busybox template: the attacker, and a bystander holding a secret. Both
    read the same tree image on the host."""
    body = {**MICROVM, "template": busybox_template}
    attacker = boot(session_sandboxes, {**body, "labels": {"security": "mv-attacker"}})
    bystander = boot(session_sandboxes, {**body, "labels": {"security": "mv-bystander"}})
    secret = secrets.token_hex(16)
    client = session_sandboxes.client
    res = secutil.sh(client, bystander["id"], f"echo {secret} > /root/secret && md5sum /bin/busybox /etc/motd")
    assert res.exit == secutil.CLEAN_EXIT, res
    images = sorted((sbxd.state_dir / "microvm-assets").glob("tree-*.img"))
    assert images, "no tree image under microvm-assets: the template did not reach the VM as a disk"
    return {"attacker": attacker, "bystander": bystander, "secret": secret,
            "bystander_sums": res.stdout, "images": {str(p): secutil.sha256(p) for p in images}}


@pytest.fixture
def pair_unaffected(mv_pair, sclient, sbxd):
    """After the attack: the tree images on the host are byte for byte the same, and the
    bystander VM still runs, holds its secret and reads the template's files unchanged."""
    yield mv_pair
    for path, digest in mv_pair["images"].items():
        assert secutil.sha256(path) == digest, f"the shared tree image {path} changed"
    res = secutil.sh(sclient, mv_pair["bystander"]["id"], "cat /root/secret && md5sum /bin/busybox /etc/motd",
                     max_seconds=60)
    assert res.exit == secutil.CLEAN_EXIT, res
    assert res.stdout == f"{mv_pair['secret']}\n".encode() + mv_pair["bystander_sums"], res.stdout


def guest_sh(client, sid: str, script: str, max_seconds: float = 120.0):
    res = secutil.sh(client, sid, script, max_seconds=max_seconds)
    assert res.exit is not None and not res.exit.get("timed_out"), res
    return res.stdout.decode(errors="replace"), res


@mv_attack("block-device", "guest root writes the shared read-only template disk: dd onto the raw "
                           "device, blockdev --setrw, mount it read-write, remount the lower rw")
def test_guest_root_cannot_write_the_shared_template_disk(sclient, pair_unaffected):
    sid = pair_unaffected["attacker"]["id"]
    out, _ = guest_sh(sclient, sid, r"""
        for b in /sys/block/vd*; do
          d=/dev/${b##*/}; s=$(cat $b/serial 2>/dev/null)
          case $s in sbxl*) ;; *) continue ;; esac
          echo "dev $d $s ro=$(cat $b/ro)"
          dd if=/dev/zero of=$d bs=4096 count=16 seek=1 conv=notrunc 2>&1 | grep -v records | sed 's/^/dd: /'
          blockdev --setrw $d 2>&1 | sed 's/^/setrw: /'; echo "setrw-rc $?"
          dd if=/dev/urandom of=$d bs=4096 count=16 conv=notrunc,fsync 2>&1 | grep -v records | sed 's/^/dd2: /'
          mkdir -p /mnt/rw; mount -t ext4 -o rw $d /mnt/rw 2>&1 | sed 's/^/mount: /'
          touch /mnt/rw/sbxsec 2>&1 | sed 's/^/touch: /'
        done
        sync; echo 3 > /proc/sys/vm/drop_caches; md5sum /bin/busybox
    """)
    print(out)
    assert "dev /dev/vd" in out and "ro=1" in out, out
    # The guest's flag can be flipped (setrw), QEMU's readonly=on cannot: every write fails.
    assert "dd: " in out and "dd2: " in out, f"a write to the template disk did not fail: {out}"
    assert "touch: " in out, f"a file could be created on the template disk: {out}"


@mv_attack("9p", "guest root reads the host's secrets through the /etc share: /etc/shadow, "
                 "the SSH host keys, sbxd's state directory")
def test_the_etc_share_shows_the_ns_masks_not_the_hosts_secrets(sclient, mv_base, sbxd):
    out, _ = guest_sh(sclient, mv_base["id"], """
        for f in /etc/shadow /etc/gshadow /etc/ssh/ssh_host_ed25519_key /etc/sudoers; do
          if [ -e $f ]; then echo "$f: $(wc -c < $f 2>&1) bytes $(md5sum < $f 2>/dev/null | cut -c1-32)"; else echo "$f: absent"; fi
        done
        ls -a %s 2>&1 | head -3 | sed 's/^/state: /'
    """ % sbxd.state_dir)
    for path in ("/etc/shadow", "/etc/gshadow", "/etc/ssh/ssh_host_ed25519_key", "/etc/sudoers"):
        host = Path(path)
        if not host.exists() or host.stat().st_size == 0:
            continue
        digest = hashlib.md5(host.read_bytes()).hexdigest()
        assert digest not in out, f"the guest read the host's {path}: {out}"
    assert "No such file" in out, f"sbxd's state dir is visible in the guest: {out}"


@mv_attack("9p", "guest root unmounts the base template's read-only 9p shares of the host's "
                 "/usr and /etc, mounts them again read-write and writes, creates, deletes and "
                 "chmods through them")
def test_guest_root_cannot_write_the_hosts_usr_and_etc_through_9p(sclient, mv_base):
    marker = "sbxsec-" + secrets.token_hex(6)
    # /usr goes away with its share, so the attack runs as a static busybox copied out of it
    # first (nothing of /usr stays open: the share can be mounted again); the shares are
    # mounted back read-only at the end.
    guest_sh(sclient, mv_base["id"], "cp /usr/bin/busybox /tmp/busybox")
    script = rf"""
        bb=/tmp/busybox
        $bb awk '$3 == "9p" {{print $1, $2}}' /proc/mounts > /tmp/shares
        $bb sed 's/^/share: /' /tmp/shares
        while read tag dir; do
          $bb umount $dir 2>&1 | $bb sed "s|^|umount $tag: |"
          $bb mkdir -p /tmp/$tag
          $bb mount -t 9p -o trans=virtio,version=9p2000.L,rw $tag /tmp/$tag 2>&1 | $bb sed "s|^|mount $tag: |"
          $bb grep " /tmp/$tag " /proc/mounts | $bb sed "s|^|mounted $tag: |"
          $bb touch /tmp/$tag/{marker} 2>&1 | $bb sed "s|^|touch $tag: |"
          $bb mkdir /tmp/$tag/{marker}.d 2>&1 | $bb sed "s|^|mkdir $tag: |"
          $bb chmod 777 /tmp/$tag 2>&1 | $bb sed "s|^|chmod $tag: |"
          $bb rm -f /tmp/$tag/bin/env /tmp/$tag/hostname 2>&1 | $bb sed "s|^|rm $tag: |"
          $bb umount /tmp/$tag
          $bb mount -t 9p -o trans=virtio,version=9p2000.L,ro,nosuid,nodev $tag $dir || echo "restore $tag failed"
        done < /tmp/shares
        $bb ls -ld /usr/bin /etc | $bb sed 's/^/after: /'
    """
    res = sclient.run(mv_base["id"], ["/tmp/busybox", "sh", "-c", script], max_seconds=120)
    out = res.stdout.decode(errors="replace")
    assert res.exit == secutil.CLEAN_EXIT, (res.exit, res.stderr[-2000:])
    assert "share: bind0 /usr" in out and "share: bind1 /etc" in out, out
    for tag in ("bind0", "bind1"):
        assert f"mounted {tag}: {tag} /tmp/{tag} 9p rw" in out, f"{tag} was not mounted rw: {out}"
        for op in ("touch", "mkdir", "chmod", "rm"):
            assert f"{op} {tag}: " in out, f"{op} through the rw mount of {tag} did not fail: {out}"
    for root in ("/usr", "/etc", "/usr/bin", "/"):
        assert not Path(root, marker).exists() and not Path(root, marker + ".d").exists(), \
            f"the guest created {root}/{marker} on the host: {out}"
    assert Path("/usr/bin/env").exists() and Path("/etc/hostname").exists(), \
        f"the guest deleted a host file: {out}"
    assert Path("/usr/bin").stat().st_mode & 0o777 == 0o755, out
    assert "Read-only file system" in out, out
    assert "restore" not in out, out


@mv_attack("resources", "guest fills its own disk to the end")
def test_a_full_guest_disk_stays_within_its_image_on_the_host(sclient, mv_pair, sbxd, pair_unaffected):
    sid = mv_pair["attacker"]["id"]
    out, _ = guest_sh(sclient, sid, "dd if=/dev/zero of=/root/fill bs=1M 2>&1 | grep -o 'No space left on device' | head -1; sync; "
                                    "df -m / | tail -1", max_seconds=240)
    assert "No space left" in out, out
    disk = sbxd.state_dir / "vm" / sid / "vmm" / "disk.img"
    allocated = disk.stat().st_blocks * 512
    assert allocated <= (MICROVM["resources"]["disk_mib"] + 8) << 20, \
        f"{disk} holds {allocated >> 20} MiB for a {MICROVM['resources']['disk_mib']} MiB disk"
    guest_sh(sclient, sid, "rm -f /root/fill; sync")


@mv_attack("resources", "guest allocates far past its memory; the VMM must stay within its cgroup")
def test_a_memory_bomb_stays_inside_the_guest(sclient, mv_pair, sbxd, pair_unaffected):
    sid = mv_pair["attacker"]["id"]
    res = secutil.sh(sclient, sid, "i=0; while [ $i -lt 12 ]; do "
                                   "head -c 64m /dev/zero | tr '\\0' x > /dev/shm/f$i || break; "
                                   "i=$((i+1)); done; echo reached $i",
                     max_seconds=240)
    qemu = next(p for p in _vm_pids(sbxd, sid) if b"qemu" in Path(f"/proc/{p}/cmdline").read_bytes())
    rss = secutil.vm_rss_kib(qemu) * 1024
    limit = (MICROVM["resources"]["memory_mib"] + 256) << 20
    assert rss <= limit, f"QEMU holds {rss >> 20} MiB, past its cgroup's {limit >> 20} MiB"
    guest_sh(sclient, sid, "rm -f /dev/shm/f*")
    assert res.exit is not None, res


@mv_attack("time", "guest root sets its clock back a year and forward again")
def test_the_guests_clock_is_its_own(sclient, mv_pair, pair_unaffected):
    before = secutil.clock_offset()
    out, _ = guest_sh(sclient, mv_pair["attacker"]["id"],
                      "date -s '2001-01-01 00:00:00' >/dev/null 2>&1; date +%Y; "
                      "hwclock -w 2>&1 | head -1; date -s '2039-01-01' >/dev/null 2>&1; date +%Y")
    assert "2001" in out, f"the guest could not even set its own clock: {out}"
    assert abs(secutil.clock_offset() - before) < 1.0, "the host's clock moved"


@mv_attack("devices", "guest root lists every block and network device it has, looking for the "
                      "host's disks, other VMs' disks or a route out")
def test_the_guest_sees_only_its_own_devices(sclient, mv_pair, pair_unaffected):
    out, _ = guest_sh(sclient, mv_pair["attacker"]["id"],
                      "for b in /sys/block/*; do echo \"blk ${b##*/} $(cat $b/serial 2>/dev/null)\"; done; "
                      "ls /sys/class/net | sed 's/^/net /'; cat /proc/net/route | tail -n +2 | sed 's/^/route /'")
    blocks = [line.split() for line in out.splitlines() if line.startswith("blk vd")]
    serials = sorted(b[2] if len(b) > 2 else "" for b in blocks)
    # Its config, its own disk and the template's trees (one disk per layer tree): nothing else.
    assert serials.count("sbxcfg") == 1 and serials.count("sbxdisk") == 1, out
    assert all(re.fullmatch(r"sbxcfg|sbxdisk|sbxl\d+", s) for s in serials), out
    assert [line for line in out.splitlines() if line.startswith("net ")] == ["net lo"], out
    assert "route " not in out, out


@mv_attack("kernel", "guest root crashes its kernel (sysrq c); the VM must end, marked failed, "
                     "with nothing of it left running")
def test_a_guest_that_crashes_its_kernel_ends_alone(session_sandboxes, sclient, busybox_template, sbxd,
                                                   pair_unaffected):
    victim = boot(session_sandboxes, {**MICROVM, "template": busybox_template})
    try:
        secutil.sh(sclient, victim["id"], "echo c > /proc/sysrq-trigger", max_seconds=30)
    except AssertionError:
        pass  # the session may end with the VM instead of an exit: the state below is the check
    deadline = time.monotonic() + 120
    while True:
        sb = sclient.get_sandbox(victim["id"])
        if sb["state"] == "failed":
            break
        assert time.monotonic() < deadline, sb
        time.sleep(0.2)
    assert _vm_pids(sbxd, victim["id"]) == [], "the crashed VM's processes still run"


def _vm_pids(sbxd, sid: str) -> list[int]:
    from hostcheck import vm_processes  # tests/e2e

    return vm_processes(sbxd.state_dir, sid)

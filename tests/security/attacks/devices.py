# Device nodes: make /dev/mem-like (char 1:3 is /dev/null's number; 1:1 would be /dev/mem) and
# a block device (8:0, the first SCSI/virtio disk), and list what /dev holds.
S_IFCHR, S_IFBLK = 0o020000, 0o060000


def makedev(ma, mi):
    return ((ma & 0xfff) << 8) | (mi & 0xff) | ((mi & ~0xff) << 12) | ((ma & ~0xfff) << 32)


for key, path, mode, dev in (("char_1_3_tmp", "/tmp/sbxsec-null", S_IFCHR | 0o666, makedev(1, 3)),
                             ("char_1_1_root", "/root/sbxsec-mem", S_IFCHR | 0o600, makedev(1, 1)),
                             ("block_8_0_root", "/root/sbxsec-sda", S_IFBLK | 0o600, makedev(8, 0)),
                             ("block_8_0_dev", "/dev/sbxsec-sda", S_IFBLK | 0o600, makedev(8, 0))):
    try_sc("mknod_" + key, "mknodat", AT_FDCWD, path, mode, dev)
RESULT["dev_entries"] = sorted(os.listdir("/dev"))
RESULT["mknod_cmd"] = os.system("mknod /tmp/sbxsec-sdb b 8 16 2>/dev/null") >> 8
emit()

# Changing the sandbox's own network: the network namespace belongs to the host's user
# namespace, so sandbox root has no CAP_NET_ADMIN over it (its capabilities count only in its
# own user namespace). Tried with the classic ioctls: take lo down, add an address, add a
# default route (which would be the first step to any route out).
import fcntl
import socket
import struct

SIOCSIFFLAGS, SIOCSIFADDR, SIOCADDRT = 0x8914, 0x8916, 0x890B
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifreq_flags = struct.pack("16sh14x", b"lo", 0)  # flags 0: down
RESULT["lo_down"] = oserr(fcntl.ioctl, s.fileno(), SIOCSIFFLAGS, ifreq_flags)[0]
sockaddr = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("169.254.77.1"))
RESULT["add_address"] = oserr(fcntl.ioctl, s.fileno(), SIOCSIFADDR, struct.pack("16s", b"lo") + sockaddr)[0]
# struct rtentry: rt_pad1, rt_dst, rt_gateway, rt_genmask, rt_flags (RTF_UP|RTF_GATEWAY), ...
dst = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("0.0.0.0"))
gw = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("169.254.77.2"))
rtentry = struct.pack("L16s16s16sH", 0, dst, gw, dst, 0x3) + b"\0" * 64
RESULT["add_default_route"] = oserr(fcntl.ioctl, s.fileno(), SIOCADDRT, rtentry)[0]
RESULT["lo_still_up"] = open("/sys/class/net/lo/operstate").read().strip() if os.path.exists("/sys/class/net/lo") else None
with open("/proc/net/route") as f:
    RESULT["ipv4_routes"] = [l.split()[1] for l in f.read().splitlines()[1:]]
emit()

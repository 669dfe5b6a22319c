# Netlink families that broadcast the host's events, and a listen on the uevent one: while the
# test creates and deletes another sandbox, a guest that can open NETLINK_KOBJECT_UEVENT sees
# that tenant's loop device come and go. argv: SECONDS to listen.
import select
import socket
import time

listen_s = float(ARGS[0]) if ARGS else 6.0
R = RESULT
R["families"] = {}
for proto in range(32):
    o, s = oserr(socket.socket, socket.AF_NETLINK, socket.SOCK_RAW, proto)
    R["families"][str(proto)] = o if o != "OK" else "OK"
    if s is not None:
        s.close()
R["uevents"] = []
o, s = oserr(socket.socket, socket.AF_NETLINK, socket.SOCK_DGRAM, 15)
R["uevent_socket"] = o
if s is not None:
    R["bind"] = oserr(s.bind, (0, 1))[0]
    print("listening", flush=True)
    deadline = time.monotonic() + listen_s
    while time.monotonic() < deadline and len(R["uevents"]) < 20:
        r, _, _ = select.select([s], [], [], max(0.0, deadline - time.monotonic()))
        if r:
            R["uevents"].append(s.recv(4096).split(b"\0")[0].decode(errors="replace"))
    s.close()
else:
    print("listening", flush=True)
    time.sleep(listen_s)
emit()

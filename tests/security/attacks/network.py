# Reaching sbxd's API or any host loopback service from inside. argv: SBXD_PORT, LISTENER_PORT,
# ABSTRACT_NAME (an abstract unix socket the test listens on in the host's network namespace).
import socket
sbxd_port, listener_port, abstract = int(ARGS[0]), int(ARGS[1]), ARGS[2]


def connect(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(addr)
        return "OK"
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()


RESULT["sbxd_v4"] = connect(socket.AF_INET, ("127.0.0.1", sbxd_port))
RESULT["listener_v4"] = connect(socket.AF_INET, ("127.0.0.1", listener_port))
RESULT["listener_v4_other_loopback"] = connect(socket.AF_INET, ("127.0.0.2", listener_port))
RESULT["sbxd_v6"] = connect(socket.AF_INET6, ("::1", sbxd_port))
RESULT["abstract_unix"] = connect(socket.AF_UNIX, "\0" + abstract)
with open("/proc/net/dev") as f:
    RESULT["interfaces"] = sorted(l.split(":")[0].strip() for l in f.read().splitlines()[2:])
with open("/proc/net/route") as f:
    RESULT["ipv4_routes"] = f.read().splitlines()[1:]
o, text = oserr(lambda: open("/proc/net/ipv6_route").read())
RESULT["ipv6_routes_not_lo"] = [l for l in (text or "").splitlines() if not l.rstrip().endswith(" lo")]
emit()

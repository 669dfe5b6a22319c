# Raw sockets (sniffing or forging traffic) and network configuration from inside.
import socket
for key, fam, typ, proto in (("af_packet_raw", 17, socket.SOCK_RAW, 0x0300),   # htons(ETH_P_ALL)
                             ("af_packet_dgram", 17, socket.SOCK_DGRAM, 0x0300),
                             ("af_inet_raw_icmp", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                             ("af_inet_raw_raw", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
                             ("af_inet6_raw", socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)):
    o, s = oserr(socket.socket, fam, typ, proto)
    RESULT[key] = o
    if s is not None:
        s.close()
# CAP_NET_ADMIN is gone: no new interface, no address, no route.
RESULT["ip_link_add"] = os.system("ip link add sbxsec0 type dummy 2>/dev/null") >> 8
RESULT["ip_addr_add"] = os.system("ip addr add 10.200.0.1/32 dev lo 2>/dev/null") >> 8
RESULT["ip_route_add"] = os.system("ip route add default dev lo 2>/dev/null") >> 8
emit()

"""What several test modules need to observe a Ray session from outside: its processes, the TCP sockets they
listen on, and whether a port answers on this machine's other addresses (Linux /proc)."""

import ipaddress
import os
import socket
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below pid, from the parent ids in /proc/*/stat."""
    parent = {}
    for entry in Path("/proc").iterdir():
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        found += children
        frontier = children
    return found


def listening_sockets() -> dict[str, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Socket inode -> (local address, port) of every listening TCP socket, from /proc/net/tcp and tcp6. One read
    is not a snapshot (the kernel hands the table out in chunks), so a socket can be missing from it: poll."""
    found = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # host-order 32-bit words
                found[fields[9]] = (ipaddress.ip_address(raw), int(port, 16))
    return found


def listening_ports_of(pids: list[int]) -> set[tuple[str, str, int]]:
    """(process name, listening address, port) for each listening TCP socket held by one of pids."""
    sockets = listening_sockets()
    found = set()
    for pid in pids:
        try:
            name = (Path(f"/proc/{pid}/cmdline").read_text().split("\0")[0] or "?").rsplit("/", 1)[-1]
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # gone, or not ours
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in sockets:
                address, port = sockets[link[8:-1]]
                found.add((name, str(address), port))
    return found


def listeners_of(pids: list[int]) -> list[tuple[str, str]]:
    """(process name, listening address) for each listening TCP socket held by one of pids (one read)."""
    return sorted({(name, address) for name, address, _ in listening_ports_of(pids)})


def poll_listeners(root: int, seen_enough, timeout: float = 60.0) -> set[tuple[str, str, int]]:
    """The union of listening_ports_of(root and its descendants) over reads repeated until seen_enough(union)
    holds (each read can miss sockets; the union only grows), or `timeout` seconds: the union either way."""
    union, end = set(), time.monotonic() + timeout
    while True:
        union |= listening_ports_of([root, *descendants(root)])
        if seen_enough(union) or time.monotonic() > end:
            return union
        time.sleep(0.2)


def is_loopback(address: str) -> bool:
    """Loopback, also as an IPv4-mapped IPv6 address (::ffff:127.0.0.1: how Ray's dual-stack sockets show it)."""
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def machine_addresses() -> list[tuple]:
    """Every address of this machine that is not loopback, as socket.connect takes it (IPv4 from /proc/net/fib_trie,
    IPv6 from /proc/net/if_inet6)."""
    found = set()
    trie = Path("/proc/net/fib_trie").read_text().splitlines()
    for line, following in zip(trie, trie[1:]):
        if "/32 host LOCAL" in following and not line.split()[-1].startswith("127."):
            found.add((socket.AF_INET, line.split()[-1], 0))
    inet6 = Path("/proc/net/if_inet6")
    for line in inet6.read_text().splitlines() if inet6.exists() else []:
        raw, index, _, scope, _, name = line.split()
        address = ":".join(raw[i : i + 4] for i in range(0, 32, 4))
        if name != "lo":
            found.add((socket.AF_INET6, address, int(index, 16) if int(scope, 16) == 0x20 else 0))
    return sorted(found)


def reachable(family, address: str, scope: int, port: int) -> bool:
    """Whether a TCP connection to (address, port) is accepted within 3 s."""
    with socket.socket(family) as s:
        s.settimeout(3)
        try:
            s.connect((address, port) if family == socket.AF_INET else (address, port, 0, scope))
            return True
        except OSError:
            return False

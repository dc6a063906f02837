"""What several test modules need: to observe a Ray session from outside (its processes, the TCP sockets they
listen on, and whether a port answers on this machine's other addresses, from Linux /proc), to hold a child process
at a gate, and to read a package's import graph."""

import ast
import ipaddress
import os
import socket
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_imports(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """For every module of the package folder `package` under `root`, every name it imports anywhere (at its top or
    inside a function): `import a.b` gives a.b, `from a.b import c` gives a.b and a.b.c (c may be a module)."""
    graph = {}
    for path in sorted((root / package).glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[f"{package}.{path.stem}"] = imported
    return graph


def package_imports(package: str) -> dict[str, set[str]]:
    """For every module of the package folder `package`, the package's modules it imports anywhere."""
    modules = {f"{package}.{path.stem}" for path in (ROOT / package).glob("*.py")}
    return {module: imported & modules for module, imported in module_imports(package).items()}


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in `graph` (module, ..., the same module), or None."""

    def circle(module, path):
        if module in path:
            return path[path.index(module) :] + [module]
        for other in sorted(graph.get(module, ())):
            if found := circle(other, path + [module]):
                return found
        return None

    for module in graph:
        if found := circle(module, []):
            return found
    return None


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


GATE_SITECUSTOMIZE = '''
"""A test's gate in a child Python process (tests/helpers.py Gate): at one point of the program, create the
marker file, then wait until the test opens the FIFO for writing."""
import importlib.abc
import importlib.util
import os
import sys


def _wait_at_the_gate():
    try:  # the gate holds the first process that reaches it, once
        open(os.environ["TEST_GATE_MARKER"], "x").close()
    except FileExistsError:
        return
    with open(os.environ["TEST_GATE_FIFO"]) as fifo:  # blocks until the test opens the other end
        fifo.read()


class _BeforeImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["TEST_GATE_BEFORE_IMPORT"]:
            sys.meta_path.remove(self)
            _wait_at_the_gate()
        return None


def _gate_calls(module, qualname, where, count):
    *path, name = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    original, calls = getattr(owner, name), [0]

    def gated(*args, **kwargs):
        calls[0] += 1
        if where == "before" and calls[0] == count:
            _wait_at_the_gate()
        result = original(*args, **kwargs)
        if where == "after" and calls[0] == count:
            _wait_at_the_gate()
        return result

    setattr(owner, name, gated)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the module when the program imports it (other processes that share the environment, such as
    Ray's own, import nothing more)."""

    def __init__(self, module, qualname, where, count):
        self.module, self.args = module, (qualname, where, int(count))

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _gate_calls(module, *self.args)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("TEST_GATE_BEFORE_IMPORT"):
    sys.meta_path.insert(0, _BeforeImport())
if os.environ.get("TEST_GATE_CALL"):
    sys.meta_path.insert(0, _PatchOnImport(*os.environ["TEST_GATE_CALL"].split(":")))
'''


HANG_SECONDS = 600.0
"""How long a test waits for an event before it calls the wait a hang: a guard, never a measure of speed, so generous
that a 2-core machine at load 6 (Ray starting, a solve of seconds) is far inside it; a child that dies ends the wait
at once."""


class Gate:
    """Stops a child Python process at a known point, so that a test acts on an event rather than at a moment.
    The first process sharing `env` that gets there waits (the gate holds once): before it imports
    `before_import`, or at `call` = ("module:qualname", "before" | "after", k), before the k-th call of that
    function or after its k-th return (patched as the program imports its module). It creates `marker` and waits
    until `release()`. A signal that arrives at the gate is handled there (Python runs its handlers while the
    process waits in open()). `env` goes into the child's environment (or a Ray actor's runtime_env env_vars)."""

    def __init__(self, folder: Path, before_import: str | None = None, call: tuple[str, str, int] | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sitecustomize.py").write_text(GATE_SITECUSTOMIZE)
        self.marker, self.fifo = folder / "at-the-gate", folder / "gate.fifo"
        os.mkfifo(self.fifo)
        path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
        self.env = {
            "PYTHONPATH": path,
            "TEST_GATE_MARKER": str(self.marker),
            "TEST_GATE_FIFO": str(self.fifo),
            "TEST_GATE_BEFORE_IMPORT": before_import or "",
            "TEST_GATE_CALL": ":".join(map(str, call)) if call else "",
        }

    def wait(self, process=None, timeout: float = HANG_SECONDS) -> None:
        """Until the child is at the gate (a subprocess.Popen `process` must not end before)."""
        end = time.monotonic() + timeout
        while not self.marker.exists():
            assert process is None or process.poll() is None, f"the child ended (status {process.returncode}) before it reached the gate"
            assert time.monotonic() < end, "the child did not reach the gate"
            time.sleep(0.01)

    def release(self, timeout: float = HANG_SECONDS) -> None:
        """Let the child past the gate (it may be between a signal handler and its next open() of the FIFO)."""
        end = time.monotonic() + timeout
        while True:
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError:  # ENXIO: no reader at this instant
                assert time.monotonic() < end, "the child never waited at the gate again"
                time.sleep(0.01)

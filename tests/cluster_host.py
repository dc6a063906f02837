"""A multi-node Ray cluster on this machine (platform/cluster_demo.py's start_cluster) held by this process for a
test, which drives it through stdin and stdout: the test process itself must not hold a second Ray.

  python tests/cluster_host.py WORKERS CPUS

Prints one JSON line when the cluster is up, and one after each command: the cluster's address, environment
(authentication and RAY_ADDRESS, for its clients) and nodes (name, node id, raylet PID). Commands, one a line:
`kill NAME` (the node dies without grace: SIGKILL to its raylet and every process below it, then its other
processes), `add` (one more worker node), `quit` (stop the cluster). End of input also stops it."""

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def below(pid: int) -> list[int]:
    """Every process below `pid` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            parents[int(entry)] = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found.append(child)
                frontier.append(child)
    return found


def describe(cluster) -> dict:
    names = cluster.node_names
    nodes = [cluster.head_node] if cluster.head_node else []
    nodes += sorted(cluster.worker_nodes, key=lambda n: names[n.node_id])
    return {
        "address": cluster.address,
        "environment": {k: os.environ[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS")},
        "nodes": [{"name": names[n.node_id], "node_id": n.node_id, "raylet": n.all_processes["raylet"][0].process.pid} for n in nodes],
    }


def main() -> None:
    workers, cpus = int(sys.argv[1]), int(sys.argv[2])
    loaded = importlib.util.spec_from_file_location("cluster_demo", ROOT / "platform" / "cluster_demo.py")
    demo = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(demo)
    cluster = demo.start_cluster(workers, cpus, log=lambda text: None)
    names = cluster.node_names
    try:
        print(json.dumps(describe(cluster)), flush=True)
        for line in sys.stdin:
            command, _, name = line.strip().partition(" ")
            if command == "quit":
                break
            if command == "add":
                cluster.add_worker()
            elif command == "kill":
                node = next(n for n in [cluster.head_node, *cluster.worker_nodes] if n is not None and names[n.node_id] == name)
                raylet = node.all_processes["raylet"][0].process.pid
                for pid in [raylet, *below(raylet)]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                cluster.remove_node(node, allow_graceful=False)
            print(json.dumps(describe(cluster)), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()

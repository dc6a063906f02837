"""Load test of the decision service (serving.app on an embedded Ray Serve): a closed-loop load generator on
loopback, each client sending its next request as soon as its last one is answered, every run bounded in
requests and seconds.

Figures, each measured in this run: decisions/s and request latency p50/p95/p99 for 1, 8 and 32 clients at
n = 16 with the `cpu` network, batching on and off (their ratio), 1 and 2 replicas (their ratio), 100 states
per request; the paper-size network and classical-best at n = 16; both networks at n = 1,024 with one client;
the errors while a replica is killed under load (and whether every answer stayed right); 1,000 mixed good and
bad requests (every good answer equal to platform/decide.py's, every bad one a 4xx). Then one line per goal of
docs/benchmarks.md, met or not. One JSON line per figure, with the machine's load.

The networks are the registry's, with their initial weights (seed 0), saved as checkpoints: throughput does
not depend on training. Classical-best is tuned on the instance first (minutes at n = 16).

  python bench/serve.py [--seconds 8] [--requests 4000] [--port 8765] [--skip-classical]
"""

import argparse
import http.client
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from envs.instance import LMAX, paper_instance
from policies.names import CHECKPOINT_PREFIX
from serving.app import REQUEST_TIMEOUT_S, ServiceConfig, application
from serving.decisions import read_states
from solver_workers.ray_session import init_ray, stop_ray
from trainers.checkpoint import save_checkpoint
from trainers.registry import family, method_config

ROOT = Path(__file__).resolve().parent.parent
APP = "bench-decisions"
POOL = 64
"""Distinct states per instance; requests cycle through them."""
MIXED_REQUESTS = 1000
MIXED_BODY_LIMIT = 16384
"""The mixed run's body limit: one state at n = 16 is about 1 KiB, the oversized request 20 KiB."""


def emit(**row):
    """One JSON line, with the machine's load at the time (other processes share the cores)."""
    row |= {"load_average_1min": round(os.getloadavg()[0], 2), "cpu_cores": os.cpu_count()}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


def initial_checkpoint(folder: Path, preset: str, n: int) -> Path:
    """An OR-Transformer checkpoint of `preset`'s network with its initial weights (seed 0) on paper_instance(n, 0)."""
    torch.manual_seed(0)
    config = method_config("or-transformer", preset)
    model = family("pathwise").build_model(config, n)
    path = folder / f"{preset}-n{n}.pt"
    save_checkpoint(path, config, paper_instance(n, 0), {"model": model.state_dict(), "update": 0}, "running")
    return path


def states(instance, count: int, seed: int = 0) -> list[dict]:
    """States the instance can produce: inventory around a few periods of demand, orders up to qbar in the slots
    that lead times use, a stationary factor."""
    rng = np.random.default_rng(seed)
    n, slots = instance.n, LMAX - 1
    used = np.arange(slots)[None, :] < instance.lead[:, None] - 1  # [n, LMAX-1]
    rows = []
    for _ in range(count):
        inventory = rng.uniform(-2, 4, n) * instance.lam
        in_transit = np.where(used, rng.uniform(0, 1, (n, slots)) * instance.qbar[:, None] * (rng.uniform(size=(n, slots)) < 0.3), 0.0)
        rows.append(
            {"inventory": inventory.round(3).tolist(), "in_transit": in_transit.round(3).tolist(), "factor": round(float(rng.normal()), 3)}
        )
    return rows


def decide_py(checkpoint: Path, pool: list[dict], folder: Path) -> list[dict]:
    """platform/decide.py's answer to each state of the pool, one dict per state."""
    path = folder / f"{checkpoint.stem}-states.json"
    path.write_text(json.dumps(pool))
    out = subprocess.run(
        [sys.executable, str(ROOT / "platform" / "decide.py"), "--checkpoint", str(checkpoint), "--state", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)  # the pool is a list: a list of answers


def same(answer, expected: list[dict]) -> bool:
    """A 200's answers against decide.py's: Y exactly, the numbers to float32 rounding of another batch."""
    answers = answer if isinstance(answer, list) else [answer]
    if len(answers) != len(expected):
        return False
    for got, want in zip(answers, expected):
        if got["open"] != want["open"]:
            return False
        for key in ("open_probability", "quantity", "order"):
            if not np.allclose(got[key], want[key], rtol=1e-5, atol=1e-6):
                return False
    return True


class Request:
    """A request body with what it must get: expected answers (a 200) or None (a 4xx)."""

    def __init__(self, body: bytes, expected=None, content_type: str = "application/json"):
        self.body, self.expected, self.content_type = body, expected, content_type


def good_requests(pool: list[dict], expected: list[dict], per_request: int = 1) -> list[Request]:
    requests = []
    for k in range(len(pool)):
        index = [(k + j) % len(pool) for j in range(per_request)]
        chosen = [pool[i] for i in index]
        requests.append(Request(json.dumps(chosen[0] if per_request == 1 else chosen).encode(), [expected[i] for i in index]))
    return requests


def bad_requests(pool: list[dict]) -> list[Request]:
    """One of each kind of bad request (docs/formats.md); each must get a 4xx."""
    state = pool[0]
    n = len(state["inventory"])
    return (
        [
            Request(body)
            for body in (
                b'{"inventory": [1, 2],',  # malformed JSON
                json.dumps({**state, "inventory": state["inventory"] + [1.0]}).encode(),  # n + 1 items
                json.dumps({**state, "in_transit": [row[:2] for row in state["in_transit"]]}).encode(),  # ragged
                json.dumps({**state, "in_transit": [[-1.0, 0.0, 0.0]] * n}).encode(),  # negative
                json.dumps({**state, "in_transit": [[0.0, 0.0, 1.0]] * n}).encode(),  # an order in the last slot: refused for every L < 4
                json.dumps({**state, "factor": 11}).encode(),
                json.dumps({**state, "factor": float("nan")}).encode(),  # json.dumps writes NaN
                json.dumps({**state, "time": 3}).encode(),  # an unknown key
                b"[]",
                json.dumps([state] * 40).encode(),  # over the mixed run's body limit
            )
        ]
        + [Request(json.dumps(state).encode(), content_type="text/plain")]
    )


def load(port: int, requests: list[Request], clients: int, max_requests: int, seconds: float, check: bool) -> dict:
    """Closed loop: `clients` threads, each with one keep-alive connection, until `max_requests` are sent or `seconds`
    pass. Counts decisions answered (200), refusals (4xx), errors (5xx, lost connections) and wrong outcomes (with
    `check`: a 200 with answers other than expected, a good request refused, a bad one answered)."""
    counter, lock = itertools.count(), threading.Lock()
    start = time.perf_counter()
    deadline = start + seconds

    def client(_):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        rows = []
        while time.perf_counter() < deadline:
            with lock:
                k = next(counter)
            if k >= max_requests:
                break
            request = requests[k % len(requests)]
            sent = time.perf_counter()
            try:
                connection.request("POST", "/decide", body=request.body, headers={"Content-Type": request.content_type})
                response = connection.getresponse()
                status, data = response.status, response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                status, data = None, b""
            latency = time.perf_counter() - sent
            refused = status is not None and 400 <= status < 500 and status != 408  # 408: Serve's timeout, an error
            if not check:
                wrong = False
            elif request.expected is None:
                wrong = not refused
            else:
                wrong = refused or (status == 200 and not same(json.loads(data), request.expected))
            decisions = len(request.expected) if status == 200 and request.expected else 0
            rows.append((latency, status, decisions, wrong))
        connection.close()
        return rows

    with ThreadPoolExecutor(max_workers=clients) as pool:
        rows = [row for part in pool.map(client, range(clients)) for row in part]
    elapsed = time.perf_counter() - start
    latency = np.array([r[0] for r in rows]) * 1e3
    statuses = [r[1] for r in rows]
    failed = sum(1 for s in statuses if s is None or s >= 500 or s == 408)
    return {
        "requests": len(rows),
        "seconds": elapsed,
        "decisions_per_s": sum(r[2] for r in rows) / elapsed,
        "p50_ms": float(np.percentile(latency, 50)),
        "p95_ms": float(np.percentile(latency, 95)),
        "p99_ms": float(np.percentile(latency, 99)),
        "ok": statuses.count(200),
        "refused_4xx": len(rows) - statuses.count(200) - failed,
        "errors": failed,
        "wrong": sum(r[3] for r in rows),
    }


def deploy(config: ServiceConfig, decider) -> None:
    """Replace the bench application (deleted first: two 1-CPU replicas fill this machine's 2 CPUs)."""
    from ray import serve

    serve.delete(APP)
    serve.run(application(config, decider), name=APP, route_prefix="/")


def info(port: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/info")
    return json.loads(connection.getresponse().read())


def warm(port: int, requests: list[Request]) -> None:
    load(port, requests, 1, 10, 30.0, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="most seconds per run (default 8)")
    parser.add_argument("--requests", type=int, default=4000, help="most requests per run (default 4000)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--skip-classical", action="store_true", help="skip classical-best (its tuning takes minutes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    small, large = paper_instance(16, 0), paper_instance(1024, 0)
    pool16, pool1024 = states(small, POOL), states(large, 8)
    checkpoints = {(preset, n): initial_checkpoint(folder, preset, n) for preset in ("cpu", "paper") for n in (16, 1024)}
    expected = {key: decide_py(path, pool16 if key[1] == 16 else pool1024, folder) for key, path in checkpoints.items()}
    small.save(folder / "instance16.json")

    init_ray(2)
    import ray
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": args.port, "request_timeout_s": REQUEST_TIMEOUT_S})
    bound = dict(max_requests=args.requests, seconds=args.seconds)
    figures = {}

    def measure(label: str, config: ServiceConfig, requests: list[Request], clients_list, check: bool = False, **extra):
        for clients in clients_list:
            warm(args.port, requests)
            result = load(args.port, requests, clients, check=check, **bound)
            figures[(label, clients)] = result
            emit(
                figure="serve",
                run=label,
                clients=clients,
                replicas=config.replicas,
                threads=config.threads,
                max_batch_size=config.max_batch_size,
                batch_wait_ms=config.batch_wait_ms,
                **extra,
                **result,
            )

    def checkpoint_config(preset: str, n: int, **options) -> ServiceConfig:
        return ServiceConfig(policy=CHECKPOINT_PREFIX + str(checkpoints[(preset, n)]), **options)

    # n = 16, cpu network: batching on and off, 1 and 2 replicas, 100 states per request
    single16 = good_requests(pool16, expected[("cpu", 16)])
    hundred16 = good_requests(pool16, expected[("cpu", 16)], per_request=100)
    on = checkpoint_config("cpu", 16)
    decider = on.decider()
    deploy(on, decider)
    measure("cpu-n16-batching", on, single16, (1, 8, 32), network="cpu", n=16, states_per_request=1)
    measure("cpu-n16-batching-100-states", on, hundred16, (8, 32), network="cpu", n=16, states_per_request=100)
    off = checkpoint_config("cpu", 16, max_batch_size=1)
    deploy(off, decider)
    measure("cpu-n16-no-batching", off, single16, (1, 8, 32), network="cpu", n=16, states_per_request=1)
    measure("cpu-n16-no-batching-100-states", off, hundred16, (8, 32), network="cpu", n=16, states_per_request=100)
    two = checkpoint_config("cpu", 16, replicas=2)
    deploy(two, decider)
    measure("cpu-n16-batching-2-replicas", two, single16, (32,), network="cpu", n=16, states_per_request=1)
    for clients in (1, 8, 32):
        emit(
            figure="serve_ratio",
            ratio="batching on / off, decisions/s",
            network="cpu",
            n=16,
            clients=clients,
            value=figures[("cpu-n16-batching", clients)]["decisions_per_s"] / figures[("cpu-n16-no-batching", clients)]["decisions_per_s"],
        )
    emit(
        figure="serve_ratio",
        ratio="2 replicas / 1 replica, decisions/s",
        network="cpu",
        n=16,
        clients=32,
        value=figures[("cpu-n16-batching-2-replicas", 32)]["decisions_per_s"] / figures[("cpu-n16-batching", 32)]["decisions_per_s"],
    )

    # a replica killed under load (2 replicas, 32 clients): errors counted, every answer checked, the time until
    # Serve runs 2 replicas again
    victim, recovered = info(args.port)["replica"], []

    def kill_and_watch():
        """Kill, then wait until Serve has seen fewer than 2 replicas running and runs 2 again."""
        killed_at, seen_down = time.perf_counter(), False
        ray.kill(ray.get_actor(victim, namespace="serve"))
        while time.perf_counter() - killed_at < 120:
            running = serve.status().applications[APP].deployments["DecisionService"].replica_states.get("RUNNING", 0)
            seen_down |= running < 2
            if seen_down and running == 2:
                recovered.append(time.perf_counter() - killed_at)
                return
            time.sleep(0.1)

    killer = threading.Timer(2.0, kill_and_watch)
    killer.start()
    result = load(args.port, single16, 32, check=True, max_requests=args.requests * 4, seconds=max(args.seconds, 20.0))
    killer.join()
    emit(
        figure="serve_replica_killed",
        run="cpu-n16-batching-2-replicas",
        clients=32,
        killed=victim,
        replicas_running_again_after_s=recovered[0] if recovered else None,
        **result,
    )

    # 1,000 mixed good and bad requests, 8 clients: every good answer decide.py's, every bad one a 4xx
    mixed_config = checkpoint_config("cpu", 16, max_body_bytes=MIXED_BODY_LIMIT)
    deploy(mixed_config, decider)
    bad = bad_requests(pool16)
    mixed = [request for pair in itertools.zip_longest(single16, bad * 7) for request in pair if request is not None]
    result = load(args.port, mixed, 8, check=True, max_requests=MIXED_REQUESTS, seconds=300.0)
    emit(figure="serve_mixed", good_kinds=len(single16), bad_kinds=len(bad), **result)

    # the paper-size network at n = 16; both networks at n = 1,024, one client
    paper16 = checkpoint_config("paper", 16)
    deploy(paper16, paper16.decider())
    measure(
        "paper-n16-batching", paper16, good_requests(pool16, expected[("paper", 16)]), (1, 32), network="paper", n=16, states_per_request=1
    )
    for preset in ("cpu", "paper"):  # one torch thread: two were 2-4x slower while other work loaded the 2 cores (docs/benchmarks.md)
        config = checkpoint_config(preset, 1024)
        deploy(config, config.decider())
        measure(
            f"{preset}-n1024-batching",
            config,
            good_requests(pool1024, expected[(preset, 1024)]),
            (1,),
            network=preset,
            n=1024,
            states_per_request=1,
        )

    if not args.skip_classical:
        classical = ServiceConfig(policy="classical-best", instance=str(folder / "instance16.json"))
        started = time.perf_counter()
        classical_decider = classical.decider(progress=True)
        emit(
            figure="classical_best_tuning",
            n=16,
            seconds=time.perf_counter() - started,
            family=classical_decider.info["parameters"]["family"],
        )
        deploy(classical, classical_decider)
        answers = classical_decider.decide_many([read_states(state, small, "pool") for state in pool16])
        measure(
            "classical-best-n16-batching",
            classical,
            good_requests(pool16, [a.records()[0] for a in answers]),
            (1, 32),
            network="classical-best",
            n=16,
            states_per_request=1,
        )

    goals = [
        (
            ">= 400 decisions/s with batching, n=16 cpu network, 32 clients",
            figures[("cpu-n16-batching", 32)]["decisions_per_s"],
            lambda v: v >= 400,
        ),
        (
            ">= 2x the throughput without batching (same)",
            figures[("cpu-n16-batching", 32)]["decisions_per_s"] / figures[("cpu-n16-no-batching", 32)]["decisions_per_s"],
            lambda v: v >= 2,
        ),
        ("p99 <= 250 ms (same, with batching)", figures[("cpu-n16-batching", 32)]["p99_ms"], lambda v: v <= 250),
        (
            ">= 5,000 decisions/s with 100 states per request (the better of 8 and 32 clients)",
            max(figures[("cpu-n16-batching-100-states", c)]["decisions_per_s"] for c in (8, 32)),
            lambda v: v >= 5000,
        ),
        ("n=1,024 paper network, 1 client: p50 <= 60 ms", figures[("paper-n1024-batching", 1)]["p50_ms"], lambda v: v <= 60),
    ]
    for goal, value, met in goals:
        emit(figure="serve_goal", goal=goal, measured=value, met=bool(met(value)))
    serve.shutdown()
    stop_ray()


if __name__ == "__main__":
    main()

"""Serve one policy's replenishment decisions over HTTP (Ray Serve), until Ctrl-C.

  python platform/serve.py --checkpoint runs/ot16/checkpoint.pt
  python platform/serve.py --policy classical-best --instance inst.json --replicas 2 --port 8000

Then POST a state (decide.py's format) or a list of states to http://HOST:PORT/decide; GET /healthz and /info.
The API is in docs/formats.md: each answer is what platform/decide.py answers for the same checkpoint and state.

The policy: --checkpoint (any learned method), or --policy NAME (a classical family, classical-best,
dp-optimal, decomposition-lookahead[:DIR] in its stationary form or user-rule:PATH, tuned or solved once at start-up
on --instance; checkpoint:PATH is --checkpoint), or --catalogue DIR: every supplier's recommended policy of a
catalogue folder (platform/recommend.py), each its own application at /SUPPLIER/decide (the supplier's folder name),
/SUPPLIER/healthz and /SUPPLIER/info. Ray: an embedded
local Ray by default, a cluster with --address or RAY_ADDRESS (as under `ray job submit`). The service binds
127.0.0.1 unless --host says otherwise (docs/cluster.md: exposing it safely). Concurrent requests share one
policy call (--max-batch-size, --batch-wait-ms; --max-batch-size 1 turns batching off). A Serve config file
for `serve run` / `serve deploy` is platform/serve.yaml.
"""

import argparse
import os
import socket
import time
from pathlib import Path

from cli.scripts import learned_policy_flags, non_negative_real, port, positive_int, ray_address, run_cli, script_parser
from plumbing.errors import InputError
from plumbing.files import input_file
from policies.names import PolicySpec, checkpoint_spec, policy_spec
from trainers.checkpoint import checkpoint_file

APP_NAME = "decisions"


def check_free(host: str, number: int) -> None:
    """Refuse a --host this machine cannot bind or a --port in use, before Ray starts (an embedded Ray's proxy binds here)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, number))
    except OSError as exc:
        raise InputError(f"--host {host} --port {number}: cannot listen there ({exc.strerror or exc})") from None


def parse_args() -> argparse.Namespace:
    """The options, with the policy as a spec (--checkpoint PATH becomes checkpoint:PATH) in `policy`."""
    parser = script_parser(__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="a checkpoint of any learned method, or a run folder (its best.pt, else checkpoint.pt)")
    which.add_argument("--policy", type=policy_spec, help="a named policy (as platform/evaluate.py: user-rule:PATH too) or checkpoint:PATH")
    which.add_argument("--catalogue", help="a catalogue folder (platform/recommend.py --out): each supplier's recommendation at /SUPPLIER/")
    parser.add_argument("--instance", help="instance JSON: required with --policy NAME; with a checkpoint, another instance than its own")
    learned_policy_flags(parser, "--checkpoint or checkpoint:PATH")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=port, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--replicas", type=positive_int, default=1, help="Serve replicas (default 1)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (and Ray CPUs) per replica (default 1)")
    parser.add_argument(
        "--max-batch-size", type=positive_int, default=32, help="most requests per policy call; 1: no batching (default 32)"
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=non_negative_real,
        default=0.0,
        help="wait for more requests before a partial batch (default 0: a batch runs when the policy is free)",
    )
    parser.add_argument("--max-body-bytes", type=positive_int, default=8 * 2**20, help="largest request body (default 8 MiB)")
    parser.add_argument("--access-log", action="store_true", help="a log line per request in the replica's log (default off)")
    parser.add_argument(
        "--address", type=ray_address, help="Ray cluster address HOST:PORT or auto (default: RAY_ADDRESS, else an embedded Ray)"
    )
    args = parser.parse_args()
    if args.checkpoint:
        args.policy = checkpoint_spec(args.checkpoint)
    return args


def applications(args: argparse.Namespace) -> list[tuple[str, str, PolicySpec, str]]:
    """(application name, route prefix, policy, instance path) of each application to deploy: the one policy of
    --checkpoint or --policy at /, or each supplier's recommendation of --catalogue at /SUPPLIER."""
    if args.catalogue is None:
        policy = args.policy
        if policy.learned:
            input_file(checkpoint_file(policy.path), "checkpoint")
        elif not args.instance:
            raise InputError(f"--policy {policy}: needs --instance (the instance to tune or solve it on)")
        if args.instance:
            input_file(args.instance, "instance file")
        return [(APP_NAME, "/", policy, args.instance or "")]
    from catalogue.flow import catalogue_services

    if args.instance:
        raise InputError("--instance: a catalogue's suppliers act on their own instances (suppliers/SUPPLIER/instance.json)")
    return [(f"{APP_NAME}-{s.route}", f"/{s.route}", s.policy, str(s.instance)) for s in catalogue_services(Path(args.catalogue))]


def main() -> None:
    args = parse_args()
    apps = applications(args)

    embedded = not (args.address or os.environ.get("RAY_ADDRESS"))
    if embedded:
        check_free(args.host, args.port)

    from ray_access.session import init_ray, stop_ray
    from serving.app import REQUEST_TIMEOUT_S, ServiceConfig, application  # imports Ray Serve

    settings = {
        "mode": args.mode,
        "precision": args.precision,
        "replicas": args.replicas,
        "threads": args.threads,
        "max_batch_size": args.max_batch_size,
        "batch_wait_ms": args.batch_wait_ms,
        "max_body_bytes": args.max_body_bytes,
        "access_log": args.access_log,
    }
    deciders = []
    for name, route, policy, instance in apps:
        config = ServiceConfig(policy=policy, instance=instance, **settings)
        print(f"loading {policy}" + ("" if policy.learned else " (tuned or solved on the instance first)"), flush=True)
        deciders.append((name, route, config, config.decider(progress=True)))
    deploying = []
    try:
        init_ray(len(apps) * args.replicas * args.threads, args.address)
        from ray import serve

        serve.start(http_options={"host": args.host, "port": args.port, "request_timeout_s": REQUEST_TIMEOUT_S})
        host = f"[{args.host}]" if ":" in args.host else args.host
        for name, route, config, decider in deciders:
            deploying.append(name)
            serve.run(application(config, decider), name=name, route_prefix=route, blocking=False)
            where = f"http://{host}:{args.port}{route.rstrip('/')}/decide"
            print(f"serving {decider.info['method']} (n = {decider.instance.n}) at {where}", flush=True)
        print("Ctrl-C stops", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping the service", flush=True)
    finally:
        # On a cluster only this application goes: Serve and other applications stay. An embedded Ray ends with all in
        # it, Serve included, and its agents (stop_ray); serve.shutdown there would only add Ray's line "Task
        # ServeController.graceful_shutdown failed ... killed by `ray.kill`" (the controller ends while it answers).
        if not embedded:
            for name in deploying:
                serve.delete(name)
        stop_ray()
    print("stopped", flush=True)


if __name__ == "__main__":
    run_cli(main)

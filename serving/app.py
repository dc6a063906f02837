"""The decision service: one policy (a serving.decisions.Decider) behind HTTP on Ray Serve, with dynamic batching.

  POST /decide   a state, or a list of states (decide.py's format) -> an answer, or a list of answers; its
                 Server-Timing header says where the replica spent the request's time (TIMINGS)
  GET  /healthz  200 {"status": "ready"} once a replica answers (HEAD: 200 without a body)
  GET  /info     method, mode, n, instance_hash, checkpoint_sha256, the batching settings and this replica's counters

The API, its status codes and its limits are in docs/formats.md. Bad input is a 4xx with one message naming the
field ({"error": "..."}); a 5xx is a bug, or a checkpoint whose weights give a non-finite decision, and its
traceback goes to the replica's log only.

platform/serve.py builds the application from its flags; a Serve config file (platform/serve.yaml) names
`serving.app:build_app`, whose args are ServiceConfig's fields. The policy is loaded (or tuned) once, where the
application is built, and travels to every replica with the deployment's arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from envs.dynamics import State
from envs.instance import Instance
from plumbing import validate
from plumbing.errors import InputError
from policies.classical import ZERO
from policies.names import PolicySpec, parse_policy
from serving.decisions import Decider, PolicyError, load_decider, read_states
from trainers.policy import MODES, PRECISIONS

MAX_BODY_BYTES = 8 * 2**20
"""Default request body limit: 100 states at n = 1,024 take about 4 MiB of JSON."""
DISCARD_BYTES = 64 * 2**20
"""Most bytes of a body over the limit that are read and dropped before the 413, so that a client that sends its whole
body before it reads the answer (urllib, requests) gets the 413: a server that answers and closes with the body
unread resets the connection, and the client sees "Connection reset by peer". A body announced larger than this is
refused without reading it."""
BODY_TIMEOUT_S = 20.0
"""A body not received within this time is refused (408, the API's JSON error), before Serve's proxy gives up on the
request (REQUEST_TIMEOUT_S) with its own text answer."""
REQUEST_TIMEOUT_S = 30.0
"""Serve's proxy answers 408 to a request not answered within this time (HTTP option request_timeout_s): no connection
hangs, not even on a replica that died with the request."""
ONGOING_REQUESTS = 64
"""Requests a replica takes in at once (at least twice max_batch_size: a full batch in the policy, the next one
queueing). The same with batching off, so that on and off differ in batching only: with fewer, Serve's proxy holds
the rest and retries them with back-off (32 clients got 8 decisions/s without batching: docs/benchmarks.md)."""

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class ServiceConfig:
    """The service's settings: platform/serve.py's flags, or a Serve config file's application args."""

    policy: PolicySpec
    """The policy (policies/names.py; a name given is parsed): checkpoint:PATH (a checkpoint of any learned method) or a
    named policy."""
    instance: str = ""
    """Instance JSON: required for a named policy; for a checkpoint, an instance other than its own (OR-Transformer)."""
    mode: str = "greedy"
    """A learned policy's opening: greedy (Y = 1{p > 0.5}) or sampled (the first draw of the checkpoint's seeded stream)."""
    precision: str = "float32"
    """An OR-Transformer or HPO checkpoint's arithmetic: float32, or bfloat16 autocast (trainers.policy.LearnedPolicy)."""
    replicas: int = 1
    """Serve replicas, each with the whole policy."""
    threads: int = 1
    """torch threads per replica; also the CPUs each replica reserves in Ray."""
    max_batch_size: int = 32
    """Most requests that share one policy call; 1 turns batching off (each request is its own call)."""
    batch_wait_ms: float = 0.0
    """How long a replica waits for more requests before it runs a batch that is not full. At 0 a batch runs as soon
    as the policy is free, with every request queued by then: one request alone waits for nothing, and under load
    the requests that arrive during a policy call share the next one."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Largest request body; a larger one gets 413."""
    access_log: bool = False
    """Serve's line per request in the replica's log (errors are logged either way); off, as it costs CPU per request."""

    def __post_init__(self):
        object.__setattr__(self, "policy", parse_policy(self.policy))  # a Python call's name; a spec passes as it is

    @classmethod
    def from_dict(cls, data: Any, where: str = "service args") -> ServiceConfig:
        """Checked field by field; unknown keys are refused, naming the allowed ones."""
        if not isinstance(data, dict):
            raise InputError(f"{where}: expected a mapping of {[f.name for f in fields(cls)]}, got {validate.describe(data)}")
        validate.keys(data, where, [f.name for f in fields(cls)], ["policy"])
        values = {**asdict(cls(policy=ZERO)), **data}
        policy = parse_policy(values["policy"], f"{where} field 'policy'", validate.describe)
        if not isinstance(values["instance"], str):
            raise InputError(f"{where} field 'instance': expected a path, got {validate.describe(values['instance'])}")
        return cls(
            policy=policy,
            instance=values["instance"],
            mode=validate.choice(values["mode"], f"{where} field 'mode'", MODES),
            precision=validate.choice(values["precision"], f"{where} field 'precision'", PRECISIONS),
            replicas=validate.integer(values["replicas"], f"{where} field 'replicas'", 1),
            threads=validate.integer(values["threads"], f"{where} field 'threads'", 1),
            max_batch_size=validate.integer(values["max_batch_size"], f"{where} field 'max_batch_size'", 1),
            batch_wait_ms=validate.real(values["batch_wait_ms"], f"{where} field 'batch_wait_ms'", 0.0),
            max_body_bytes=validate.integer(values["max_body_bytes"], f"{where} field 'max_body_bytes'", 1),
            access_log=validate.boolean(values["access_log"], f"{where} field 'access_log'"),
        )

    def decider(self, progress: bool = False) -> Decider:
        """The policy, loaded from its checkpoint or tuned (solved) on the instance now."""
        instance = Instance.load(self.instance) if self.instance else None
        return load_decider(self.policy, instance, self.mode, progress=progress, precision=self.precision)


class MalformedBody(InputError):
    """A request body that is not JSON as the project's files must be (plumbing.validate.load_json)."""


class HTTPError(Exception):
    """A request the service refuses: the status code and the one message naming the field."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; HTTPError 413 for one larger than `limit` bytes (read and dropped up to DISCARD_BYTES first),
    408 for one not received within BODY_TIMEOUT_S."""
    length = request.headers.get("content-length")
    if length is not None and not length.isdigit():
        raise HTTPError(400, f"header 'Content-Length': expected a byte count, got {length!r}")
    try:
        chunks, size = await asyncio.wait_for(receive(request, limit), BODY_TIMEOUT_S)
    except TimeoutError:
        raise HTTPError(408, f"request body: not received within {BODY_TIMEOUT_S:g} s") from None
    if size > limit:
        raise HTTPError(413, f"request body: larger than the limit of {limit} bytes (max_body_bytes)")
    return b"".join(chunks)


async def receive(request: Request, limit: int) -> tuple[list[bytes], int]:
    """(the body's chunks, its size): all of a body within `limit`; none of a larger one, whose size is then counted
    only up to the first chunk beyond DISCARD_BYTES or `limit`, the larger (or its Content-Length, when that already
    says so)."""
    length, most = request.headers.get("content-length"), max(limit, DISCARD_BYTES)
    if length is not None and int(length) > most:
        return [], int(length)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            break
        if size <= limit:
            chunks.append(chunk)
    return ([] if size > limit else chunks), size


def parse_states(body: bytes, content_type: str | None, instance: Instance) -> tuple[State, bool]:
    """The body as a batch of states, and whether it held one state object (not a list); HTTPError 415, 400 or 422."""
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        raise HTTPError(415, f"header 'Content-Type': expected application/json, got {content_type!r}")
    try:
        data = validate.load_json(body.decode("utf-8"), "request", "body", error=MalformedBody)
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"request 'body' is not valid UTF-8 (byte {exc.start})") from None
    except MalformedBody as exc:  # not JSON, a key written twice, nested too deeply
        raise HTTPError(400, str(exc)) from None
    try:
        return read_states(data, instance, "request body"), isinstance(data, dict)
    except InputError as exc:
        raise HTTPError(422, str(exc)) from None


ROUTES = {"/decide": "POST", "/healthz": "GET", "/info": "GET"}
TIMINGS = ("read", "parse", "queue", "decide", "respond", "replica")
"""POST /decide's Server-Timing entries, in ms: the body received, parsed and checked, waiting for the policy (the
batch wait and the calls before), the policy call that answered it (shared by its batch), the answer written as
JSON, and all of it (the handler's time in the replica; the rest of what a client sees is Serve's proxy, the hop
to the replica, and the network)."""


class Batcher:
    """Requests' states queued for one policy, answered in batches on one worker thread, so that the event loop goes on reading bodies and
    answering /healthz and /info while a batch computes. A batch takes the requests queued when the policy is free (up to
    `max_batch_size`), once the queue holds that many or `wait_s` has passed since the policy was free with a request queued;
    `max_batch_size` 1 turns batching off."""

    def __init__(self, decide_many: Callable[[list[State]], list], max_batch_size: int, wait_s: float, on_batch: Callable[[int], None]):
        self.decide_many, self.max_batch_size, self.wait_s, self.on_batch = decide_many, max_batch_size, wait_s, on_batch
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decide")
        self.queued: list[tuple[State, asyncio.Future]] = []
        self.arrived = asyncio.Event()
        self.runner: asyncio.Task | None = None
        self.pending = 0
        """Requests given to `decide` and not yet answered (queued, waiting for the thread, or computing)."""
        self.computing = 0
        """Requests in the policy call running now (set on the worker thread)."""

    async def decide(self, state: State) -> tuple[Any, float, float]:
        """(Decider.decide_many's outcome for this request, its batch's start and end on time.perf_counter)."""
        self.pending += 1
        try:
            return await self._decide(state)
        finally:
            self.pending -= 1

    async def _decide(self, state: State) -> tuple[Any, float, float]:
        if self.max_batch_size == 1:  # no batch to form: straight to the worker thread's queue, no hop through the event loop
            self.on_batch(1)
            answers, started, ended = await asyncio.get_running_loop().run_in_executor(self.compute, self.timed, [state])
            return answers[0], started, ended
        outcome = asyncio.get_running_loop().create_future()
        self.queued.append((state, outcome))
        self.arrived.set()
        if self.runner is None or self.runner.done():  # started in the loop that runs the requests
            self.runner = asyncio.create_task(self.run())
        return await outcome

    def timed(self, states: list[State]) -> tuple[list, float, float]:
        """decide_many on the worker thread, with its start and end (the wait for the thread counts as the queue's)."""
        started, self.computing = time.perf_counter(), len(states)
        try:
            answers = self.decide_many(states)
            if len(answers) != len(states):
                raise RuntimeError(f"the policy answered {len(answers)} of {len(states)} requests")
        except Exception as exc:  # a bug: each request of the batch gets it (the handler logs it, the client gets a 500)
            answers = [exc] * len(states)
        self.computing = 0
        return answers, started, time.perf_counter()

    @property
    def waiting(self) -> int:
        """Requests waiting for the policy now: in the queue of a batch to come, or of the worker thread."""
        return self.pending - self.computing

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.arrived.wait()
            deadline = loop.time() + self.wait_s
            while len(self.queued) < self.max_batch_size and (left := deadline - loop.time()) > 0:
                self.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), left)
            batch = [(state, outcome) for state, outcome in self.queued[: self.max_batch_size] if not outcome.cancelled()]
            self.queued = self.queued[self.max_batch_size :]
            if not self.queued:
                self.arrived.clear()
            if not batch:
                continue
            self.on_batch(len(batch))
            answers, started, ended = await loop.run_in_executor(self.compute, self.timed, [state for state, _ in batch])
            for (_, outcome), answer in zip(batch, answers):
                if not outcome.done():
                    outcome.set_result((answer, started, ended))


@serve.deployment
class DecisionService:
    """A replica: its copy of the Decider, the batching settings, and counters of what it answered."""

    def __init__(self, decider: Decider, config: ServiceConfig):
        torch.set_num_threads(config.threads)
        self.decider, self.config = decider, config
        self.requests = self.states = self.refused = self.batches = self.largest_batch = 0
        self.batcher = Batcher(decider.decide_many, config.max_batch_size, config.batch_wait_ms / 1000, self.count_batch)

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            path = request.url.path.removeprefix(request.scope.get("root_path", "")) or "/"  # below the route prefix
            if path not in ROUTES:
                raise HTTPError(404, f"path {path!r}: expected one of {list(ROUTES)}")
            if request.method == "HEAD" and ROUTES[path] == "GET":
                return Response(status_code=200)
            if request.method != ROUTES[path]:
                raise HTTPError(405, f"{path}: expected {ROUTES[path]}, got {request.method}")
            if path == "/healthz":
                return JSONResponse({"status": "ready"})
            if path == "/info":
                return JSONResponse(self.info())
            arrived = time.perf_counter()
            body = await read_body(request, self.config.max_body_bytes)
            read = time.perf_counter()
            state, single = parse_states(body, request.headers.get("content-type"), self.decider.instance)
            parsed = time.perf_counter()
            answer, started, ended = await self.batcher.decide(state)
            if isinstance(answer, Exception):
                raise answer
            self.requests, self.states = self.requests + 1, self.states + state.batch
            response = JSONResponse(answer.to_json(single))
            stamps = (arrived, read, parsed, started, ended, time.perf_counter())
            spans = [*(later - earlier for earlier, later in zip(stamps, stamps[1:])), stamps[-1] - arrived]
            response.headers["Server-Timing"] = ", ".join(f"{name};dur={1e3 * span:.3f}" for name, span in zip(TIMINGS, spans))
            return response
        except HTTPError as exc:
            self.refused += 1
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except PolicyError as exc:
            logger.error("decision service: %s", exc)
            return JSONResponse({"error": str(exc)}, status_code=500)
        except Exception:
            logger.exception("decision service: a request failed")
            return JSONResponse({"error": "internal error: the traceback is in the server log"}, status_code=500)

    def count_batch(self, requests: int) -> None:
        self.batches, self.largest_batch = self.batches + 1, max(self.largest_batch, requests)

    def info(self) -> dict[str, Any]:
        replica = serve.get_replica_context().replica_id.to_full_id_str()
        settings = {k: getattr(self.config, k) for k in ("replicas", "threads", "max_batch_size", "batch_wait_ms", "max_body_bytes")}
        counters = {
            "requests": self.requests,
            "states": self.states,
            "refused": self.refused,
            "forward_passes": self.decider.forward_passes,
            "batches": self.batches,
            "largest_batch": self.largest_batch,
            "queued": self.batcher.waiting,
        }
        return {**self.decider.info, "settings": settings, "replica": replica, "counters": counters}


def application(config: ServiceConfig, decider: Decider) -> Application:
    """The Serve application of `decider` with `config`'s replicas, threads and batching."""
    return DecisionService.options(
        num_replicas=config.replicas,
        max_ongoing_requests=max(ONGOING_REQUESTS, 2 * config.max_batch_size),
        ray_actor_options={"num_cpus": config.threads},
        logging_config={"enable_access_log": config.access_log},
    ).bind(decider, config)


def build_app(args: dict) -> Application:
    """A Serve config file's application builder (import_path serving.app:build_app): args are ServiceConfig's fields."""
    config = ServiceConfig.from_dict(dict(args))
    return application(config, config.decider())

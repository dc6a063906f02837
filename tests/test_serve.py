"""The decision service (serving.app on Ray Serve, platform/serve.py): its answers are platform/decide.py's for the
same checkpoint and states; bad requests get a 4xx naming the field; concurrent requests share policy calls; a
killed replica is replaced. One service per module, on the session's Ray (conftest.ray_session). The tests that need the
service are slow (starting and stopping Serve alone takes 10-15 s here); the Decider, the config file and the service
args are checked without it."""

import copy
import hashlib
import http.client
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import INSTANCE, METHODS, ROOT, clear_of_one_half, run_script, single_item
from helpers import Gate

from envs.instance import Instance
from plumbing.errors import InputError
from policies.classical import RULES, make_policy
from policies.names import CHECKPOINT_PREFIX
from serving.decisions import Decider, PolicyError, load_decider, read_states

# INSTANCE (conftest): paper_instance(2, 0): lead times [3, 3] (in_transit[i][2] is 0), qbar [24.8, 22.4]
STATES = [
    {"inventory": [1, 2], "in_transit": [[0, 0, 0], [3, 1, 0]], "factor": 0.5},
    {"inventory": [-40, 80.5], "in_transit": [[24.8, 0, 0], [0, 22.4, 0]], "factor": -2},
    {"inventory": [300, -7], "in_transit": [[5, 5, 0], [0, 0, 0]], "factor": 10},
    {"inventory": [0, 0], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": -9.5},
]
MAX_BODY = 4096
"""The test service's body limit (bytes): the four states fit, the too-large row does not."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(port: int, method: str, path: str, body: bytes = None, content_type="application/json", timeout: float = 60.0):
    """(status, JSON answer) of one request on a fresh connection; a hung connection fails by the timeout."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def decide_py(checkpoint, states: list[dict], tmp_path, mode="greedy") -> list[dict]:
    """decide.py's answers to a list of states: one answer object per state, as POST /decide answers a list."""
    (tmp_path / "states.json").write_text(json.dumps(states))
    result = run_script("decide.py", "--checkpoint", checkpoint, "--state", tmp_path / "states.json", "--mode", mode)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def assert_same_answers(answers: list[dict], expected: list[dict]) -> None:
    """The service's answers against decide.py's (one object per state each): the numbers to float32 rounding (a batch
    of other states changes the last bits of a matrix product), and Y and O = Y Q where p is clear of 0.5
    (conftest.clear_of_one_half), since that rounding may flip a p within it to the other side."""
    assert len(answers) == len(expected)
    for key in ("open_probability", "quantity"):
        np.testing.assert_allclose([a[key] for a in answers], [e[key] for e in expected], rtol=1e-5, atol=1e-6)
    for answer, want, clear in zip(answers, expected, clear_of_one_half([e["open_probability"] for e in expected])):
        assert answer["order"] == [answer["open"] * q for q in answer["quantity"]]
        if clear:
            assert answer["open"] == want["open"]
            np.testing.assert_allclose(answer["order"], want["order"], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def service(ray_session, trained):
    """The or-transformer checkpoint of the session's runs, served greedily by one replica: (port, checkpoint)."""
    from ray import serve

    from serving.app import REQUEST_TIMEOUT_S, ServiceConfig, application

    checkpoint = trained["or-transformer"].checkpoint
    config = ServiceConfig(policy=CHECKPOINT_PREFIX + str(checkpoint), max_batch_size=64, max_body_bytes=MAX_BODY)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": REQUEST_TIMEOUT_S})
    serve.run(application(config, config.decider()), name="test-decisions", route_prefix="/")
    yield port, checkpoint
    serve.shutdown()


@pytest.mark.slow
def test_answers_are_decide_py_answers(service, tmp_path):
    port, checkpoint = service
    expected = decide_py(checkpoint, STATES, tmp_path)
    status, answers = call(port, "POST", "/decide", json.dumps(STATES).encode())
    assert status == 200 and len(answers) == 4
    assert_same_answers(answers, expected)
    for k, state in enumerate(STATES):  # one state object -> one answer object
        status, answer = call(port, "POST", "/decide", json.dumps(state).encode())
        assert status == 200 and isinstance(answer, dict)
        assert_same_answers([answer], [expected[k]])

    status, info = call(port, "GET", "/info")
    assert status == 200 and info["method"] == "or-transformer" and info["n"] == 2 and info["mode"] == "greedy"
    assert info["instance_hash"] == INSTANCE.content_hash()
    assert info["checkpoint_sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert call(port, "GET", "/healthz") == (200, {"status": "ready"})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:  # HEAD: the status without a body (it was a 405)
        connection.request("HEAD", "/healthz")
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b""
    finally:
        connection.close()


@pytest.mark.slow
def test_an_answer_says_where_the_replica_spent_its_time(service):
    """The Server-Timing header of POST /decide: serving.app.TIMINGS in order, each a duration >= 0, the first five
    (body read, parse, queue, policy call, answer) consecutive spans that make up the last (the replica's time)."""
    from serving.app import TIMINGS

    connection = http.client.HTTPConnection("127.0.0.1", service[0], timeout=60)
    try:
        connection.request("POST", "/decide", body=json.dumps(STATES[0]).encode(), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["order"] is not None
        entries = [part.strip().split(";dur=") for part in response.getheader("Server-Timing").split(",")]
    finally:
        connection.close()
    assert [name for name, _ in entries] == list(TIMINGS)
    spans = [float(ms) for _, ms in entries]
    assert min(spans) >= 0 and sum(spans[:-1]) == pytest.approx(spans[-1], abs=0.005)  # each written to 0.001 ms


def body(text: str) -> bytes:
    return text.encode()


def state_with(**change) -> bytes:
    return json.dumps({**STATES[0], **change}).encode()


BAD_REQUESTS = [  # id, method, path, body, content type, status, what the message says
    ("malformed-json", "POST", "/decide", body('{"inventory": [1, 2],'), "application/json", 400, "request 'body' is not valid JSON"),
    ("not-utf8", "POST", "/decide", b'{"inventory": "\xff"}', "application/json", 400, "request 'body' is not valid UTF-8"),
    ("nested-too-deeply", "POST", "/decide", body("[" * 3000), "application/json", 400, "nests lists or objects too deeply"),
    (
        "key-written-twice",
        "POST",
        "/decide",
        body('{"inventory": [1, 2], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": 0, "factor": 1}'),
        "application/json",
        400,
        "request 'body': key 'factor' is written twice in one object",
    ),
    ("text-content-type", "POST", "/decide", state_with(), "text/plain", 415, "header 'Content-Type': expected application/json"),
    ("no-content-type", "POST", "/decide", state_with(), None, 415, "header 'Content-Type'"),
    (
        "body-over-the-limit",
        "POST",
        "/decide",
        json.dumps([STATES[0]] * 60).encode(),
        "application/json",
        413,
        f"limit of {MAX_BODY} bytes",
    ),
    (
        "wrong-item-count",
        "POST",
        "/decide",
        state_with(inventory=[1, 2, 3]),
        "application/json",
        422,
        "state 0 field 'inventory': expected 2 numbers",
    ),
    (
        "in-transit-ragged",
        "POST",
        "/decide",
        state_with(in_transit=[[0, 0, 0], [0, 0]]),
        "application/json",
        422,
        "state 0 field 'in_transit'[1]: expected 3 numbers",
    ),
    (
        "in-transit-negative",
        "POST",
        "/decide",
        state_with(in_transit=[[-1, 0, 0], [0, 0, 0]]),
        "application/json",
        422,
        "state 0 field 'in_transit'[0][0]: -1 is negative",
    ),
    (
        "in-transit-beyond-the-lead-time",
        "POST",
        "/decide",
        state_with(in_transit=[[0, 0, 5], [0, 0, 0]]),
        "application/json",
        422,
        "state 0 field 'in_transit'[0][2]: expected 0, got 5: item 0 has lead time L = 3",
    ),
    (
        "in-transit-over-qbar",
        "POST",
        "/decide",
        state_with(in_transit=[[30, 0, 0], [0, 0, 0]]),
        "application/json",
        422,
        "exceeds qbar_0 = 24.8",
    ),
    (
        "inventory-nan",
        "POST",
        "/decide",
        body('{"inventory": [1, NaN], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": 0}'),
        "application/json",
        422,
        "state 0 field 'inventory'[1]: expected a finite number, got NaN",
    ),
    (
        "factor-overflows",
        "POST",
        "/decide",
        body('{"inventory": [1, 2], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": 1e400}'),
        "application/json",
        422,
        "state 0 field 'factor': expected a finite number, got Infinity",
    ),
    (
        "factor-outside-the-stationary-range",
        "POST",
        "/decide",
        state_with(factor=11),
        "application/json",
        422,
        "'factor': 11 is outside [-10, 10]",
    ),
    (
        "inventory-text",
        "POST",
        "/decide",
        state_with(inventory=[1, "2"]),
        "application/json",
        422,
        "'inventory'[1]: expected a number, got a string",
    ),
    ("empty-list", "POST", "/decide", body("[]"), "application/json", 422, "request body: an empty list"),
    ("not-a-state", "POST", "/decide", body('"state"'), "application/json", 422, "request body: expected a state object or a list of them"),
    (
        "second-state-misses-a-key",
        "POST",
        "/decide",
        json.dumps([STATES[0], {"inventory": [1, 2], "in_transit": [[0, 0, 0], [0, 0, 0]]}]).encode(),
        "application/json",
        422,
        "state 1: missing keys ['factor']",
    ),
    ("unknown-key", "POST", "/decide", state_with(time=3), "application/json", 422, "state 0: unknown keys ['time']"),
    ("get-decide", "GET", "/decide", None, None, 405, "/decide: expected POST, got GET"),
    ("post-info", "POST", "/info", state_with(), "application/json", 405, "/info: expected GET, got POST"),
    ("unknown-path", "GET", "/decisions", None, None, 404, "path '/decisions': expected one of ['/decide', '/healthz', '/info']"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, path, payload, content_type, status, message", [row[1:] for row in BAD_REQUESTS], ids=[row[0] for row in BAD_REQUESTS]
)
def test_a_bad_request_gets_a_4xx_naming_the_field(service, method, path, payload, content_type, status, message):
    got, answer = call(service[0], method, path, payload, content_type)
    assert (got, list(answer)) == (status, ["error"]) and message in answer["error"], answer


@pytest.mark.slow
def test_requests_queued_during_a_policy_call_share_the_next_one(service, tmp_path):
    """Catches batching that never merges requests (each request its own policy call), a batch answered by more than
    one call, and a wrong answer to concurrent requests. The replica's first policy call is held at a gate
    (tests/helpers.py) until the 15 other requests are queued in the replica, as its /info says: they must then
    share the next call, with no batch wait."""
    from ray import serve

    from serving.app import ONGOING_REQUESTS, DecisionService, ServiceConfig

    port, checkpoint = service
    gate = Gate(tmp_path / "gate", call=("serving.decisions:Decider.decide_many", "before", 1))
    config = ServiceConfig(policy=CHECKPOINT_PREFIX + str(checkpoint), max_batch_size=64)
    options = {"num_cpus": 1, "runtime_env": {"env_vars": gate.env}}
    serve.run(
        DecisionService.options(max_ongoing_requests=ONGOING_REQUESTS, ray_actor_options=options).bind(config.decider(), config),
        name="test-gated",
        route_prefix="/gated",
    )
    requests = [STATES[k % 4] for k in range(16)]
    try:
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            sent = [pool.submit(call, port, "POST", "/gated/decide", json.dumps(requests[0]).encode())]
            gate.wait()
            sent += [pool.submit(call, port, "POST", "/gated/decide", json.dumps(state).encode()) for state in requests[1:]]
            deadline = time.monotonic() + 120
            while call(port, "GET", "/gated/info")[1]["counters"]["queued"] < len(requests) - 1:
                assert time.monotonic() < deadline, "the requests did not reach the replica's queue"
                time.sleep(0.05)
            gate.release()
            answers = [future.result() for future in sent]
        counters = call(port, "GET", "/gated/info")[1]["counters"]
    finally:
        serve.delete("test-gated")
    assert all(status == 200 for status, _ in answers), answers
    expected = decide_py(checkpoint, STATES, tmp_path)
    assert_same_answers([answer for _, answer in answers], [expected[k % 4] for k in range(16)])
    assert (counters["requests"], counters["batches"], counters["largest_batch"], counters["forward_passes"]) == (16, 2, 15, 2)
    assert counters["queued"] == 0


POISON_FACTOR = 7.25
"""The factor of the one state that poisoned_rule cannot act on."""


def poisoned_rule(state, tinst):
    """A deterministic rule (Y = 1 where the factor is negative, Q = qbar) whose quantity is NaN for a state with the
    factor POISON_FACTOR, as a checkpoint whose weights cannot act on one state."""
    quantity = tinst.qbar.expand(state.batch, -1).clone()
    quantity[state.factor == POISON_FACTOR] = float("nan")
    return (state.factor < 0).float(), quantity


@pytest.mark.slow
def test_one_bad_request_of_a_batch_fails_alone(service):
    """Catches one request whose decision is not finite failing every request of its batch (each client got a 500),
    and an error naming the state by its index in the merged batch instead of in the client's own request. Both
    requests share one batch as an explicit event: at most 2 requests per batch and a batch wait far longer than two
    concurrent requests take to arrive, so the replica runs the batch when the second one is in it."""
    from ray import cloudpickle, serve

    from serving.app import ServiceConfig, application

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the replica cannot import this test module
    decider = Decider(poisoned_rule, INSTANCE, learned=False, mode="deterministic", label="policy 'poisoned'", info={})
    serve.run(
        application(ServiceConfig(policy="zero", max_batch_size=2, batch_wait_ms=20_000), decider),
        name="test-poisoned",
        route_prefix="/poisoned",
    )
    try:
        good, bad = [STATES[0], STATES[1]], [STATES[2], STATES[3], {**STATES[0], "factor": POISON_FACTOR}]
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = list(pool.map(lambda states: call(service[0], "POST", "/poisoned/decide", json.dumps(states).encode()), (good, bad)))
        (good_status, good_answer), (bad_status, bad_answer) = answers
        assert good_status == 200 and [a["open"] for a in good_answer] == [0, 1], good_answer
        assert [a["order"] for a in good_answer] == [[0, 0], INSTANCE.qbar.astype("float32").tolist()]
        assert bad_status == 500 and "policy 'poisoned' gives a non-finite open probability or quantity for state 2:" in bad_answer["error"]
        counters = call(service[0], "GET", "/poisoned/info")[1]["counters"]
        assert (counters["batches"], counters["largest_batch"], counters["forward_passes"]) == (1, 2, 1)
    finally:
        serve.delete("test-poisoned")


@pytest.mark.slow
def test_a_client_that_sends_its_whole_body_first_gets_the_413(service):
    """Catches a 413 answered with the body unread: the server then closes a connection that still holds the body,
    and urllib, which sends the whole body before it reads the answer, saw "Connection reset by peer"."""
    body = b" " * (32 * 2**20)  # far over MAX_BODY and over what loopback socket buffers hold (27 MB was reset)
    request = urllib.request.Request(f"http://127.0.0.1:{service[0]}/decide", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413 and f"limit of {MAX_BODY} bytes" in json.loads(refused.value.read())["error"]


def raw_request(port: int, head: bytes, timeout: float) -> tuple[int, str, bytes]:
    """(status, Content-Type, body) of a request written byte for byte on a fresh connection (a client that
    http.client would not let a test be)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as client:
        client.sendall(head)
        response = http.client.HTTPResponse(client)
        response.begin()
        return response.status, response.getheader("content-type", ""), response.read()


@pytest.mark.slow
def test_a_stalled_body_gets_the_api_s_json_408(service):
    """Catches a body that never arrives answered by Serve's proxy at its request timeout with a text/plain 408
    instead of the API's JSON error."""
    from serving.app import BODY_TIMEOUT_S, REQUEST_TIMEOUT_S

    head = b"POST /decide HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    status, content_type, answer = raw_request(service[0], head, REQUEST_TIMEOUT_S + 30)
    assert (status, content_type) == (408, "application/json"), answer
    assert json.loads(answer) == {"error": f"request body: not received within {BODY_TIMEOUT_S:g} s"}


@pytest.mark.parametrize("method", METHODS)
def test_a_replica_copy_of_the_decider_answers_each_request_as_decide_py(method, trained):
    """Each replica gets the Decider pickled (as Serve ships a deployment's arguments). Two requests in one batch get
    the answers that each gets alone, which is decide.py's (test_decide): in sampled mode, each from the start of the
    seeded stream."""
    checkpoint = CHECKPOINT_PREFIX + str(trained[method].checkpoint)
    first, second = (read_states(part, INSTANCE, "request body") for part in (STATES[:3], STATES[3:]))
    for mode in ("greedy", "sampled"):
        alone = load_decider(checkpoint, mode=mode)
        copy = pickle.loads(pickle.dumps(alone))
        for together, state in zip(copy.decide_many([first, second]), (first, second)):
            assert_same_answers(together.records(), alone.decide(state).records())
        assert copy.forward_passes == (1 if mode == "greedy" else 2)


@pytest.mark.parametrize(
    "max_batch_size, calls", [(64, [[0], [1, 2, 3, 4, 5]]), (2, [[0], [1, 2], [3, 4], [5]]), (1, [[k] for k in range(6)])]
)
def test_a_batch_takes_the_requests_queued_while_the_policy_computes(max_batch_size, calls):
    """serving.app.Batcher with no batch wait: the first request's call is held (an event) until five more are queued;
    then they share the next calls, up to max_batch_size each, in arrival order, and each request gets its own answer.
    Catches batching that never merges, a batch over its size, a request answered twice or by another's answer."""
    import asyncio
    import threading

    from serving.app import Batcher

    computing, release, seen = threading.Event(), threading.Event(), []

    def decide_many(states):
        seen.append(list(states))
        computing.set()
        release.wait()
        return [f"answer {state}" for state in states]

    async def scenario():
        batcher = Batcher(decide_many, max_batch_size, 0.0, lambda size: None)
        first = asyncio.create_task(batcher.decide(0))
        await asyncio.to_thread(computing.wait)
        rest = [asyncio.create_task(batcher.decide(k)) for k in range(1, 6)]
        while batcher.pending < 6:  # each task hands its request over at its first step
            await asyncio.sleep(0)
        assert batcher.waiting == 5  # /info's `queued`: all but the one in the held call, batching on or off
        release.set()
        return [answer for answer, _, _ in await asyncio.gather(first, *rest)]

    assert asyncio.run(scenario()) == [f"answer {k}" for k in range(6)]
    assert seen == calls


def test_each_request_of_a_shared_call_gets_its_own_answer_or_its_own_error():
    """Catches Decider.decide_many raising for every request of a shared policy call when one request's decision is
    not finite, and an error that names the state by its index in the merged call (3 here) instead of in its request."""
    decider = Decider(poisoned_rule, INSTANCE, learned=False, mode="deterministic", label="policy 'poisoned'", info={})
    good = read_states([STATES[0], STATES[1]], INSTANCE, "request body")
    bad = read_states([STATES[2], {**STATES[0], "factor": POISON_FACTOR}], INSTANCE, "request body")
    first, refused, last = decider.decide_many([good, bad, good])
    assert decider.forward_passes == 1
    assert isinstance(refused, PolicyError) and "gives a non-finite open probability or quantity for state 1:" in str(refused)
    for answer in (first, last):
        assert answer.open.tolist() == [0, 1] and answer.order.tolist() == [[0, 0], INSTANCE.qbar.astype("float32").tolist()]
    with pytest.raises(PolicyError, match="for state 1:"):
        decider.decide(bad)


def streamed_request(chunks: list[bytes], length: int | None = None):
    """A starlette Request whose body arrives in `chunks` (announced as `length` bytes, if given), and the list of
    chunks the service has not read yet."""
    from starlette.requests import Request

    unread = list(chunks)

    async def receive():
        return {"type": "http.request", "body": unread.pop(0) if unread else b"", "more_body": bool(unread)}

    headers = [(b"content-length", str(length).encode())] if length is not None else []
    return Request({"type": "http", "method": "POST", "path": "/decide", "headers": headers, "query_string": b""}, receive), unread


@pytest.mark.parametrize(
    "limit, chunks, length, status, unread",
    [
        (20, [b"x" * 6] * 3, None, None, 0),  # within the limit, over DISCARD_BYTES: taken whole
        (5, [b"x" * 4] * 4, None, 413, 0),  # over the limit, within DISCARD_BYTES: read to its end, then refused
        (5, [b"x" * 4] * 6, None, 413, 1),  # beyond DISCARD_BYTES: reading stops at the first chunk past it (the 5th)
        (5, [b"x" * 4] * 6, 24, 413, 6),  # announced beyond DISCARD_BYTES: refused unread
    ],
)
def test_a_body_over_the_limit_is_read_and_dropped_up_to_a_bound(monkeypatch, limit, chunks, length, status, unread):
    """Catches a 413 answered with the body unread (the connection is then reset under a client still sending it), a
    body within a limit larger than DISCARD_BYTES refused, and a body read without bound. DISCARD_BYTES is 16 here."""
    import asyncio

    from serving import app

    monkeypatch.setattr(app, "DISCARD_BYTES", 16)
    request, left = streamed_request(chunks, length)
    if status is None:
        assert asyncio.run(app.read_body(request, limit)) == b"".join(chunks)
    else:
        with pytest.raises(app.HTTPError, match=f"larger than the limit of {limit} bytes") as refused:
            asyncio.run(app.read_body(request, limit))
        assert refused.value.status == status
    assert len(left) == unread


def test_a_classical_answer_depends_on_the_state_alone():
    """A classical rule is deterministic: p = Y, O = Y Q. The periodic family reviews every `period` calls of its clock;
    the Decider restarts the clock for each batch, so asking twice gives the same (review-period) answer."""
    tinst = INSTANCE.to_torch()
    periodic = make_policy(tinst, RULES["periodic"], {"period": 3, "order_up_to_z": 1.0, "cycle_stock": 0.0})
    decider = Decider(periodic, INSTANCE, learned=False, mode="deterministic", label="policy 'periodic'", info={})
    state = read_states([{"inventory": [-5, -5], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": 0}], INSTANCE, "request body")
    first, second = decider.decide(state), decider.decide(state)
    periodic.reset()
    open_order, quantity = periodic(state, tinst)
    assert open_order.tolist() == [1.0] and quantity.min() > 0  # the backlog is below any order-up-to level
    for answer in (first, second):
        assert answer.open.tolist() == [1] and answer.probability.tolist() == [1.0]
        np.testing.assert_array_equal(answer.quantity, quantity)
        np.testing.assert_array_equal(answer.order, quantity)
    assert periodic(state, tinst)[0].tolist() == [0.0]  # the next call of the clock is not a review period


def test_the_n1_optimum_answers_as_at_the_first_period_of_its_horizon():
    """dp-optimal as a Decider: each batch gets the DP's rule at t = 0 (a fresh policy's first call); its /info content
    is plain JSON."""
    instance = single_item(2)
    decider = load_decider("dp-optimal", instance)
    states = [{"inventory": [-3], "in_transit": [[0, 0, 0]], "factor": 0.5}, {"inventory": [30], "in_transit": [[4, 0, 0]], "factor": -1}]
    batch = read_states(states, instance, "request body")
    fresh = copy.deepcopy(decider.policy)
    fresh.reset()
    open_order, quantity = fresh(batch, instance.to_torch())
    for answer in (decider.decide(batch), decider.decide(batch)):
        assert answer.open.tolist() == open_order.int().tolist() == [1, 0] and answer.probability.tolist() == [1.0, 0.0]
        np.testing.assert_array_equal(answer.order, quantity * open_order[:, None])
    assert json.loads(json.dumps(decider.info))["parameters"]["horizon"] == 50 and decider.info["checkpoint_sha256"] is None


def test_the_serve_config_file_is_one_serve_accepts_with_args_of_the_service():
    from ray.serve.schema import ServeDeploySchema

    from serving import app

    config = ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "platform" / "serve.yaml").read_text()))
    (application,) = config.applications
    module, _, name = application.import_path.partition(":")
    assert module == "serving.app" and getattr(app, name) is app.build_app
    assert app.ServiceConfig.from_dict(application.args) == app.ServiceConfig(
        policy="checkpoint:/mnt/shared/runs/ot16/checkpoint.pt", replicas=2, max_batch_size=32, batch_wait_ms=0.0, max_body_bytes=8 * 2**20
    )
    assert config.http_options.host == "127.0.0.1" and config.http_options.request_timeout_s == app.REQUEST_TIMEOUT_S


@pytest.mark.parametrize(
    "args, message",
    [
        ({"policy": "classical-best", "replica": 2}, r"service args: unknown keys \['replica'\]; allowed keys are"),
        ({"mode": "greedy"}, r"missing keys \['policy'\]"),
        (
            {"policy": "best"},
            r"field 'policy': expected one of .*'decomposition-lookahead'\], checkpoint:PATH, .*:DIR or user-rule:PATH, "
            r"got a string \"best\"",
        ),
        ({"policy": "zero", "replicas": 0}, r"field 'replicas': expected an integer >= 1, got 0"),
        ({"policy": "zero", "max_batch_size": 2.5}, r"field 'max_batch_size': expected an integer >= 1, got 2.5"),
        ({"policy": "zero", "batch_wait_ms": -1}, r"field 'batch_wait_ms': expected a number >= 0, got -1"),
        ({"policy": "zero", "mode": "greedy-ish"}, r"field 'mode': expected one of \['greedy', 'sampled'\]"),
    ],
)
def test_bad_service_args_are_refused_naming_the_field(args, message):
    from serving.app import ServiceConfig

    with pytest.raises(InputError, match=message):
        ServiceConfig.from_dict(args)


@pytest.mark.slow
def test_a_killed_replica_is_replaced(service, ray_session, tmp_path):
    port, checkpoint = service
    replica = call(port, "GET", "/info")[1]["replica"]
    ray_session.kill(ray_session.get_actor(replica, namespace="serve"))
    deadline, answer = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        try:
            status, answer = call(port, "POST", "/decide", json.dumps(STATES).encode(), timeout=10)
        except OSError:
            status = None
        if status == 200:
            break
        time.sleep(0.5)
    assert status == 200, answer
    assert_same_answers(answer, decide_py(checkpoint, STATES, tmp_path))
    assert call(port, "GET", "/info")[1]["replica"] != replica


def processes_holding(mark: bytes) -> list[int]:
    """This user's processes whose environment holds `mark` (a token given to one serve.py, which every process of
    its embedded Ray inherits)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == os.getuid() and mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


def command_name(pid: int) -> str:
    """The program name of process `pid` (its command line's first word, without the folder), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().rsplit("/", 1)[-1]
    except OSError:
        return ""


def assert_none_left(token: str) -> None:
    """No process holds serve.py's token any more; the failure names those that do, with the command of each."""
    left = processes_holding(f"RAY_AUTH_TOKEN={token}".encode())
    assert left == [], f"processes of serve.py's Ray left running: {[(pid, command_name(pid)) for pid in left]}"


def start_serve_py(checkpoint, log: Path, token: str, until) -> tuple[subprocess.Popen, int]:
    """serve.py on a port chosen now, its output in `log`, once `until(port)` holds; on another port when the chosen
    one was taken before serve.py bound it (its output names the port then)."""
    for _ in range(3):
        port = free_port()
        with open(log, "w") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "platform" / "serve.py"),
                    "--checkpoint",
                    str(checkpoint),
                    "--port",
                    str(port),
                    "--max-batch-size",
                    "1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**{k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}, "RAY_AUTH_TOKEN": token},
            )
        deadline = time.monotonic() + 180
        while not until(port) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is None or str(port) not in log.read_text():
            return process, port
    return process, port


@pytest.mark.slow
def test_serve_py_serves_until_ctrl_c(trained, tmp_path):
    """The script with its own embedded Ray (a subprocess: the test process has the session's): it prints the URL when
    ready, answers, and stops cleanly on SIGINT, leaving no process of its Ray and none of Ray's lines that a
    successful run need not show (the token notice, the Serve controller's graceful_shutdown failure)."""
    log, token = tmp_path / "serve.log", os.urandom(16).hex()
    process, port = start_serve_py(trained["hpo"].checkpoint, log, token, lambda port: f"http://127.0.0.1:{port}/decide" in log.read_text())
    try:
        assert process.poll() is None, log.read_text()[-3000:]
        status, info = call(port, "GET", "/info")
        assert status == 200 and info["method"] == "hpo" and info["settings"]["max_batch_size"] == 1
        status, answer = call(port, "POST", "/decide", json.dumps(STATES[1]).encode())
        assert status == 200 and answer["order"] == [answer["open"] * q for q in answer["quantity"]]
        assert processes_holding(f"RAY_AUTH_TOKEN={token}".encode())  # the check below can see the script's Ray
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
        output = log.read_text()
        assert "stopped" in output and "Traceback" not in output
        for line in ("Token authentication is enabled", "graceful_shutdown failed"):
            assert line not in output, output[-3000:]
        assert_none_left(token)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_ctrl_c_while_serve_py_starts_leaves_no_process_of_its_ray(trained, tmp_path):
    """Catches Ray's agents (ray::DashboardAgent, ray::RuntimeEnvAgent) left running, under PID 1 for a minute or more,
    after Ctrl-C while serve.py starts its Ray. The interrupt is sent once the script's raylet runs (ray.init then still
    waits for the node to register, for seconds on this machine), or later in the start-up at the latest."""
    log, token = tmp_path / "serve.log", os.urandom(16).hex()

    def raylet_runs(port: int) -> bool:
        return any(command_name(pid) == "raylet" for pid in processes_holding(f"RAY_AUTH_TOKEN={token}".encode()))

    process, _ = start_serve_py(trained["hpo"].checkpoint, log, token, raylet_runs)
    try:
        assert process.poll() is None, log.read_text()[-3000:]
        assert processes_holding(f"RAY_AUTH_TOKEN={token}".encode())
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        assert_none_left(token)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_requests_with_two_factor_states_are_parsed_merged_and_answered_as_alone():
    """An instance of k = 2 factors: a request's factor is a list of 2 numbers (a number is a 422 naming 'factor' and
    k), and requests whose [B, 2] factors share one rule call get the answers each gets alone (the rule conditions
    each item on its exposure, so the factors' rows must stay with their states)."""
    from serving.app import HTTPError, parse_states

    instance = Instance(
        h=[1.0, 2.0],
        b=[7.0, 9.0],
        lam=[3.0, 4.0],
        beta=None,
        lead=[1, 2],
        qbar=[30.0, 30.0],
        loadings=[[0.6, -0.2], [-0.3, 0.4]],
        overdispersion=[0.3, 0.1],
        K=20.0,
        gamma=0.95,
        rho=0.8,
    )
    state = {"inventory": [0, 0], "in_transit": [[0, 0, 0], [0, 0, 0]]}
    with pytest.raises(HTTPError, match=r"state 0 field 'factor': expected 2 numbers .*k = 2.*2 factors") as refused:
        parse_states(json.dumps({**state, "factor": 1.0}).encode(), "application/json", instance)
    assert refused.value.status == 422
    requests = [[{**state, "factor": [1.5, -1.0]}, {**state, "factor": [-2.0, 0.5]}], [{**state, "factor": [0.0, 2.0]}]]
    batches = [parse_states(json.dumps(r).encode(), "application/json", instance)[0] for r in requests]
    assert [b.factor.shape for b in batches] == [(2, 2), (1, 2)]
    rule = make_policy(
        instance.to_torch(), RULES["base-stock-factor"], {"reorder_z": 0.0, "cover": 1, "order_up_to_z": 1.0, "cycle_stock": 0.0}
    )
    decider = Decider(rule, instance, learned=False, mode="deterministic", label="policy 'base-stock-factor'", info={})
    together = decider.decide_many(batches)
    assert decider.forward_passes == 1
    for shared, batch in zip(together, batches):
        assert_same_answers(shared.records(), decider.decide(batch).records())
    quantities = [q for answer in together for q in answer.quantity.tolist()]
    assert len({tuple(q) for q in quantities}) == 3  # three factors, three order-up-to levels

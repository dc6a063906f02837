"""How a pathwise update runs, not what it computes: TF32 set for the update and restored after it, no host
synchronisation per micro-batch, torch.compile with the eager update's results, and the settings' refusals."""

import re
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from conftest import TINY

from envs.instance import paper_instance
from trainers import pathwise
from trainers.config import ConfigError
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import TrainConfig

RUN = {**TINY, "batch": 4, "rollout": 3}
CONVERSIONS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")
"""The Tensor methods that copy a value to the host (on a GPU: wait for every kernel queued before)."""


def tf32_flags() -> tuple:
    """The process's TF32 flags (torch >= 2.9 has fp32_precision too)."""
    matmul = torch.backends.cuda.matmul
    return matmul.allow_tf32, getattr(matmul, "fp32_precision", None), torch.get_float32_matmul_precision()


@pytest.fixture
def restored_tf32():
    """The process's TF32 flags as they were before the test, whatever the test leaves."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32, getattr(matmul, "fp32_precision", None)
    yield
    matmul.allow_tf32 = before[0]
    if before[1] is not None:
        matmul.fp32_precision = before[1]


def tf32_in_updates(monkeypatch, configs: list[dict]) -> list[bool]:
    """One update of a trainer of each config in turn: whether TF32 was on during each update's losses."""
    inside, losses = [], pathwise.hybrid_losses
    monkeypatch.setattr(pathwise, "hybrid_losses", lambda *args, **kwargs: inside.append(tf32_flags()[0]) or losses(*args, **kwargs))
    instance = paper_instance(2, 0).to_torch()
    for config in configs:
        PathwiseTrainer(TrainConfig(**RUN, **config), instance).step()
    return inside


def test_tf32_is_the_run_s_setting_during_its_updates_and_the_flags_are_restored_after(monkeypatch, restored_tf32):
    """A bfloat16 update uses TF32 by default, a float32 one does not, `tf32` overrides either, and after every update the
    process's flags are those before it, so a float32 run after a bfloat16 one in the same process gets no TF32. The
    control, a context manager that sets the flag without restoring it, leaves it on after the bfloat16 update."""
    before = tf32_flags()
    assert before[0] is False
    assert tf32_in_updates(monkeypatch, [{"precision": "bfloat16"}, {}]) == [True, False]
    assert tf32_flags() == before
    assert tf32_in_updates(monkeypatch, [{"precision": "bfloat16", "tf32": False}, {"tf32": True}]) == [False, True]
    assert tf32_flags() == before

    @contextmanager
    def set_without_restoring(on: bool):
        torch.backends.cuda.matmul.allow_tf32 = on
        yield

    monkeypatch.setattr(pathwise, "matmul_tf32", set_without_restoring)
    tf32_in_updates(monkeypatch, [{"precision": "bfloat16"}])
    assert tf32_flags() != before


def conversions_in_an_update(monkeypatch, micro_batch: int) -> Counter:
    """The host conversions (CONVERSIONS) of one update of 4 rollouts in micro-batches of `micro_batch`, but Adam's
    reads of its step counters (tensors on the CPU even when the parameters are on a GPU: no synchronisation)."""
    trainer = PathwiseTrainer(TrainConfig(**RUN, micro_batch=micro_batch), paper_instance(4, 0).to_torch())
    counts, counting = Counter(), [True]

    def counted(name: str):
        original = getattr(torch.Tensor, name)

        def conversion(tensor, *args, **kwargs):
            counts[name] += counting[0]
            return original(tensor, *args, **kwargs)

        return conversion

    for name in CONVERSIONS:
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    adam_step = trainer.optimizer.step

    def uncounted_adam_step(*args, **kwargs):
        counting[0] = False
        try:
            return adam_step(*args, **kwargs)
        finally:
            counting[0] = True

    monkeypatch.setattr(trainer.optimizer, "step", uncounted_adam_step)
    trainer.step()
    monkeypatch.undo()
    return +counts


def test_an_update_converts_to_the_host_once_whatever_its_micro_batches(monkeypatch):
    """The update's metrics (losses, gradient norms, restarts) reach the host in one conversion, in 1 or 4
    micro-batches: nothing per micro-batch (a Bernoulli validating its arguments tests them on the host) and no
    gradient norm converted apart."""
    for micro_batch in (4, 1):
        assert conversions_in_an_update(monkeypatch, micro_batch) == Counter(tolist=1), micro_batch


def timeless(metrics: dict) -> dict:
    """An update's metrics without its seconds and MFU."""
    return {key: value for key, value in metrics.items() if key not in ("update_seconds", "mfu")}


def two_updates(config: dict) -> tuple[torch.Tensor, list[dict]]:
    """The parameters and metrics after two updates at n = 4 in float64."""
    trainer = PathwiseTrainer(TrainConfig(**config), paper_instance(4, 0).to_torch(dtype=torch.float64))
    metrics = [timeless(trainer.step()) for _ in range(2)]
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()]), metrics


def compiled_graphs(monkeypatch, config: dict) -> tuple[list[int], torch.Tensor, list[dict]]:
    """Dynamo's graphs made by each of two compiled updates ("aot_eager": graphs and autograd as Inductor gets them,
    without its code generation) of 8 rollouts in micro-batches of at most 3 (3, 3 and 2), two blocks, at n = 4 in
    float64, from an empty compile cache; and the parameters and metrics after them."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(pathwise, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    trainer = PathwiseTrainer(TrainConfig(**config, compile=True), paper_instance(4, 0).to_torch(dtype=torch.float64))
    made, metrics = [], []
    for _ in range(2):
        before = counters["stats"]["unique_graphs"]
        metrics.append(timeless(trainer.step()))
        made.append(counters["stats"]["unique_graphs"] - before)
    torch._dynamo.reset()
    return made, torch.cat([p.detach().flatten() for p in trainer.model.parameters()]), metrics


def test_a_compiled_update_makes_the_documented_six_graphs_then_none_and_equals_the_eager_one(monkeypatch):
    """The blocks of the three encoders share one code object: the first update compiles 6 graphs (no grad / grad with
    trainable / grad with frozen parameters, each on all rows or h_0 alone: docs/methods.md), whatever the micro-batch
    sizes and t; the second compiles none; both leave the eager update's parameters and metrics. The control, the
    batch dimension left static, compiles more (each variant again when the shape changes)."""
    config = {**RUN, "batch": 8, "micro_batch": 3, "blocks": 2, "critic_warmup_updates": 0, "warmup": 1, "learning_rate": 1e-3}
    made, compiled, compiled_metrics = compiled_graphs(monkeypatch, config)
    assert made == [6, 0]
    eager, eager_metrics = two_updates(config)
    torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-12)
    for got, want in zip(compiled_metrics, eager_metrics):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    monkeypatch.setattr(torch._dynamo, "maybe_mark_dynamic", lambda tensor, dim: None)
    static, _, _ = compiled_graphs(monkeypatch, config)
    assert static[0] > 6 and static[1] == 0


def test_the_attention_kernel_is_the_config_s_and_leaves_the_update_as_it_was():
    """`attention: math` holds the update's attention to the math kernel, whose batched products FlopCounterMode counts
    (the CPU's fused kernel it does not count: the control, `auto`, counts fewer FLOPs), and two float64 updates
    leave the parameters and metrics of `auto`'s to float64 rounding; the memory plan measures the kernel's own
    activations (math keeps the S x S attention weights for its backward pass: more per state)."""
    from torch.utils.flop_counter import FlopCounterMode

    config = {**RUN, "warmup": 1, "learning_rate": 1e-3}
    counted = {}
    for kernel in ("math", "auto"):
        trainer = PathwiseTrainer(TrainConfig(**config, attention=kernel), paper_instance(4, 0).to_torch(dtype=torch.float64))
        with FlopCounterMode(display=False) as counter:
            trainer.step()
        counted[kernel] = counter.get_total_flops(), trainer.memory.state.quantity
    assert counted["math"][0] > counted["auto"][0] and counted["math"][1] > counted["auto"][1]
    (math, math_metrics), (auto, auto_metrics) = (two_updates({**config, "attention": kernel}) for kernel in ("math", "auto"))
    torch.testing.assert_close(math, auto, rtol=1e-9, atol=1e-12)
    for got, want in zip(math_metrics, auto_metrics):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.slow
def test_compiled_networks_give_the_eager_update():
    """With `compile` (CPU inductor, float64) two updates in micro-batches of 2 rollouts leave the parameters and
    metrics of the eager updates to float64 rounding, and the networks were compiled (dynamo captured graphs). About
    90 s on this project's machine, nearly all of it compiling."""
    from torch._dynamo.utils import counters

    config = {**RUN, "micro_batch": 2, "warmup": 1, "learning_rate": 1e-3}
    eager, eager_metrics = two_updates(config)
    graphs = counters["stats"]["unique_graphs"]
    compiled, compiled_metrics = two_updates({**config, "compile": True})
    assert counters["stats"]["unique_graphs"] > graphs
    torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-12)
    for got, want in zip(compiled_metrics, eager_metrics):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tf32", "yes", "config field 'tf32': expected true, false or null (null: true with precision bfloat16), got a string \"yes\""),
        ("compile", 1, "config field 'compile': expected true or false, got 1"),
        ("cuda_graphs", True, "config field 'cuda_graphs': CUDA graphs need device cuda or cuda:K, this run's device is 'cpu'"),
        (
            "attention",
            "fast",
            "config field 'attention': expected one of ['auto', 'flash', 'cudnn', 'efficient', 'math'], got a string \"fast\"",
        ),
        (
            "attention",
            "efficient",
            "config field 'attention': the efficient kernel needs device cuda or cuda:K, this run's device is 'cpu' "
            "(auto, flash or math there)",
        ),
    ],
)
def test_the_settings_refuse_what_they_cannot_take(field, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**{field: value})

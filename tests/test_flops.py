"""trainers/flops.py against torch.utils.flop_counter.FlopCounterMode on the CPU: each network's forward exactly, one
whole update within a few percent (the backward of attention and of the frozen critic is counted as the module
docstring approximates it), the paper's figures at n = 1,024, and MFU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from envs.instance import paper_instance
from trainers.flops import NetworkFlops, encoder_flops, mfu, peak_flops
from trainers.networks import ORTransformer, TransformerShape
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import NO_WARM_START
from trainers.registry import method_config

SMALL = TransformerShape(blocks=2, width=16, heads=4, feed_forward=32)


def counted(function) -> int:
    """FLOPs the counter sees in `function()`, attention on its math kernel (batched products the counter counts; the
    CPU's fused attention kernel is not among the operators it counts)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        function()
    return counter.get_total_flops()


@pytest.mark.parametrize("n", [1, 5, 12])
def test_each_network_s_forward_is_what_the_counter_counts(n):
    """Open, quantity and critic forwards on 3 states of n items: the formula times 3, exactly. The broken control, a
    global readout counted with all its rows in the last block (as the item readout), is off."""
    torch.manual_seed(0)
    model = ORTransformer(SMALL)
    items, glob = torch.randn(3, n, 11), torch.randn(3, 4)
    expected = NetworkFlops.of(SMALL, n)
    with torch.no_grad():
        assert counted(lambda: model.open_logit(items, glob)) == 3 * expected.open
        assert counted(lambda: model.quantity_fraction(items, glob)) == 3 * expected.quantity
        assert counted(lambda: model.value(items, glob)) == 3 * expected.critic
    assert counted(lambda: model.value(items, glob)) != 3 * encoder_flops(SMALL, n, n + 1, 1)


def test_one_update_is_what_the_counter_counts_within_five_percent():
    """One pathwise update (float32, B = 4, T = 3, n = 6, no warm start) under the counter: within 5% of the formula."""
    torch.manual_seed(0)
    config = method_config(
        "or-transformer", "cpu", {**NO_WARM_START, "batch": 4, "rollout": 3, "blocks": 2, "width": 16, "heads": 4, "feed_forward": 32}
    )
    trainer = PathwiseTrainer(config, paper_instance(6, 0).to_torch())
    flops = counted(trainer.step)
    expected = NetworkFlops.of(SMALL, 6).update(4, 3)
    assert abs(flops / expected - 1) <= 0.05, (flops, expected)


def test_the_paper_network_at_n_1024():
    """d = 128, 8 heads, f = 512, 4 blocks at n = 1,024: 3.77 GFLOP per state for the quantity network, 2.93 for the
    others, 332 TFLOP per update of 1,024 rollouts of 10 steps (hand-worked from the module docstring's terms)."""
    paper = NetworkFlops.of(TransformerShape(), 1024)
    assert paper.quantity == pytest.approx(3.767e9, rel=1e-3) and paper.open == paper.critic == pytest.approx(2.925e9, rel=1e-3)
    assert paper.update(1024, 10) == pytest.approx(332e12, rel=5e-3)


def test_mfu_is_the_achieved_rate_over_the_card_s_peak():
    assert peak_flops("NVIDIA H200", "bfloat16") == 989e12 and peak_flops("cpu", "bfloat16") is None
    assert mfu(332e12, 4.87, 989e12) == pytest.approx(0.0689, rel=1e-3) and mfu(1.0, 1.0, None) is None


def test_an_update_reports_its_seconds_and_its_mfu_against_the_card_s_peak(monkeypatch):
    """A trainer's update metrics carry its seconds and, on a card with a peak, FLOPs per update / seconds / peak with
    the update's own n, B, T and shape; on a CPU (no peak) no MFU, and an HPO update has none either. The CPU is given
    a peak of 1 GFLOP/s here; the broken control, the FLOPs of another n, is off."""
    from trainers import flops

    monkeypatch.setattr(flops, "peak_flops", lambda card, precision: 1e9 if card == "cpu" else None)
    fields = {**NO_WARM_START, "batch": 4, "rollout": 3, "blocks": 2, "width": 16, "heads": 4, "feed_forward": 32}
    metrics = PathwiseTrainer(method_config("or-transformer", "cpu", fields), paper_instance(6, 0).to_torch()).step()
    expected = NetworkFlops.of(SMALL, 6).update(4, 3) / metrics["update_seconds"] / 1e9
    assert metrics["update_seconds"] > 0 and metrics["mfu"] == pytest.approx(expected, rel=1e-12)
    assert metrics["mfu"] != pytest.approx(NetworkFlops.of(SMALL, 7).update(4, 3) / metrics["update_seconds"] / 1e9, rel=1e-3)
    hpo = method_config("hpo", "cpu", {**NO_WARM_START, "batch": 4, "rollout": 3, "hidden": 8})
    assert "mfu" not in PathwiseTrainer(hpo, paper_instance(6, 0).to_torch()).step()
    monkeypatch.undo()
    assert "mfu" not in PathwiseTrainer(method_config("or-transformer", "cpu", fields), paper_instance(6, 0).to_torch()).step()

"""The permutation property, eq. (permutation_property), with and without padded item slots."""

import pytest
import torch

from envs.dynamics import State
from envs.features import global_token, item_tokens
from envs.instance import Instance, paper_instance
from trainers.networks import HPOPerceptron, ORTransformer, TransformerShape

SMALL = TransformerShape(blocks=2, width=32, heads=4, feed_forward=64)


def random_state(n, batch=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return State(
        torch.randn(batch, n, generator=g, dtype=torch.float64) * 5,
        torch.rand(batch, n, 3, generator=g, dtype=torch.float64) * 4,
        torch.randn(batch, generator=g, dtype=torch.float64),
    )


def permuted(inst: Instance, perm):
    return Instance(
        **{k: getattr(inst, k)[perm.numpy()] for k in ("h", "b", "lam", "beta", "lead", "qbar")}, K=inst.K, gamma=inst.gamma, rho=inst.rho
    )


def test_permutation_property_on_random_states():
    torch.manual_seed(0)
    model = ORTransformer(SMALL).double()
    inst = paper_instance(7, 1)
    perm = torch.randperm(7)
    ti, tp = inst.to_torch(dtype=torch.float64), permuted(inst, perm).to_torch(dtype=torch.float64)
    s = random_state(7)
    sp = State(s.inv[:, perm], s.pipe[:, perm], s.factor)
    out = model(item_tokens(ti, s), global_token(ti, s))
    out_p = model(item_tokens(tp, sp), global_token(tp, sp))
    torch.testing.assert_close(out_p.open_logit, out.open_logit)  # p invariant
    torch.testing.assert_close(out_p.value, out.value)  # V invariant
    torch.testing.assert_close(out_p.quantity_fraction, out.quantity_fraction[:, perm])  # Q equivariant
    assert not torch.allclose(out.quantity_fraction[:, 0], out.quantity_fraction[:, 1])  # items are told apart


def test_padded_slots_change_nothing_for_real_items():
    torch.manual_seed(1)
    model = ORTransformer(SMALL).double()
    inst = paper_instance(5, 0)
    ti = inst.to_torch(dtype=torch.float64)
    s = random_state(5, batch=3)
    items, glob = item_tokens(ti, s), global_token(ti, s)
    padded = torch.cat([items, torch.randn(3, 4, 11, dtype=torch.float64) * 100], dim=1)  # 4 garbage slots
    mask = torch.cat([torch.ones(3, 5, dtype=torch.bool), torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    out, out_pad = model(items, glob), model(padded, glob, mask)
    torch.testing.assert_close(out_pad.open_logit, out.open_logit)
    torch.testing.assert_close(out_pad.value, out.value)
    torch.testing.assert_close(out_pad.quantity_fraction[:, :5], out.quantity_fraction)
    # and a permutation of the padded batch (padding slots interleaved) still only permutes
    perm = torch.randperm(9)
    out_perm = model(padded[:, perm], glob, mask[:, perm])
    torch.testing.assert_close(out_perm.open_logit, out.open_logit)
    torch.testing.assert_close(out_perm.quantity_fraction, out_pad.quantity_fraction[:, perm])


def test_three_networks_have_disjoint_parameters():
    for model in (ORTransformer(SMALL), HPOPerceptron(3, hidden=16)):
        groups = model.networks()
        ids = [{id(p) for p in params} for params in groups.values()]
        assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
        assert sum(len(i) for i in ids) == len(list(model.parameters()))


def test_no_attention_bias_and_paper_shape():
    model = ORTransformer()  # paper configuration
    attention = model.open_net.encoder.blocks[0].attention
    assert attention.qkv.bias is None and attention.qkv.weight.shape == (3 * 128, 128)
    assert len(model.open_net.encoder.blocks) == 4
    assert model.open_net.encoder.blocks[0].mlp[0].out_features == 512


def test_hpo_rejects_a_different_item_count():
    model = HPOPerceptron(3, hidden=8)
    with pytest.raises(ValueError, match="built for n = 3"):
        model(torch.zeros(2, 4, 11), torch.zeros(2, 4))


def test_the_per_item_setup_feature_is_the_papers_divided_by_the_real_items():
    """An OR-Transformer with setup_feature per-item gives, on n = 5 items, the outputs of the same weights under the
    paper's feature with K / (c_scale sigma_ref) divided by 5 written into the global token; in a padded batch (9 slots,
    rows with 5 and 3 real items) each row's outputs are those of its real items alone. The control, the padded slot
    count (9) as n, changes the open logit."""
    torch.manual_seed(2)
    per_item = ORTransformer(SMALL, setup_feature="per-item").double()
    paper = ORTransformer(SMALL).double()
    paper.load_state_dict(per_item.state_dict())
    ti = paper_instance(5, 0).to_torch(dtype=torch.float64)
    s = random_state(5, batch=3)
    items, glob = item_tokens(ti, s), global_token(ti, s)
    divided = torch.cat([glob[:, :1] / 5, glob[:, 1:]], dim=-1)
    for got, want in zip(per_item(items, glob), paper(items, divided)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(per_item(items, glob).open_logit, paper(items, glob).open_logit)
    padded = torch.cat([items, torch.randn(3, 4, 11, dtype=torch.float64) * 100], dim=1)
    mask = torch.cat([torch.ones(3, 5, dtype=torch.bool), torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    mask[2, 3:5] = False  # the last row has 3 real items
    out = per_item(padded, glob, mask)
    torch.testing.assert_close(out.open_logit[:2], per_item(items[:2], glob[:2]).open_logit)
    torch.testing.assert_close(out.open_logit[2:], per_item(items[2:, :3], glob[2:]).open_logit)
    torch.testing.assert_close(out.quantity_fraction[2:, :3], per_item(items[2:, :3], glob[2:]).quantity_fraction)
    nine = torch.cat([glob[:, :1] / 9, glob[:, 1:]], dim=-1)
    assert not torch.allclose(paper(padded, nine, mask).open_logit[:2], out.open_logit[:2])

"""Section 3 of the paper, checked piece by piece on the pure-PyTorch model."""
import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from lightning_tfm.model import PAD, ModelConfig, Transformer, sinusoid_table
from lightning_tfm.model.attention import reference_attention, scaled_dot_product_attention

V = 50

COMBOS = list(itertools.product(["sinusoidal", "learned"], ["post", "pre"], [(1, 16, 16), (4, 8, 8), (3, 4, 12)]))


def make(positional="sinusoidal", norm="post", heads=2, d_k=8, d_v=8, d_model=16, layers=2):
    torch.manual_seed(0)
    return Transformer(ModelConfig(layers=layers, d_model=d_model, d_ff=32, heads=heads, d_k=d_k, d_v=d_v, dropout=0.1,
                                   positional=positional, norm=norm, max_positions=64), V).eval()


def batch(b=3, s=7, t=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, V, (b, s), generator=g), torch.randint(4, V, (b, t), generator=g)


@pytest.mark.parametrize("positional,norm,hdd", COMBOS)
def test_shapes_and_causality(positional, norm, hdd):
    heads, d_k, d_v = hdd  # heads * d_k need not equal d_model (Table 3 rows A and B)
    m = make(positional, norm, heads, d_k, d_v)
    src, tgt = batch()
    out = m(src, tgt)
    assert out.shape == (3, 5, V)
    # A later target token cannot change an earlier decoder position's output (Sec. 3.2.3).
    tgt2 = tgt.clone()
    tgt2[:, 3:] = (tgt2[:, 3:] + 7) % (V - 4) + 4
    out2 = m(src, tgt2)
    torch.testing.assert_close(out[:, :3], out2[:, :3], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[:, 3:], out2[:, 3:])
    attn = m.encoder[0].self_attn
    assert attn.in_proj.weight.shape == (heads * (2 * d_k + d_v), 16)
    assert attn.out_proj.weight.shape == (16, heads * d_v)  # W^O maps heads*d_v back to d_model


@pytest.mark.parametrize("positional,norm", [("sinusoidal", "post"), ("learned", "pre")])
def test_padding_never_changes_non_pad_outputs(positional, norm):
    m = make(positional, norm)
    src, tgt = batch(b=1)
    padded_src = torch.cat([src, torch.full((1, 4), PAD)], 1)
    padded_tgt = torch.cat([tgt, torch.full((1, 3), PAD)], 1)
    out = m(src, tgt)
    out_padded = m(padded_src, padded_tgt)
    torch.testing.assert_close(out_padded[:, : tgt.shape[1]], out, rtol=1e-5, atol=1e-5)
    # and batching a short sentence with a long one (right padding) gives the same result as alone
    long_src, long_tgt = batch(b=1, s=11, t=9, seed=5)
    both = m(torch.cat([padded_src, long_src]), torch.cat([torch.cat([tgt, torch.full((1, 4), PAD)], 1), long_tgt]))
    torch.testing.assert_close(both[:1, : tgt.shape[1]], out, rtol=1e-5, atol=1e-5)


def test_sinusoids_equal_the_papers_formula():
    d_model = 16
    pe = sinusoid_table(50, d_model)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_learned_positions_are_parameters_and_sinusoids_are_not():
    learned, fixed = make("learned"), make("sinusoidal")
    assert any("positions" in n for n, _ in learned.named_parameters())
    assert not any("positions" in n for n, _ in fixed.named_parameters())
    assert learned.num_parameters() - fixed.num_parameters() == 64 * 16


def test_embeddings_and_pre_softmax_share_one_matrix():
    m = make()
    src, tgt = batch()
    logits = m(src, tgt)
    logits.sum().backward()
    shared = [p for n, p in m.named_parameters() if p is m.embed.weight]
    assert len(shared) == 1 and m.embed.weight.grad is not None
    # the pre-softmax projection is the embedding matrix: perturbing one row changes that logit column only
    with torch.no_grad():
        before = m(src, tgt)
        m.embed.weight[10] += 1.0
        after = m(src, tgt)
    diff = (after - before).abs().amax(dim=(0, 1))
    assert diff[10] > 0
    # the embedding of token 10 is scaled by sqrt(d_model) and shared by encoder and decoder inputs
    x = m.embed_tokens(torch.tensor([[10]]))
    torch.testing.assert_close(x[0, 0], m.embed.weight[10] * math.sqrt(16) + m.positions(1)[0])


@pytest.mark.parametrize("norm,positional", [("post", "sinusoidal"), ("pre", "learned")])
def test_parameter_count_equals_the_analytic_count(norm, positional):
    cfg = dict(layers=6, d_model=512, d_ff=2048, heads=8, d_k=64, d_v=64, positional=positional, norm=norm,
               max_positions=1024)
    m = Transformer(ModelConfig(dropout=0.1, **cfg), 37000)
    assert m.num_parameters() == Transformer.count_parameters(ModelConfig(**cfg), 37000)
    # the paper's base model at a ~41k shared vocabulary: 65M (Table 3)
    base = ModelConfig(**{**cfg, "norm": "post", "positional": "sinusoidal"})
    assert abs(Transformer.count_parameters(base, 41000) / 1e6 - 65) < 65 * 0.015


def test_flops_per_token_equal_torchs_count_of_the_model():
    """The training FLOPs (forward + backward) and the cached-decoding FLOPs the model states for itself are
    those torch's FlopCounterMode counts on the model (matmul kernel: every product is a counted matmul)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    cfg = ModelConfig(layers=2, d_model=16, d_ff=40, heads=3, d_k=4, d_v=6, dropout=0.0, attention_kernel="matmul")
    m, (B, S, T) = Transformer(cfg, V), (3, 6, 6)
    src, tgt = batch(b=B, s=S, t=T)
    with FlopCounterMode(display=False) as fc:
        m(src, tgt).sum().backward()
    assert fc.get_total_flops() == Transformer.train_flops_per_token(cfg, V, S, T) * B * T
    S = 9  # decoding: the encoder and the projected memory once, then one position per step against the cache
    src, tgt = batch(b=B, s=S, t=T)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        enc = m.encode(src)
        state = m.init_state(enc)
        for i in range(T):
            m.project(m.decode_step(tgt[:, i:i + 1], enc, state))
    assert fc.get_total_flops() == pytest.approx(Transformer.decode_flops_per_token(cfg, V, S, T) * B * T, rel=1e-12)


def test_rows_a_and_b_change_the_attention_size():
    b1 = Transformer.count_parameters(ModelConfig(layers=6, d_model=512, d_ff=2048, heads=8, d_k=16, d_v=64), 41000)
    assert abs(b1 / 1e6 - 58) < 58 * 0.015  # Table 3 row B1: d_k = 16 -> 58M


def test_fused_and_unfused_projections_agree():
    m = make(heads=3, d_k=4, d_v=12)
    src, tgt = batch()
    fused = m(src, tgt)
    m.set_fused(False)
    torch.testing.assert_close(m(src, tgt), fused, rtol=1e-5, atol=1e-5)


def test_cached_decoding_equals_full_decoding():
    for norm in ("post", "pre"):
        m = make(norm=norm, positional="learned", heads=3, d_k=4, d_v=12)
        src, tgt = batch()
        memory, mask = m.encode(src)
        cache = m.new_cache()
        steps = [m.decode(tgt[:, t:t + 1], memory, mask, cache, offset=t) for t in range(tgt.shape[1])]
        torch.testing.assert_close(torch.cat(steps, 1), m(src, tgt), rtol=1e-5, atol=1e-5)


def test_fused_sdpa_equals_equation_1():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 7)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask, False), reference_attention(q, k, v, mask))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    qs = torch.randn(2, 3, 6, 4)
    torch.testing.assert_close(scaled_dot_product_attention(qs, k, v, None, True),
                               reference_attention(qs, k, v, causal), rtol=1e-5, atol=1e-5)
    # bf16 inputs on CPU (attention core computed in fp32) stay close to the fp32 result
    out = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, False)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference_attention(q, k, v, mask), rtol=0.05, atol=0.05)


def test_dropout_is_active_in_training_only():
    m = make()
    src, tgt = batch()
    m.train()
    torch.manual_seed(1)
    a = m(src, tgt)
    torch.manual_seed(2)
    b = m(src, tgt)
    assert not torch.allclose(a, b)
    m.eval()
    torch.testing.assert_close(m(src, tgt), m(src, tgt))


@pytest.mark.parametrize("activation,phi", [("relu", lambda h: torch.clamp(h, min=0)),
                                            ("gelu", lambda h: h * 0.5 * (1 + torch.erf(h / math.sqrt(2))))])
def test_feed_forward_applies_model_activation(activation, phi):
    """Eq. 2's max(0, .) (the paper), or GELU x Phi(x) written out (BERT's, GPT's)."""
    from lightning_tfm.model.layers import FeedForward

    torch.manual_seed(0)
    ffn = FeedForward(ModelConfig(d_model=8, d_ff=16, activation=activation))
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ffn(x), ffn.w_2(phi(ffn.w_1(x))))
    models = []
    for act in ("relu", "gelu"):  # the same weights (the same seed): the nonlinearity alone differs
        torch.manual_seed(0)
        models.append(Transformer(ModelConfig(layers=2, d_model=16, d_ff=32, heads=2, d_k=8, d_v=8, activation=act),
                                  V).eval())
    assert all(torch.equal(a, b) for a, b in zip(*(m.state_dict().values() for m in models)))
    assert not torch.allclose(models[0](*batch()), models[1](*batch()))


def test_model_activation_is_one_field_that_the_report_the_dashboard_and_the_search_see(tmp_path):
    """model.activation is declared once (its field, with its Table 3 column): a config key with its choices, a
    column of the report's configuration table and CSV, a word of the lead figure's row names, an Optuna param of
    the sweep dashboard, a key sweeps/search.yaml samples; absent from the paper's CSV, the paper's rows have none."""
    from lightning_tfm.base.errors import UserError
    from lightning_tfm.report.table3 import columns
    from lightning_tfm.report.table3.paper import load_paper
    from lightning_tfm.report.views.lead import row_label
    from lightning_tfm.sweep import load_sweep
    from lightning_tfm.sweep.queue import DASHBOARD_CHOICES
    from lightning_tfm.training.config import config

    from conftest import ROOT, SMOKE

    assert config.load_config(SMOKE, ["data.path=/x", "model.activation=gelu"]).model.activation == "gelu"
    assert config.Config().model.activation == "relu"  # the paper's
    with pytest.raises(UserError, match=r"model.activation='swish' is not one of: relu \| gelu"):
        config.load_config(SMOKE, ["data.path=/x", "model.activation=swish"])
    assert "model.activation" in [k.key for k in config.TABLE3_KNOBS]
    assert "activation" in [c.key for c in columns.columns(columns.CSV)]
    assert "activation" in [c.shown[columns.CONFIG].title for c in columns.columns(columns.CONFIG)]
    assert row_label(SimpleNamespace(variant="bert", knobs={"model.activation": "gelu"}),
                     SimpleNamespace(variant="base", knobs={"model.activation": "relu"})) == "bert: gelu FFN"
    assert DASHBOARD_CHOICES["model.activation"] == ("relu", "gelu")
    assert load_sweep(ROOT / "sweeps" / "search.yaml").space["model.activation"]["choices"] == ["relu", "gelu"]
    assert "activation" not in load_paper()["base"]

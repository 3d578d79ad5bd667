"""Every speed path gives the results of the plain path it replaces, within tolerance.

Fused vs unfused Q/K/V projections, the matmul attention kernel vs torch's SDPA (many queries and the
single query of cached decoding, fp32 and bf16, forward and backward), cached vs uncached decoding,
reused key/value buffers vs concatenation, encoder memory shared by a sentence's beams vs repeated per
beam, the fast dropout mask vs torch's, autocast's cached weights (no_grad) vs inference mode, and
``min_len``. Each is switched by an argument (model/fast.py, decode.py). Small models, one thread, no timing.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from lightning_tfm.model import EOS, PAD, MemoryCache, ModelConfig, Transformer, build_model, fast
from lightning_tfm.model.attention import reference_attention, scaled_dot_product_attention, sdpa_attention
from lightning_tfm.model.fast import matmul_attention
from lightning_tfm.training.decode import beam_search, translate_ids

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

V = 40


def make(norm="post", positional="sinusoidal", dropout=0.0, heads=3, d_k=4, d_v=6, seed=0, scale=1.0,
         kernel="auto", fast_dropout=True, layers=2):
    torch.manual_seed(seed)
    m = Transformer(ModelConfig(layers=layers, d_model=16, d_ff=32, heads=heads, d_k=d_k, d_v=d_v, dropout=dropout,
                                positional=positional, norm=norm, max_positions=64, attention_kernel=kernel,
                                fast_dropout=fast_dropout), V)
    with torch.no_grad():  # scale > 1: larger weights than the init, peaked distributions, distinct beams
        for p in m.parameters():
            p.mul_(scale)
    return m.eval()


def padded_src(b=5, seed=1, lo=2, hi=9):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (b,), generator=g).tolist()
    src = torch.full((b, max(lens)), PAD, dtype=torch.long)
    for i, n in enumerate(lens):
        src[i, :n - 1] = torch.randint(4, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src


def qkv(b, t, s, dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(b, 3, n, d, generator=g).to(dtype) for n, d in ((t, 8), (s, 8), (s, 5))]
    return [x.requires_grad_(requires_grad) for x in out]


def key_mask(b, s):
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[0, ..., s - 3:] = False
    mask[-1, ..., 2:] = False
    return mask


@pytest.mark.parametrize("t,s,causal", [(7, 7, False), (7, 7, True), (1, 9, False), (1, 9, True), (3, 9, True)])
def test_matmul_kernel_equals_sdpa_and_equation_1(t, s, causal):
    q, k, v = qkv(4, t, s)
    mask = key_mask(4, s)
    full = mask & torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t) if causal else mask
    ref = reference_attention(q, k, v, full)
    mm = scaled_dot_product_attention(q, k, v, mask, causal, kernel="matmul")
    sd = scaled_dot_product_attention(q, k, v, mask, causal, kernel="sdpa")
    torch.testing.assert_close(mm, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mm, sd, rtol=1e-5, atol=1e-5)
    # bf16 inputs: both kernels stay within bf16 rounding of the fp32 result
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    for name in ("matmul", "sdpa"):
        out = scaled_dot_product_attention(qb, kb, vb, mask, causal, kernel=name)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref, rtol=0.03, atol=0.03)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 0.05)])
def test_matmul_kernel_gradients_equal_sdpa(dtype, tol):
    grads = {}
    for name in ("matmul", "sdpa"):
        q, k, v = qkv(3, 6, 6, dtype, requires_grad=True)
        out = scaled_dot_product_attention(q, k, v, key_mask(3, 6), True, kernel=name)
        out.float().pow(2).sum().backward()
        grads[name] = [x.grad.float() for x in (q, k, v)]
    for a, b in zip(grads["matmul"], grads["sdpa"]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("scale", [1.0, 0.125, 0.3])
def test_scaled_softmax_equals_torchs_softmax_with_gradients(scale):
    """fast.ScaledSoftmax (the matmul kernel's softmax, whole-tensor operations) against torch's softmax of the scaled
    input: values and gradients in fp32, masked keys 0, a fully masked row NaN as torch gives."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 3, 5, 7, generator=g) * 4).requires_grad_()
    mask = torch.ones(6, 3, 5, 7, dtype=torch.bool)
    mask[0, :, :, 4:] = False
    mask[1, 0, 2, :] = False  # a fully masked row
    grad = torch.randn(6, 3, 5, 7, generator=g)
    ours = fast.ScaledSoftmax.apply(x.masked_fill(~mask, float("-inf")), scale)
    theirs = torch.softmax(x.masked_fill(~mask, float("-inf")) * scale, -1)
    assert torch.isnan(ours[1, 0, 2]).all() and torch.isnan(theirs[1, 0, 2]).all()
    keep = ~torch.isnan(theirs)
    torch.testing.assert_close(ours[keep], theirs[keep], rtol=1e-6, atol=1e-7)
    assert (ours[0, :, :, 4:] == 0).all()
    rows = ~mask[1, 0, 2]  # a NaN row's gradient is NaN in both: the others compared
    (ga,) = torch.autograd.grad(ours, x, grad.masked_fill(~keep, 0))
    (gb,) = torch.autograd.grad(theirs, x, grad.masked_fill(~keep, 0))
    assert rows.all()
    ok = ~torch.isnan(gb)
    torch.testing.assert_close(ga[ok], gb[ok], rtol=1e-5, atol=1e-6)


def test_matmul_kernel_applies_attention_dropout():
    q, k, v = qkv(2, 5, 5)
    torch.manual_seed(0)
    dropped = matmul_attention(q, k, v, None, dropout=0.5)
    assert not torch.allclose(dropped, matmul_attention(q, k, v, None))


def test_auto_kernel_choice():
    q, k, v = qkv(2, 4, 4)
    # on CPU with few keys, "auto" (the default) is the matmul kernel (bitwise)
    assert torch.equal(scaled_dot_product_attention(q, k, v, None, False), matmul_attention(q, k, v, None))
    ql, kl, vl = qkv(1, 2, fast.MATMUL_MAX_KEYS + 1)  # beyond MATMUL_MAX_KEYS keys: torch's SDPA
    assert torch.equal(scaled_dot_product_attention(ql, kl, vl, None, False, kernel="auto"),
                       sdpa_attention(ql, kl, vl, None))


def test_kernel_is_chosen_by_the_constructor_and_the_config():
    from lightning_tfm.base.errors import UserError
    from lightning_tfm.training.config.config import load_config
    from lightning_tfm.training.config.run_id import config_hash

    for name in fast.ATTENTION_KERNELS:
        m = make(kernel=name)
        assert {a.kernel for a in m.modules() if hasattr(a, "kernel")} == {name}
    with pytest.raises(ValueError, match="attention kernel"):
        make(kernel="flash")
    base = load_config(None, ["data.path=x"])
    plain = load_config(None, ["data.path=x", "model.attention_kernel=sdpa", "model.fast_dropout=false"])
    m = build_model(plain.model, V)
    assert m.encoder[0].self_attn.kernel == m.decoder[-1].cross_attn.kernel == "sdpa"
    assert isinstance(m.dropout, torch.nn.Dropout) and isinstance(m.decoder[0].sub_ffn.dropout, torch.nn.Dropout)
    assert isinstance(build_model(base.model, V).dropout, fast.FastDropout)
    assert config_hash(plain) == config_hash(base)  # speed paths do not change what is trained: same run
    with pytest.raises(UserError, match="attention_kernel"):
        load_config(None, ["data.path=x", "model.attention_kernel=flash"])


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_whole_model_matmul_kernel_equals_sdpa_training(dtype):
    """Logits, loss gradients of every parameter, in fp32 and under bf16 autocast, with dropout."""
    src = padded_src()
    tgt = padded_src(seed=3)
    results = {}
    for name in ("matmul", "sdpa"):
        m = make(dropout=0.1, kernel=name).train()
        ctx = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
        torch.manual_seed(7)  # same dropout masks: the kernels draw no random numbers without attention dropout
        with ctx:
            logits = m(src, tgt)
        logits.float().logsumexp(-1).sum().backward()
        results[name] = (logits.float(), {n: p.grad.clone() for n, p in m.named_parameters()})
    (la, ga), (lb, gb) = results["matmul"], results["sdpa"]
    tol = 1e-4 if dtype is None else 0.1
    torch.testing.assert_close(la.detach(), lb.detach(), rtol=tol, atol=tol)
    for n in ga:
        scale = max(1.0, float(gb[n].abs().max()))
        torch.testing.assert_close(ga[n], gb[n], rtol=tol, atol=tol * scale, msg=n)


def test_fused_and_unfused_projections_agree_with_gradients_and_cache():
    src, tgt = padded_src(), padded_src(seed=3)
    out = {}
    for fused in (True, False):
        m = make()
        m.set_fused(fused)
        logits = m(src, tgt)
        logits.sum().backward()
        memory, mask = m.encode(src)
        cache = m.new_cache()
        with torch.no_grad():
            steps = torch.cat([m.decode(tgt[:, i:i + 1], memory, mask, cache, offset=i)
                               for i in range(tgt.shape[1])], 1)
        out[fused] = (logits, m.embed.weight.grad, m.encoder[0].self_attn.in_proj.weight.grad, steps)
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["matmul", "sdpa"])
def test_cached_decoding_equals_full_decoding_with_each_kernel(name):
    """The single-query path of cached decoding (one new position against all cached keys)."""
    m = make(norm="pre", positional="learned", kernel=name)
    src, tgt = padded_src(), padded_src(seed=4)
    with torch.no_grad():
        memory, mask = m.encode(src)
        cache = m.new_cache()
        steps = torch.cat([m.decode(tgt[:, i:i + 1], memory, mask, cache, offset=i) for i in range(tgt.shape[1])], 1)
        full = m.decode(tgt, memory, mask)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)


def test_memory_shared_by_beams_equals_memory_repeated_per_beam():
    """decode() with one memory row per sentence and K target rows each (beam search's layout, served by
    MemoryCache), whole prefixes and incrementally, against the memory repeated per row; and the same through
    the incremental-decoder protocol (decode_step with and without a state)."""
    m = make()
    K = 3
    src = padded_src(b=4)
    g = torch.Generator().manual_seed(5)
    tgt = torch.randint(4, V, (4 * K, 6), generator=g)
    with torch.no_grad():
        memory, mask = m.encode(src)
        rep_mem, rep_mask = memory.repeat_interleave(K, 0), mask.repeat_interleave(K, 0)
        shared = m.decode(tgt, memory, mask, m.new_cache(None, MemoryCache))
        repeated = m.decode(tgt, rep_mem, rep_mask)
        torch.testing.assert_close(shared, repeated, rtol=1e-5, atol=1e-5)
        c1, c2 = m.new_cache(fast.BufferedKVCache), m.new_cache(fast.BufferedKVCache)
        for i in range(tgt.shape[1]):
            a = m.decode(tgt[:, i:i + 1], memory, mask, c1, offset=i)
            b = m.decode(tgt[:, i:i + 1], rep_mem, rep_mask, c2, offset=i)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert c1[0]["cross"].k.shape[0] == 4 and c2[0]["cross"].k.shape[0] == 4 * K
        with pytest.raises(ValueError, match="whole multiple"):
            m.decode(tgt[:5], memory, mask, m.new_cache(None, MemoryCache))
        # the protocol: the encoder output once per sentence, or repeated (reorder_encoder_out); state or none
        enc = m.encode(src)
        rep = m.reorder_encoder_out(enc, torch.arange(4).repeat_interleave(K))
        s1, s2 = m.init_state(enc), m.init_state(rep)
        for i in range(tgt.shape[1]):
            a = m.decode_step(tgt[:, i:i + 1], enc, s1)
            b = m.decode_step(tgt[:, i:i + 1], rep, s2)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(m.decode_step(tgt[:, :i + 1], enc, None), a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.project(a), repeated[:, -1], rtol=1e-5, atol=1e-5)


def hyps_equal(a, b, tol=1e-4):
    assert [h.tokens for h in a] == [h.tokens for h in b]
    for x, y in zip(a, b):
        assert x.score == pytest.approx(y.score, abs=tol)
        assert x.log_prob == pytest.approx(y.log_prob, abs=tol)


@pytest.mark.parametrize("beam", [1, 4])
def test_beam_search_speed_paths_equal_the_plain_paths(beam):
    """Shared memory + matmul kernel + cache against repeated memory + SDPA + recomputed prefix; sentences
    end at different steps, so the batch reduction (dropping finished sentences) is exercised too."""
    m = make(seed=2, scale=2.0)
    src = padded_src(b=9, seed=6)
    quick = beam_search(m, src, beam, 0.6, 1.0, 3)
    m_sdpa = make(seed=2, scale=2.0, kernel="sdpa")  # the same weights
    plain = beam_search(m_sdpa, src, beam, 0.6, 1.0, 3, use_cache=False, shared_memory=False)
    cached_repeated = beam_search(m_sdpa, src, beam, 0.6, 1.0, 3, shared_memory=False)
    hyps_equal(quick, plain)
    hyps_equal(quick, cached_repeated)
    assert len({len(h.tokens) for h in quick}) > 1


def test_bf16_decoding_with_cached_weight_casts_equals_inference_mode():
    """beam_search runs under no_grad so that autocast casts each weight to bf16 once; under
    inference_mode it recasts at every step. Same bf16 weights, so the same results."""
    m = make(seed=3, scale=2.0)
    src = padded_src(b=6, seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cached_casts = beam_search(m, src, 4, 0.6, 1.0, 4)
        with torch.inference_mode():
            recast = beam_search(m, src, 4, 0.6, 1.0, 4)
    hyps_equal(cached_casts, recast, tol=1e-4)


def test_min_len_holds_every_output_to_a_length():
    m = make(seed=4, scale=2.0)
    with torch.no_grad():  # make EOS likely, so that without min_len some outputs end early
        m.embed.weight[EOS] *= 3.0
    ids = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [4]]
    n = 6
    out = translate_ids(m, ids, beam_size=4, max_len_a=0.0, max_len_b=n, min_len=n, dtype=None)
    assert all(len(h.tokens) == n and EOS not in h.tokens for h in out)
    free = translate_ids(m, ids, beam_size=4, max_len_a=0.0, max_len_b=n, dtype=None)
    assert any(len(h.tokens) < n for h in free)  # without min_len this model stops early somewhere
    hyps_equal(free, translate_ids(m, ids, beam_size=4, max_len_a=0.0, max_len_b=n, min_len=0, dtype=None))
    # the maximum length wins over min_len, and the hypothesis is still scored (EOS forced, finite)
    capped = translate_ids(m, ids, beam_size=4, max_len_a=0.0, max_len_b=3, min_len=n, dtype=None)
    assert all(len(h.tokens) == 3 and h.score > float("-inf") for h in capped)


@pytest.mark.marian
def test_bench_marian_matches_our_architecture():
    """``ltfm bench --vs marian`` compares like with like: same trainable parameter count (post-norm,
    shared embeddings, static sinusoids, no extra norms), ReLU, sqrt(d_model) embedding scale."""
    from lightning_tfm.bench import speed as bench

    s = {**bench.DEFAULTS, "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4, "vocab": 100}
    ours, marian = bench.build_ours(s), bench.build_marian(s)
    trainable = sum(p.numel() for p in marian.parameters() if p.requires_grad)
    assert trainable == ours.num_parameters()
    cfg = marian.config
    assert cfg.activation_function == "relu" and cfg.scale_embedding and cfg.share_encoder_decoder_embeddings
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for stack in (marian.model.encoder, marian.model.decoder):  # fixed sinusoids, not trained
        assert isinstance(stack.embed_positions, MarianSinusoidalPositionalEmbedding)
        assert not stack.embed_positions.weight.requires_grad
    assert marian.get_output_embeddings().weight is marian.model.shared.weight
    assert not any("layernorm_embedding" in n or n.endswith("encoder.layer_norm.weight")
                   for n, _ in marian.named_parameters())


@pytest.mark.marian
def test_bench_runs_both_models_to_the_same_output_length():
    from lightning_tfm.bench import speed as bench
    from lightning_tfm.training.precision import cpu_has_fast_bf16

    s = dict(layers=1, d_model=32, d_ff=64, heads=2, vocab=60, batch=4, src_len=5, tgt_len=5, out_len=4,
             reps=1, train_steps=1, decode_batches=1)
    r = bench.run_bench(s, vs="marian", log=lambda *a: None)  # make_decode asserts the lengths
    # bf16 is measured only where the CPU has it natively (76x slower than fp32 without: precision.py)
    assert r["dtypes"] == (["fp32", "bf16"] if cpu_has_fast_bf16() else ["fp32"])
    for kind in ("ours", "marian"):
        for dt in r["dtypes"]:
            v = r[kind][dt]
            assert {"train_tokens_per_s", "decode_sentences_per_s", "peak_memory_mb", "mfu"} <= set(v)
            assert v["train_tokens_per_s"] > 0 and v["decode_sentences_per_s"] > 0 and 0 < v["mfu"] < 1
    assert set(r["speedup"]) == set(r["dtypes"])


def test_bench_vs_marian_without_transformers_is_one_line_naming_how_to_install_it(ltfm_here, monkeypatch):
    """transformers is the bench extra's alone (the test environment leaves it out): without it ``--vs marian``
    stops before anything is built or measured, naming the extra and ``make bench``."""
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as where it is not installed: import fails
    p = ltfm_here("bench", "--vs", "marian", "--json", "bench.layers=1", "bench.d_model=8", "bench.d_ff=8",
                  "bench.heads=1", "bench.vocab=16", "bench.batch=1", "bench.reps=1")
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "transformers" in p.stderr and "pip install -e '.[bench]'" in p.stderr and "make bench" in p.stderr


# ----------------------------------------------------------------------------------- training speed paths
def test_fast_dropout_mask_rate_lanes_and_formula():
    from lightning_tfm.model.fast import LANES, keep_mask, rounded_p
    from lightning_tfm.model.fast import fast_dropout as dropout

    assert rounded_p(0.1) == 6554 / LANES and rounded_p(0.0) == 0.0
    torch.manual_seed(0)
    for p in (0.1, 0.3):
        mask = keep_mask((1000, 1001), p)  # not a multiple of 4: the last 64-bit word is cut
        assert mask.dtype == torch.bool and mask.shape == (1000, 1001)
        keep = 1 - rounded_p(p)
        sigma = (keep * (1 - keep) / mask.numel()) ** 0.5
        assert abs(mask.float().mean().item() - keep) < 5 * sigma
        # each of the four 16-bit lanes of a random word is unbiased (a sign bit left out would show here)
        lanes = mask.flatten()[: 4 * (mask.numel() // 4)].view(-1, 4).float().mean(0)
        assert (lanes - keep).abs().max().item() < 5 * sigma * 2
    x = torch.randn(6, 7, requires_grad=True)
    mask = keep_mask(x.shape, 0.3)
    y = dropout(x, 0.3, mask=mask)
    scale = 1 / (1 - rounded_p(0.3))
    torch.testing.assert_close(y, x.detach() * mask * scale)
    # torch's own inverted dropout with the same mask: equal up to p's rounding (relative 1e-4)
    torch.testing.assert_close(y, x.detach() * mask / (1 - 0.3), rtol=1e-4, atol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, mask.float() * scale)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_mask_in_the_inputs_dtype_is_the_bool_mask_bit_for_bit(dtype):
    """The mask drawn as 1 and 0 in x's dtype (keep_mask_as, what training uses) is keep_mask's from the same random
    state, and dropout through it gives the output and gradient of the bool mask exactly: a product by 1 or 0 is
    exact, so runs keep their numbers."""
    from lightning_tfm.model.fast import fast_dropout as dropout
    from lightning_tfm.model.fast import keep_mask, keep_mask_as

    torch.manual_seed(5)
    as_bool = keep_mask((13, 7, 9), 0.1)  # 819 elements: not a multiple of 4
    torch.manual_seed(5)
    as_dtype = keep_mask_as((13, 7, 9), 0.1, dtype)
    assert as_dtype.dtype == dtype and as_dtype.shape == (13, 7, 9)
    assert torch.equal(as_dtype, as_bool.to(dtype))
    x = torch.randn(13, 7, 9).to(dtype).requires_grad_()
    grad = torch.randn(13, 7, 9).to(dtype)
    torch.manual_seed(5)
    drawn = dropout(x, 0.1)  # the mask drawn inside, in x's dtype
    (gx,) = torch.autograd.grad(drawn, x, grad)
    given = dropout(x, 0.1, mask=as_bool)
    (gb,) = torch.autograd.grad(given, x, grad)
    scale = 1 / (1 - 6554 / 65536)
    assert torch.equal(drawn, given) and torch.equal(gx, gb)
    assert torch.equal(drawn, x.detach().mul(as_bool).mul_(scale))  # what the bool mask computed before


def test_fast_dropout_is_inverted_dropout_on_average_and_follows_the_seed():
    from lightning_tfm.model.fast import FastDropout, make_dropout

    d = make_dropout(0.25).train()
    assert isinstance(d, FastDropout)
    x = torch.full((400, 500), 2.0)
    torch.manual_seed(3)
    a = d(x)
    assert abs(a.mean().item() - 2.0) < 0.02  # E[dropout(x)] = x
    assert torch.equal(torch.unique(a), torch.tensor([0.0, 2.0 / (1 - 0.25)]))
    torch.manual_seed(3)
    assert torch.equal(d(x), a)  # the masks come from torch's generator: seeded runs repeat
    assert abs((a == 0).float().mean().item() - 0.25) < 0.01
    plain = make_dropout(0.25, fast=False).train()  # torch's dropout: the same statistics
    assert isinstance(plain, torch.nn.Dropout)
    b = plain(x)
    assert abs(b.mean().item() - 2.0) < 0.02 and abs((b == 0).float().mean().item() - 0.25) < 0.01
    for fast_mask in (True, False):
        with pytest.raises(ValueError, match="dropout probability"):
            make_dropout(1.0, fast_mask)


def test_model_with_fast_dropout_trains_like_torchs_dropout():
    """The switch reaches every dropout of the model; with either mask the training-mode output is the
    eval output on average (inverted dropout), and the two differ only in their random draws."""
    src, tgt = padded_src(b=2), padded_src(b=2, seed=3)
    outs = {}
    for fast_mask in (True, False):
        m = make(dropout=0.3, fast_dropout=fast_mask)
        kinds = {type(d) for n, d in m.named_modules() if n.endswith("dropout")}
        assert kinds == ({fast.FastDropout} if fast_mask else {torch.nn.Dropout})
        torch.manual_seed(0)
        with torch.no_grad():
            outs[fast_mask] = m(src, tgt)  # eval mode: no dropout, the same weights and output
            m.train()
            assert not torch.allclose(m(src, tgt), outs[fast_mask])
    torch.testing.assert_close(outs[True], outs[False])


@pytest.mark.parametrize("dtype,tol", [(None, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_projection_and_smoothed_loss_equal_the_plain_path(dtype, tol):
    """Loss, NLL, token count, and the gradients of the states and of the shared embedding."""
    import torch.nn.functional as F

    from lightning_tfm.training.loss import fused_label_smoothed_nll_loss, label_smoothed_nll_loss

    g = torch.Generator().manual_seed(0)
    W0 = torch.randn(300, 24, generator=g) * 0.5
    h0 = torch.randn(5, 41, 24, generator=g)
    target = torch.randint(1, 300, (5, 41), generator=g)
    target[:, 30:] = PAD  # padded positions take no part
    ctx = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype else contextlib.nullcontext
    out = {}
    for name in ("plain", "fused"):
        W, h = W0.clone().requires_grad_(), h0.clone().requires_grad_()
        with ctx():
            if name == "plain":
                loss, nll, n = label_smoothed_nll_loss(F.linear(h, W), target, 0.1, PAD)
            else:  # chunk 16: several chunks and a ragged last one
                loss, nll, n = fused_label_smoothed_nll_loss(h, W, target, 0.1, PAD, chunk=16)
        (loss / n).backward()
        with torch.no_grad(), ctx():  # the validation path (no gradients kept)
            nograd = fused_label_smoothed_nll_loss(h, W, target, 0.1, PAD, chunk=16)[:2]
        out[name] = (loss.detach(), nll, n, W.grad, h.grad, nograd)
    (lp, np_, npl, gwp, ghp, _), (lf, nf, nfu, gwf, ghf, ng) = out["plain"], out["fused"]
    assert int(npl) == int(nfu) == 5 * 30
    torch.testing.assert_close(lf, lp, rtol=tol / 10, atol=0)
    torch.testing.assert_close(nf, np_, rtol=tol / 10, atol=0)
    torch.testing.assert_close(ng[0], lp, rtol=tol / 10, atol=0)
    for a, b in ((gwf, gwp), (ghf, ghp)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(b.abs().max()))
    assert ghf[:, 30:].abs().max() == 0  # no gradient from padding


@pytest.mark.parametrize("rows", [5, 128, 130, 300])
def test_fused_loss_whole_products_equal_chunk_by_chunk(rows):
    """In fp32 the logits and d/dh are whole products (the last partial chunk its own product), each chunk's logits
    then worked in place into d/d(logits): loss, NLL and both gradients equal torch's log_softmax chunk by chunk, the
    ragged last chunk included. (Against the former product per chunk they were equal bit for bit with this
    machine's MKL, 211 shapes: reports/timing.md.)"""
    import torch.nn.functional as F

    from lightning_tfm.training.loss import _fused_loss_chunks, _whole_chunks

    chunk = 128
    assert _whole_chunks(300, chunk) == [slice(0, 256), slice(256, 300)]
    assert _whole_chunks(256, chunk) == [slice(0, 256)] and _whole_chunks(5, chunk) == [slice(0, 5)]
    g = torch.Generator().manual_seed(rows)
    h, w = torch.randn(rows, 64, generator=g), torch.randn(1000, 64, generator=g) * 0.1
    target = torch.randint(1, 1000, (rows,), generator=g)
    loss, nll, grad_h, grad_w = _fused_loss_chunks(h, w, target, 0.1, chunk, True)
    q = torch.full((rows, 1000), 0.1 / 999).scatter_(1, target[:, None], 0.9)  # the smoothed targets
    ref_h, ref_loss, ref_nll, grad_logits = [], 0.0, 0.0, []
    for s in range(0, rows, chunk):  # the logits a chunk at a time, as the bf16 path still computes them
        z = F.linear(h[s:s + chunk], w)
        logp = z.log_softmax(1)
        ref_loss -= float((q[s:s + chunk] * logp).sum())
        ref_nll -= float(logp.gather(1, target[s:s + chunk, None]).sum())
        grad_logits.append(logp.exp() - q[s:s + chunk])
        ref_h.append(grad_logits[-1] @ w)
    torch.testing.assert_close(float(loss), ref_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(float(nll), ref_nll, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad_h, torch.cat(ref_h), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_w, torch.cat(grad_logits).t() @ h, rtol=1e-5, atol=1e-6)


def test_fused_loss_on_the_model_equals_logits_loss():
    from lightning_tfm.training.loss import fused_label_smoothed_nll_loss, label_smoothed_nll_loss

    src, tgt = padded_src(), padded_src(seed=3)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    m = make().train()
    plain = label_smoothed_nll_loss(m(src, tgt_in), tgt_out, 0.1, PAD)
    fused = fused_label_smoothed_nll_loss(m.features(src, tgt_in), m.output_weight, tgt_out, 0.1, PAD)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5)


def test_fused_adam_takes_the_steps_of_torchs_default_adam():
    from lightning_tfm.training.optim import adam

    # Gradients are set directly: a model's gradients include exact zeros computed as rounding noise
    # (the key bias of attention cannot change a softmax), where Adam's step is sign(noise) * lr.
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(7, 5, generator=g), torch.randn(11, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in init] for _ in range(4)]
    params = {}
    for name in ("default", "fused"):
        ps = [torch.nn.Parameter(p.clone()) for p in init]
        opt = (adam if name == "fused" else torch.optim.Adam)(ps, lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
        if name == "fused":
            assert opt.defaults["fused"]
        for step in grads:
            for p, gr in zip(ps, step):
                p.grad = gr.clone()
            opt.step()
        params[name] = [p.detach().clone() for p in ps]
    for a, b, p0 in zip(params["fused"], params["default"], init):
        assert not torch.equal(a, p0)  # the steps were taken
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_features_equal_eager():
    """``train.compile``: torch.compile'd decoder states (and their gradients) equal the eager ones. One layer of
    each stack: inductor compiles every kernel with a C compiler on a cold cache (a CI machine's), ~20 s a layer
    here."""
    from lightning_tfm.training.loss import fused_label_smoothed_nll_loss

    src, tgt = padded_src(b=3), padded_src(b=3, seed=3)
    out = {}
    for name in ("eager", "compiled"):
        m = make(dropout=0.0, layers=1).train()
        f = torch.compile(m.features) if name == "compiled" else m.features
        loss, _, n = fused_label_smoothed_nll_loss(f(src, tgt[:, :-1]), m.output_weight, tgt[:, 1:], 0.1, PAD)
        (loss / n).backward()
        out[name] = (loss.detach(), m.embed.weight.grad.clone(), m.decoder[0].ffn.w_1.weight.grad.clone())
    for a, b in zip(out["compiled"], out["eager"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------- decoding speed paths
@pytest.mark.parametrize("width,k", [(8000, 8), (1000, 8), (1000, 1), (130, 8), (40, 8)])
def test_two_stage_topk_values_equal_torch_topk(width, k):
    from lightning_tfm.training.decode import topk_rows

    g = torch.Generator().manual_seed(width + k)
    for x in (torch.randn(37, width, generator=g),
              torch.randint(0, 50, (37, width), generator=g).float()):  # many ties
        values, index = topk_rows(x, k)
        ref_values, ref_index = x.topk(k, dim=1)
        assert torch.equal(values, ref_values)
        assert torch.equal(x.gather(1, index), values)  # the columns hold those values...
        assert all(len(set(r)) == k for r in index.tolist())  # ...and are k distinct columns
        if len(torch.unique(x)) == x.numel():  # no ties (the randn rows): the same columns too
            assert torch.equal(index, ref_index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reused_vocabulary_buffers_equal_log_softmax(dtype):
    import torch.nn.functional as F

    from lightning_tfm.training.decode import _VocabBuffers

    g = torch.Generator().manual_seed(1)
    W = (torch.randn(500, 16, generator=g) * 2).to(dtype)
    buf = _VocabBuffers(12, W)
    for rows in (12, 7, 3):  # sentences finish: fewer rows than allocated
        states = torch.randn(rows, 16, generator=g)
        ref = torch.log_softmax(F.linear(states.to(dtype), W).float(), -1)
        out = buf.log_probs(states)
        assert out.dtype == torch.float32 and out.shape == (rows, 500)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_kv_cache_buffers_equal_concatenation_and_row_selection():
    """fast.BufferedKVCache against written-out torch.cat / indexing, and against the plain KVCache."""
    from lightning_tfm.model import KVCache
    from lightning_tfm.model.fast import BufferedKVCache

    g = torch.Generator().manual_seed(2)
    cache, plain, k_ref, v_ref = BufferedKVCache(), KVCache(), None, None
    rows = 6
    with torch.no_grad():
        for step in range(7):
            k, v = torch.randn(rows, 2, 1, 3, generator=g), torch.randn(rows, 2, 1, 5, generator=g)
            k_ref = k if k_ref is None else torch.cat([k_ref, k], 2)
            v_ref = v if v_ref is None else torch.cat([v_ref, v], 2)
            ks, vs = cache.append(k, v)
            assert torch.equal(ks, k_ref) and torch.equal(vs, v_ref) and ks.is_contiguous()
            assert all(map(torch.equal, plain.append(k, v), (k_ref, v_ref)))
            assert len(cache) == len(plain) == step + 1
            if step % 3 == 1:  # two reorders before the next append compose
                first = torch.randint(0, rows, (rows,), generator=g)
                cache.reorder(first)
                plain.reorder(first)
                k_ref, v_ref = k_ref[first], v_ref[first]
            if step >= 3:  # sentences drop out: fewer rows
                rows -= 1
                keep = torch.randperm(rows + 1, generator=g)[:rows]
                cache.reorder(keep)
                plain.reorder(keep)
                k_ref, v_ref = k_ref[keep], v_ref[keep]
    # with gradients (not decoding) the plain ops run and gradients flow
    c = BufferedKVCache()
    a = torch.randn(2, 1, 1, 3, requires_grad=True)
    c.append(a, a)
    ks, _ = c.append(a * 2, a * 2)
    ks.sum().backward()
    assert a.grad is not None and torch.equal(a.grad, torch.full_like(a, 3.0))  # d(a + 2a)/da


def test_the_fused_losss_kept_gradient_buffer_changes_no_number():
    """The CPU loss keeps its (tokens x V) d/d(logits) buffer between calls (training/loss.py): batches of other
    sizes in turn (smaller, then larger than any before: the buffer grows), and two losses whose backward passes
    interleave, give bit for bit the gradients of a loss with a fresh buffer each time."""
    from lightning_tfm.training import loss as L

    g = torch.Generator().manual_seed(0)
    W0 = torch.randn(300, 24, generator=g) * 0.5

    def forward(rows: int, seed: int, fresh: bool = False):
        gen = torch.Generator().manual_seed(seed)
        h = torch.randn(rows, 24, generator=gen).requires_grad_()
        W = W0.clone().requires_grad_()
        target = torch.randint(1, 300, (rows,), generator=gen)
        if fresh:
            L._SCRATCH.buffers = {}
        return L.fused_label_smoothed_nll_loss(h, W, target, 0.1, PAD, chunk=16)[0], h, W

    def backward(loss, h, W):
        loss.backward()
        return loss.detach(), h.grad, W.grad

    batches = ((90, 1), (40, 2), (200, 3))  # smaller, then larger: the buffer is reused, then grown
    fresh = {b: backward(*forward(*b, fresh=True)) for b in batches}
    L._SCRATCH.buffers = {}
    kept = {b: backward(*forward(*b)) for b in batches}
    a, b = forward(40, 2), forward(90, 1)  # two forwards, then their backwards in the other order
    kept_b, kept_a = backward(*b), backward(*a)
    assert L._SCRATCH.buffers[torch.float32].numel() == 200 * 300
    for key, got in [*kept.items(), ((40, 2), kept_a), ((90, 1), kept_b)]:
        for x, y in zip(got, fresh[key]):
            assert torch.equal(x, y), key

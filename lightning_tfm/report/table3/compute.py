"""Equal-compute changes: each row's dev perplexity at the base's training compute.

A Table 3 row trains as many steps as the base, but a step of a wider or deeper row costs more: at equal steps
the table compares rows that spent different compute. Here:

- a row's training FLOPs per step (:func:`flops_per_step`, a run's: :func:`step_flops`) is the count ``ltfm bench``
  uses for MFU: its architecture's own (``train_flops_per_token`` of the class ``model.arch`` names in the model
  registry, :func:`lightning_tfm.model.registry.train_flops_per_step`), at the config the run
  was built from (:func:`model_config`: the Transformer's N, d_model, d_ff, h, d_k, d_v; another architecture's
  section), its vocabulary and its tokens: target tokens per step = the run's token budget a step (its effective batch,
  else what it trained: ``train_tokens / steps``), sentences as long as the prepared training corpus's mean
  source and target lengths (else ``ltfm bench``'s default lengths, said in the notes); the mean over the row's
  completed seeds;
- its compute at a validation step ``s`` is ``s`` x FLOPs per step; the base's budget is its last validation
  step x the base's FLOPs per step;
- its dev PPL at the base's budget (:func:`interpolate`): log PPL linear in log FLOPs between the two
  validations around it; *beyond its curve* when the row never reached that compute (its last validation is
  below it) or never spent that little (its first validation is above it): no value then, never an
  extrapolation;
- the equal-compute change: that PPL minus the base's dev PPL at its last validation.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..inputs.records import RunRecord

if TYPE_CHECKING:
    from ...model import ModelConfig

SHAPE_KEYS = {"layers": "model.layers", "d_model": "model.d_model", "d_ff": "model.d_ff", "heads": "model.heads",
              "d_k": "model.d_k", "d_v": "model.d_v"}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def _tokens_per_step(rec: RunRecord) -> float | None:
    """Target tokens of one optimizer step: the run's token budget a step (``effective_batch_tokens``, else its
    config's, :func:`lightning_tfm.training.config.sections.tokens_per_step`), else what it trained
    (``train_tokens / steps``). The budget first: two rows of the same shapes and batch then count the same
    FLOPs a step, whatever the sampling of sentence lengths put into their batches."""
    from ...training.config.sections import tokens_per_step

    if rec.effective_batch_tokens:
        return float(rec.effective_batch_tokens)
    c = rec.config
    total, per, accumulate = c.get("train.batch_tokens_total"), c.get("train.batch_tokens"), c.get("train.accumulate")
    if _positive(total) or _positive(per):
        return tokens_per_step(per if _positive(per) else 0, c.get("train.devices", "1"),
                               accumulate if _positive(accumulate) else 1, total if _positive(total) else None)
    if rec.train_tokens and rec.steps:
        return rec.train_tokens / rec.steps
    return None


def sentence_lengths(rec: RunRecord) -> tuple[float, float, bool]:
    """(source, target tokens a sentence, whether measured) of a run: its prepared corpus's mean lengths, else
    ``ltfm bench``'s default lengths."""
    from ...bench.speed import DEFAULTS

    measured = bool(rec.src_len and rec.tgt_len)
    src_len, tgt_len = (rec.src_len, rec.tgt_len) if measured else (DEFAULTS["src_len"], DEFAULTS["tgt_len"])
    return src_len, tgt_len, measured


def row_shapes(rec: RunRecord) -> tuple[dict | None, bool]:
    """(a transformer run's shapes (:data:`SHAPE_KEYS`), ``vocab``, ``batch`` (sentences a step), ``src_len`` and
    ``tgt_len`` (:func:`sentence_lengths`), whether the lengths were measured on the run's corpus); (None, False)
    when its config lacks a shape or its tokens."""
    shapes = {k: rec.config.get(key) for k, key in SHAPE_KEYS.items()}
    shapes["vocab"] = rec.vocab_size or rec.config.get("data.vocab_size")
    tokens = _tokens_per_step(rec)
    if tokens is None or not all(isinstance(v, (int, float)) and v > 0 for v in shapes.values()):
        return None, False
    src_len, tgt_len, measured = sentence_lengths(rec)
    return {**shapes, "batch": tokens / tgt_len, "src_len": src_len, "tgt_len": tgt_len}, measured


def model_config(rec: RunRecord) -> ModelConfig | None:
    """The model section of a run (its architecture's config with it), through the model registry: ``model.arch``
    (a saved transformer config leaves it out), then the keys of its section the run's config holds (the
    Transformer's: ``model.*``, every one of :data:`SHAPE_KEYS` needed, :func:`row_shapes`; another architecture's:
    ``<arch>.*`` over the section's defaults). None for an architecture not registered here or a transformer run
    without its shapes."""
    import dataclasses

    from ...model import ARCHITECTURES, DEFAULT_ARCH, ModelConfig
    from ...model.registry import section

    arch = rec.config.get("model.arch") or DEFAULT_ARCH
    if arch not in ARCHITECTURES:
        return None
    own = ARCHITECTURES[arch].section is not None
    if not own and row_shapes(rec)[0] is None:
        return None
    model = ModelConfig(arch=arch)
    cfg = section(model, arch)  # the model section itself for the transformer
    prefix = arch if own else "model"
    for f in dataclasses.fields(cfg):
        value = rec.config.get(f"{prefix}.{f.name}")
        if value is not None and f.name != "arch":
            setattr(cfg, f.name, value)
    return model


def step_flops(rec: RunRecord) -> tuple[float | None, bool]:
    """(training FLOPs of one optimizer step of a run, whether its sentence lengths were measured on its corpus): its
    architecture's count (:func:`lightning_tfm.model.registry.train_flops_per_step` at :func:`model_config`, its
    vocabulary, :func:`sentence_lengths` and its target tokens a step); (None, False) without a registered
    architecture with a FLOPs count, its shapes, a vocabulary or the tokens."""
    from ...model.registry import train_flops_per_step

    model, tokens = model_config(rec), _tokens_per_step(rec)
    vocab = rec.vocab_size or rec.config.get("data.vocab_size")
    if model is None or tokens is None or not (isinstance(vocab, (int, float)) and vocab > 0):
        return None, False
    src_len, tgt_len, measured = sentence_lengths(rec)
    try:
        return train_flops_per_step(model, int(vocab), (src_len, tgt_len), tokens), measured
    except NotImplementedError:  # an architecture that counts no FLOPs (EncoderDecoder's default): no column value
        return None, False


def flops_per_step(records: list[RunRecord]) -> tuple[float | None, bool]:
    """(training FLOPs per step, lengths measured) of a row: the mean over its completed runs (:func:`step_flops`)."""
    counts, measured = [], True
    for rec in records:
        if not rec.completed:
            continue
        f, m = step_flops(rec)
        if f is not None:
            counts.append(f)
            measured = measured and m
    return (sum(counts) / len(counts), measured) if counts else (None, False)


def interpolate(points: list[tuple[float, float]], flops: float) -> tuple[float | None, str | None]:
    """(dev PPL at ``flops``, None) from a curve of (FLOPs, dev PPL) points, log PPL linear in log FLOPs
    between the validations around it; (None, why) when ``flops`` lies beyond the curve."""
    pts = sorted((f, p) for f, p in points if f > 0 and p > 0)
    if not pts:
        return None, "no curve"
    x = math.log(flops)
    xs = [math.log(f) for f, _ in pts]
    tol = 1e-9 * max(1.0, abs(x))
    if x > xs[-1] + tol:
        return None, "beyond its curve: never reached the base's compute"
    if x < xs[0] - tol:
        return None, "beyond its curve: never spent that little (first validation above the base's compute)"
    for (x0, (_, p0)), (x1, (_, p1)) in zip(zip(xs, pts), zip(xs[1:], pts[1:])):
        if x0 - tol <= x <= x1 + tol:
            if x1 == x0:
                return p1, None
            t = min(1.0, max(0.0, (x - x0) / (x1 - x0)))
            return math.exp((1 - t) * math.log(p0) + t * math.log(p1)), None
    return pts[-1][1], None  # a single point, at the base's compute (within the tolerance)


def add_equal_compute(rows: list, curves, by_variant: dict[str, list[RunRecord]]) -> dict:
    """Each row's ``flops_per_step``, ``train_flops`` (at its last validation), ``dev_ppl_equal_flops`` (at the
    base's budget), ``delta_ppl_equal_flops`` (+ ``_rel``) and ``equal_flops_note``; returns ``{"base_flops",
    "lengths_measured"}``. ``rows``: the table's :class:`~.columns.Row`; ``curves``: its learning curves
    (:class:`~.table.LearningCurves`)."""
    per_step = {}
    measured = True
    for row in rows:
        f, m = flops_per_step(by_variant.get(row.variant, []))
        per_step[row.variant] = f
        measured = measured and (m or f is None)
    base_curve = curves.rows.get("base") or {}
    base_f = per_step.get("base")
    base_flops = max(base_curve) * base_f if base_curve and base_f else None
    base_ppl = base_curve[max(base_curve)] if base_curve else None
    for row in rows:
        v = row.variant
        f, curve = per_step.get(v), curves.rows.get(v) or {}
        row.flops_per_step = f
        row.train_flops = max(curve) * f if curve and f else None
        row.dev_ppl_equal_flops = row.delta_ppl_equal_flops = row.delta_ppl_equal_flops_rel = None
        row.equal_flops_note = None
        if v == "base" or base_flops is None or row.delta_ppl is None:
            continue
        if f is None or not curve:
            row.equal_flops_note = "no training compute (shapes or tokens unknown)" if curve else "no curve"
            continue
        ppl, why = interpolate([(st * f, p) for st, p in curve.items()], base_flops)
        row.equal_flops_note = why
        if ppl is not None:
            row.dev_ppl_equal_flops = ppl
            row.delta_ppl_equal_flops = ppl - base_ppl
            row.delta_ppl_equal_flops_rel = (ppl - base_ppl) / base_ppl
    return {"base_flops": base_flops, "lengths_measured": measured}


COMPUTE_RULE = ("ΔPPL at base FLOPs: the row's dev PPL at the base's training compute (its last validation step × "
                "its FLOPs per step) minus the base's, log PPL linear in log FLOPs between the row's validations; "
                "FLOPs per step as `ltfm bench` counts them for MFU (the architecture's own count; the Transformer's: "
                "6 × matmul parameters × tokens + attention) at the row's shapes, vocabulary and target-token budget "
                "per step; \"beyond its "
                "curve\" when the row never reached that compute or never spent that little")

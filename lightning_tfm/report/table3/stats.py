"""The statistics of the Table 3 replica that are about the paper and BLEU: direction agreement with the paper, and
sacreBLEU's paired bootstrap on the dev hypotheses. Seed noise, its rule and intervals are the findings'
(:mod:`lightning_tfm.findings.noise`).

Agreement (:func:`agrees`, :func:`agreement_summary`): "agrees" = our change against our base and the paper's
against the paper's base have the same sign (rows where the paper's change is 0 are not compared); the
summary counts it over all rows and over the rows beyond noise.

Run configs arrive as the records' flat dicts (``"data.dev_split"``); the one place that loads data with one
converts it with ``Config.from_dict(..., checked=False)`` (:func:`dev_references`).

BLEU differences are tested with sacreBLEU's paired bootstrap resampling (:func:`paired_test`: 1000
resamples, sacreBLEU's fixed seed 12345 unless ``SACREBLEU_SEED`` says otherwise) on the dev hypotheses of the
base and the row, guarded so that identical outputs, equal BLEU or two near-zero BLEU are never significant,
and reported with the number of sentences that differ. The bootstrap measures test-set sampling noise only;
with several seeds the seeds both rows completed are pooled (:func:`paired_bootstrap`: the test resamples
(sentence, seed) pairs) and a change within seed noise is not marked significant whatever its p-value
(:func:`bleu_significant`). The references are the runs' dev split (:func:`dev_references`).
"""
from __future__ import annotations

from typing import Any

from ...base.errors import UserError
from ...findings.noise import finite
from ...findings.verdict import sign
from ..core.text import first_line
from ..inputs.records import RunRecord

SIGNIFICANCE = 0.05


# Below this corpus BLEU on both sides a difference is not tested: with (almost) no matching 4-gram, BLEU's
# geometric mean is set by the smoothing of zero counts, not by how good the translations are.
BLEU_FLOOR = 1.0


BOOTSTRAP_SAMPLES = 1000


def agrees(ours: float | None, paper: float | None) -> bool | None:
    """Same direction of change against the base; None when either is unknown (or no number) or the paper's is 0."""
    if not finite(ours) or not finite(paper) or sign(paper) == 0:
        return None
    return sign(ours) == sign(paper)


def agreement_summary(rows: list) -> dict:
    """Direction agreement with the paper over all compared rows and over the rows whose change is beyond
    seed noise, per metric; and how many rows are beyond noise (``rows``: the table's :class:`~.columns.Row`)."""
    out: dict[str, Any] = {}
    for metric in ("ppl", "bleu"):
        agree, noise = f"{metric}_agrees", f"{metric}_noise"   # the row's fields of the metric
        judged = [r for r in rows if getattr(r, agree) is not None]
        out[metric] = (sum(1 for r in judged if getattr(r, agree)), len(judged))
        beyond = [r for r in judged if getattr(r, noise) == "beyond"]
        out[f"{metric}_beyond"] = (sum(1 for r in beyond if getattr(r, agree)), len(beyond))
        changed = [r for r in rows if getattr(r, noise) is not None]
        out[f"{metric}_noise"] = {v: sum(1 for r in changed if getattr(r, noise) == v)
                                  for v in ("beyond", "within", "unknown")}
    both = [r for r in rows if r.ppl_agrees is not None and r.bleu_agrees is not None]
    out["both"] = (sum(1 for r in both if r.ppl_agrees and r.bleu_agrees), len(both))
    out["not_compared"] = [(r.variant, r.status) for r in rows
                           if r.variant != "base" and r.in_paper and r.seeds_completed == 0]
    return out


_REFS_CACHE: dict[tuple, list[str]] = {}


def dev_references(config: dict) -> list[str]:
    """The dev references a run was scored against: its config's dev split, first data.max_dev_pairs."""
    from ...training.config.config import Config
    from ...training.data.data import load_split

    key = tuple(config.get(k) for k in ("data.source", "data.path", "data.hub_name", "data.hub_config",
                                        "data.dev_split", "data.src_lang", "data.tgt_lang", "data.max_dev_pairs"))
    if key not in _REFS_CACHE:
        nested: dict[str, dict] = {}
        for k, v in config.items():
            sec, name = k.split(".", 1)
            nested.setdefault(sec, {})[name] = v
        cfg = Config.from_dict(nested, checked=False)
        ds = load_split(cfg, cfg.data.dev_split, cfg.data.max_dev_pairs)
        _REFS_CACHE[key] = list(ds["tgt"])
    return _REFS_CACHE[key]


def paired_test(base_hyps: list[str], hyps: list[str], refs: list[str], tgt: str = "") -> dict:
    """sacreBLEU's paired bootstrap resampling of ``hyps`` against ``base_hyps`` (dev BLEU), guarded.

    sacreBLEU's test counts the resampled differences *above* the observed one and adds one
    (``(c + 1) / (n + 1)``): when the two outputs are identical every difference is 0, none is above 0, and it
    returns p = 1/1001, "significant". Hence: outputs that differ in no sentence, or whose BLEU scores are
    equal at the precision the table shows, are not tested (p = 1); nor are two outputs both below
    :data:`BLEU_FLOOR`. The bootstrap resamples sentences of one test set: it measures test-set sampling noise
    only, not the variation of retraining with another seed.

    Returns {"p_value", "differing" (sentences whose hypotheses differ), "sentences", "score", "base_score",
    "tested", "signature"}."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not (len(base_hyps) == len(hyps) == len(refs)):
        raise ValueError(f"{len(hyps)} hypotheses, base {len(base_hyps)}, references {len(refs)}")
    differing = sum(1 for a, b in zip(base_hyps, hyps) if a != b)
    metric = BLEU(trg_lang=tgt if tgt == "zh" else "")  # as lightning_tfm.training.evaluate.bleu scores
    score, base_score = metric.corpus_score(hyps, [refs]).score, metric.corpus_score(base_hyps, [refs]).score
    out = {"p_value": 1.0, "differing": differing, "sentences": len(hyps), "score": float(score),
           "base_score": float(base_score), "tested": False, "signature": None}
    if differing == 0 or round(score, 2) == round(base_score, 2) or max(score, base_score) < BLEU_FLOOR:
        return out
    test = PairedTest([("base", base_hyps), ("row", hyps)], {"BLEU": BLEU(trg_lang=tgt if tgt == "zh" else "")},
                      references=[refs], test_type="bs", n_samples=BOOTSTRAP_SAMPLES)
    sigs, scores = test()
    out.update(p_value=float(scores["BLEU"][1].p_value), tested=True, signature=str(sigs["BLEU"]))
    return out


def bleu_significant(test: dict, delta: float | None, noise: str | None) -> bool:
    """A row's ΔBLEU is marked significant when sacreBLEU's paired bootstrap gives p < SIGNIFICANCE on outputs
    that differ, the change shows at the table's precision, and -- with several seeds -- it is beyond seed
    noise (:func:`lightning_tfm.findings.noise.noise_verdict`): test-set sampling noise alone does not make a change
    real."""
    return bool(test["tested"] and test["p_value"] < SIGNIFICANCE and test["differing"] > 0
                and delta is not None and round(delta, 2) != 0 and noise != "within")


def paired_bootstrap(by_variant: dict[str, list[RunRecord]], variants: list[str]) -> tuple[dict, list[str], str | None]:
    """:func:`paired_test` of every row's dev hypotheses against the base's; several seeds: the seeds both
    rows completed, concatenated (the test resamples (sentence, seed) pairs).

    Returns ({variant: paired_test's dict + "seeds"}, notes, the test's signature)."""
    from ...training.data.data import read_lines

    notes: list[str] = []
    later = "dev hypotheses are of a later training than this sweep's budget (its run folders were trained on)"
    base = {r.seed: r for r in by_variant.get("base", []) if r.completed and r.hyps}
    if not base:
        if any(r.completed and r.later_attempt for r in by_variant.get("base", [])):
            notes.append(f"paired bootstrap not computed: the base's {later}")
        elif any(r.completed for recs in by_variant.values() for r in recs):
            notes.append("paired bootstrap not computed: it needs the dev hypotheses files of a completed base "
                         "run (local results only)")
        return {}, notes, None
    out: dict[str, dict] = {}
    signature = None
    for v in variants:
        if v == "base":
            continue
        recs = {r.seed: r for r in by_variant.get(v, []) if r.completed and r.hyps}
        seeds = sorted(set(base) & set(recs), key=lambda s: (s is None, s or 0))
        if not seeds:
            if any(r.completed and r.later_attempt for r in by_variant.get(v, [])):
                notes.append(f"paired bootstrap for {v} not computed: its {later}")
            continue
        try:
            hb, hv, refs = [], [], []
            for s in seeds:
                ref = dev_references(recs[s].config)
                b, h = read_lines(base[s].hyps), read_lines(recs[s].hyps)
                if not (len(b) == len(h) == len(ref)):
                    raise UserError(f"{v} seed {s}: {len(h)} hypotheses, base {len(b)}, references {len(ref)}")
                hb += b
                hv += h
                refs += ref
            res = paired_test(hb, hv, refs, str(recs[seeds[0]].config.get("data.tgt_lang") or ""))
            signature = res["signature"] or signature
            out[v] = {**res, "seeds": seeds}
        except Exception as e:  # noqa: BLE001 - e.g. Hub references offline: the table stands without the test
            notes.append(f"paired bootstrap for {v} not computed: {first_line(e, 200) or e.__class__.__name__}")
    return out, notes, signature

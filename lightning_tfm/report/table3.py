"""The Table 3 replica: one row per variant beside the paper's, seed noise, the paired bootstrap, and its
markdown (``table3.md``) and CSV (``table3.csv``).

The table (:func:`build_table`): one row per variant of the sweep file, in the paper's order (base, A1-A4,
B1, B2, C1-C7, D1-D4, E, big), then the sweep's other rows in file order, then runs of variants the file no
longer lists. A variant that is missing, waiting, running, failed, skipped (unbuildable) or pruned keeps its
row with that status; its numbers stay empty (only completed seeds are averaged). Several seeds: mean ±
sample standard deviation. Change (Δ) = the row's value minus its base's, ours against our base and the
paper's against the paper's base; "agrees" = the two changes have the same sign (rows where the paper's
change is 0 are not compared); each change is also given relative to its base, so that ours and the paper's
effect sizes can be set side by side.

Seed noise (:func:`noise_verdict`, the one rule): a row's change is beyond noise when |Δ| > NOISE_K (2) × the
sample standard deviation of the base row over its seeds; with one base seed the noise is "unknown", never
guessed. The headline gives the direction agreement over all rows and over the rows beyond noise.

BLEU differences are tested with sacreBLEU's paired bootstrap resampling (:func:`paired_test`: 1000
resamples, sacreBLEU's fixed seed 12345 unless ``SACREBLEU_SEED`` says otherwise) on the dev hypotheses of the
base and the row, guarded so that identical outputs, equal BLEU or two near-zero BLEU are never significant, and reported with
the number of sentences that differ. The bootstrap measures test-set sampling noise only; with several seeds
the seeds both rows completed are pooled (the test resamples (sentence, seed) pairs) and a change within seed
noise is not marked significant whatever its p-value.

The markdown (``table3.md``) and the HTML put the headline first (direction agreement, rows beyond noise, the
sweep's wall time, the machines), then a PPL table, a BLEU table and the configuration table.
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
from importlib import resources
from pathlib import Path
from typing import Any

from .. import results as R
from ..errors import UserError
from .records import DONE, ReportData, RunRecord
from ..atomic import write_text
from .text import first_line, fmt, fmt_knob, md_cell


PAPER_ORDER = ("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
               "D1", "D2", "D3", "D4", "E", "big")


# (column header, flat config key): the knob columns of Table 3 (ours), plus positions and norm.
KNOBS = (("N", "model.layers"), ("d_model", "model.d_model"), ("d_ff", "model.d_ff"), ("h", "model.heads"),
         ("d_k", "model.d_k"), ("d_v", "model.d_v"), ("P_drop", "model.dropout"),
         ("ε_ls", "train.label_smoothing"), ("positional", "model.positional"), ("norm", "model.norm"),
         ("train steps", "train.max_steps"))


CSV_KNOBS = {"model.layers": "layers", "model.d_model": "d_model", "model.d_ff": "d_ff", "model.heads": "heads",
             "model.d_k": "d_k", "model.d_v": "d_v", "model.dropout": "dropout",
             "train.label_smoothing": "label_smoothing", "model.positional": "positional", "model.norm": "norm",
             "train.max_steps": "train_steps"}


SIGNIFICANCE = 0.05


# Below this corpus BLEU on both sides a difference is not tested: with (almost) no matching 4-gram, BLEU's
# geometric mean is set by the smoothing of zero counts, not by how good the translations are.
BLEU_FLOOR = 1.0


BOOTSTRAP_SAMPLES = 1000


def load_paper() -> dict[str, dict]:
    """The paper's Table 3 (lightning_tfm/resources/paper_table3.csv): name -> row with numbers parsed."""
    text = resources.files("lightning_tfm").joinpath("resources/paper_table3.csv").read_text()
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        parsed = dict(row)
        for key in ("dev_ppl", "dev_bleu", "params_m", "dropout", "label_smoothing"):
            parsed[key] = float(row[key]) if row[key] else None
        for key in ("layers", "d_model", "d_ff", "heads", "d_k", "d_v", "train_steps"):
            parsed[key] = int(row[key]) if row[key] else None
        out[row["name"]] = parsed
    return out


def ordered_variants(sweep, records: list[RunRecord]) -> list[str]:
    """Paper rows in the paper's order, then the sweep's other rows in file order, then runs of variants
    the sweep file does not list (sorted)."""
    listed = list(sweep.variants or {})
    paper = [v for v in PAPER_ORDER if v in listed]
    others = [v for v in listed if v not in PAPER_ORDER]
    rank = {v: i for i, v in enumerate(PAPER_ORDER)}
    stray = sorted({r.variant for r in records} - set(listed), key=lambda v: (rank.get(v, len(rank)), v))
    return paper + others + stray


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _sign(x: float | None) -> int | None:
    if x is None:
        return None
    return (x > 0) - (x < 0)


def _agrees(ours: float | None, paper: float | None) -> bool | None:
    """Same direction of change against the base; None when either is unknown or the paper's is 0."""
    if ours is None or paper is None or _sign(paper) == 0:
        return None
    return _sign(ours) == _sign(paper)


def _status(variant: str, recs: list[RunRecord], seeds: list[int]) -> str:
    if not recs:
        return "missing (no run)"
    done = [r for r in recs if r.completed]
    if len(done) == len(recs) and len(recs) >= len(seeds):
        return DONE if len(recs) == 1 else f"{DONE} ({len(recs)} seeds)"
    parts = []
    for r in sorted(recs, key=lambda r: (r.seed is None, r.seed or 0)):
        if r.completed:
            continue
        what = r.status
        if r.status == "pruned" and r.steps is not None:
            what += f" at step {r.steps}"
        if r.note:
            what += f": {r.note}"
        parts.append((f"seed {r.seed} " if len(seeds) > 1 or len(recs) > 1 else "") + what)
    missing = [s for s in seeds if s not in {r.seed for r in recs}]
    parts += [f"seed {s} missing" for s in missing] if len(seeds) > 1 else []
    head = f"{len(done)}/{max(len(seeds), len(recs))} seeds {DONE}; " if done else ""
    return head + "; ".join(parts)


def build_table(data: ReportData, bootstrap: bool = True) -> dict:
    """The Table 3 replica as ``{"rows": [...], "summary": {...}, "notes": [...], "run_info": {...}}`` (see the
    module docstring)."""
    paper = load_paper()
    pbase = paper["base"]
    sweep = data.sweep
    seeds = list(sweep.seeds)
    own_seeds = {v: list(body["seeds"]) for v, body in (sweep.variants or {}).items() if body.get("seeds")}
    by_variant: dict[str, list[RunRecord]] = {}
    for r in data.records:
        by_variant.setdefault(r.variant, []).append(r)

    def agg(variant: str) -> dict:
        done = [r for r in by_variant.get(variant, []) if r.completed]
        ppl, ppl_sd = _mean_std([r.dev_ppl for r in done if r.dev_ppl is not None])
        bleu, bleu_sd = _mean_std([r.dev_bleu for r in done if r.dev_bleu is not None])
        params = [r.params for r in by_variant.get(variant, []) if r.params is not None]
        return {"ppl": ppl, "ppl_sd": ppl_sd, "bleu": bleu, "bleu_sd": bleu_sd, "n_done": len(done),
                "params": params[0] if params else None}

    base = agg("base") if "base" in by_variant else None
    variants = ordered_variants(sweep, data.records)
    tests, test_notes, test_signature = (paired_bootstrap(by_variant, variants) if bootstrap else ({}, [], None))
    rows = []
    for v in variants:
        recs = by_variant.get(v, [])
        a = agg(v)
        cfg = {**data.planned.get(v, {}), **next((r.config for r in recs if r.config), {})}
        p = paper.get(v)
        row: dict[str, Any] = {"variant": v, "family": next((r.family for r in recs if r.family), None)
                               or ((sweep.variants or {}).get(v) or {}).get("family"),
                               "in_paper": p is not None}
        for _, key in KNOBS:
            row[key] = cfg.get(key)
        vseeds = own_seeds.get(v, seeds)  # a row's own seeds (the base at three, for the noise), else the sweep's
        row.update(seeds_completed=a["n_done"], seeds_total=max(len(vseeds), len(recs)),
                   dev_ppl=a["ppl"], dev_ppl_std=a["ppl_sd"], dev_bleu=a["bleu"], dev_bleu_std=a["bleu_sd"],
                   params=a["params"],
                   paper_dev_ppl=p["dev_ppl"] if p else None, paper_dev_bleu=p["dev_bleu"] if p else None,
                   paper_params_m=p["params_m"] if p else None)
        is_base = v == "base"
        for metric, mean in (("ppl", a["ppl"]), ("bleu", a["bleu"])):
            ours_base = base[metric] if base else None
            paper_key = f"dev_{metric}"
            delta = (mean - ours_base) if (not is_base and mean is not None and ours_base is not None) else None
            pdelta = (p[paper_key] - pbase[paper_key]) if (p and not is_base) else None
            row[f"delta_{metric}"] = delta
            row[f"paper_delta_{metric}"] = pdelta
            row[f"delta_{metric}_rel"] = _relative(delta, ours_base)
            row[f"paper_delta_{metric}_rel"] = _relative(pdelta, pbase[paper_key])
            row[f"{metric}_agrees"] = _agrees(delta, pdelta)
            row[f"{metric}_noise"] = (noise_verdict(delta, base[f"{metric}_sd"] if base else None)
                                      if delta is not None else None)
        t = tests.get(v)
        row["bleu_p_value"] = t["p_value"] if t else None
        row["bleu_tested"] = t["tested"] if t else None
        row["bleu_differing"] = t["differing"] if t else None
        row["bleu_sentences"] = t["sentences"] if t else None
        row["bleu_test_seeds"] = t["seeds"] if t else None
        row["bleu_significant"] = bleu_significant(t, row["delta_bleu"], row["bleu_noise"]) if t else None
        row["status"] = _status(v, recs, vseeds)
        rows.append(row)
    summary = agreement_summary(rows)
    notes = list(test_notes)
    signatures = sorted({r.bleu_signature for r in data.records if r.bleu_signature})
    all_seeds = sorted(set(seeds).union(*own_seeds.values()))
    return {"sweep": sweep.name, "experiment": sweep.experiment.name, "seeds": all_seeds, "rows": rows,
            "sweep_seeds": seeds, "own_seeds": own_seeds, "curves": learning_curves(data, variants),
            "summary": summary, "notes": notes, "bleu_signatures": signatures, "test_signature": test_signature,
            "has_base": base is not None and base["n_done"] > 0, "run_info": sweep_run_info(data),
            "source": data.source, "data_notes": list(data.notes),
            "base_std": {m: (base[f"{m}_sd"] if base else None) for m in ("ppl", "bleu")},
            "base_seeds": base["n_done"] if base else 0}


def _relative(delta: float | None, base: float | None) -> float | None:
    """A change as a fraction of its base: the paper's and our absolute values are on different scales
    (corpus, model size, BLEU tokenization), their relative changes can be set side by side."""
    if delta is None or base is None or base == 0:
        return None
    return delta / abs(base)


NOISE_K = 2.0


NOISE_RULE = (f"a row's change is beyond seed noise when |Δ| > {NOISE_K:g} × the sample standard deviation of "
              "the base row over its seeds (the spread that retraining the same configuration with another "
              "seed gives); with fewer than 2 completed base seeds the noise is unknown")


def noise_verdict(delta: float | None, base_std: float | None, k: float = NOISE_K) -> str | None:
    """The one noise rule of the report (:data:`NOISE_RULE`): ``"beyond"`` when ``|delta| > k * base_std``,
    ``"within"`` otherwise, ``"unknown"`` when the base's seed spread is unknown (one seed); None without a
    change. A zero spread (every seed gave the same number) makes any nonzero change beyond noise."""
    if delta is None:
        return None
    if base_std is None:
        return "unknown"
    return "beyond" if abs(delta) > k * base_std else "within"


def agreement_summary(rows: list[dict]) -> dict:
    """Direction agreement with the paper over all compared rows and over the rows whose change is beyond
    seed noise, per metric; and how many rows are beyond noise."""
    out: dict[str, Any] = {}
    for metric in ("ppl", "bleu"):
        judged = [r for r in rows if r[f"{metric}_agrees"] is not None]
        out[metric] = (sum(1 for r in judged if r[f"{metric}_agrees"]), len(judged))
        beyond = [r for r in judged if r[f"{metric}_noise"] == "beyond"]
        out[f"{metric}_beyond"] = (sum(1 for r in beyond if r[f"{metric}_agrees"]), len(beyond))
        changed = [r for r in rows if r[f"{metric}_noise"] is not None]
        out[f"{metric}_noise"] = {v: sum(1 for r in changed if r[f"{metric}_noise"] == v)
                                  for v in ("beyond", "within", "unknown")}
    both = [r for r in rows if r["ppl_agrees"] is not None and r["bleu_agrees"] is not None]
    out["both"] = (sum(1 for r in both if r["ppl_agrees"] and r["bleu_agrees"]), len(both))
    out["not_compared"] = [(r["variant"], r["status"]) for r in rows
                           if r["variant"] != "base" and r["in_paper"] and r["seeds_completed"] == 0]
    return out


def sweep_run_info(data: ReportData) -> dict:
    """How the sweep ran: wall time from the first start to the last end of the shown rows' trials (else
    runs), their training time summed, and the machines (CPU model, cores) the workers recorded."""
    import datetime as dt

    starts, ends = [], []
    machines: dict[str, str] = {}
    trials = {r.trial for r in data.records if r.trial is not None}
    if data.study is not None and trials:
        for t in data.study.get_trials(deepcopy=False):
            if t.number in trials and t.datetime_start is not None:
                starts.append(t.datetime_start)
                if t.datetime_complete is not None:
                    ends.append(t.datetime_complete)
        machines = {k.split(".", 2)[2]: v for k, v in data.study.user_attrs.items() if k.startswith("ltfm.machine.")}
    else:
        for r in data.records:
            with contextlib.suppress(TypeError, ValueError):
                starts.append(dt.datetime.fromisoformat(r.started_at))
                ends.append(dt.datetime.fromisoformat(r.finished_at))
    hosts = sorted({r.host for r in data.records if r.host})
    named = [f"{machines[h]} ({h})" if h in machines else f"{h} (CPU not recorded)" for h in hosts]
    named += [f"{m} ({h})" for h, m in sorted(machines.items()) if h not in hosts and not hosts]
    walls = [r.wall_time_s for r in data.records if r.wall_time_s is not None]
    return {"wall_s": (max(ends) - min(starts)).total_seconds() if starts and ends else None,
            "train_s": sum(walls) if walls else None, "machines": named,
            "runs": sum(1 for r in data.records if r.completed), "records": len(data.records)}


_REFS_CACHE: dict[tuple, list[str]] = {}


def dev_references(config: dict) -> list[str]:
    """The dev references a run was scored against: its config's dev split, first data.max_dev_pairs."""
    from ..data import load_split

    key = tuple(config.get(k) for k in ("data.source", "data.path", "data.hub_name", "data.hub_config",
                                        "data.dev_split", "data.src_lang", "data.tgt_lang", "data.max_dev_pairs"))
    if key not in _REFS_CACHE:
        nested: dict[str, dict] = {}
        for k, v in config.items():
            sec, name = k.split(".", 1)
            nested.setdefault(sec, {})[name] = v
        ds = load_split(nested, nested["data"]["dev_split"], nested["data"].get("max_dev_pairs"))
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
    metric = BLEU(trg_lang=tgt if tgt == "zh" else "")  # as lightning_tfm.evaluate.bleu scores
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
    noise (:func:`noise_verdict`): test-set sampling noise alone does not make a change real."""
    return bool(test["tested"] and test["p_value"] < SIGNIFICANCE and test["differing"] > 0
                and delta is not None and round(delta, 2) != 0 and noise != "within")


def paired_bootstrap(by_variant: dict[str, list[RunRecord]], variants: list[str]) -> tuple[dict, list[str], str | None]:
    """:func:`paired_test` of every row's dev hypotheses against the base's; several seeds: the seeds both
    rows completed, concatenated (the test resamples (sentence, seed) pairs).

    Returns ({variant: paired_test's dict + "seeds"}, notes, the test's signature)."""
    from ..data import read_lines

    notes: list[str] = []
    base = {r.seed: r for r in by_variant.get("base", []) if r.completed and r.hyps}
    if not base:
        if any(r.completed for recs in by_variant.values() for r in recs):
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


def _params_m(n: int | None) -> str:
    if n is None:
        return ""
    m = n / 1e6
    return f"{m:.2f}" if m < 10 else f"{m:.1f}"


def _mstd(mean, sd, digits) -> str:
    if mean is None:
        return ""
    return fmt(mean, digits) + (f" ± {sd:.{digits}f}" if sd is not None else "")


def _yes(x: bool | None) -> str:
    return "" if x is None else ("yes" if x else "no")


def _delta(delta: float | None, rel: float | None, digits: int) -> str:
    """A change with its relative size: ``+1.10 (+22%)``."""
    if delta is None:
        return ""
    return fmt(delta, digits, sign=True) + (f" ({100 * rel:+.0f}%)" if rel is not None else "")


def _noise_cell(row: dict, metric: str, base_std: float | None) -> str:
    if row["variant"] == "base":
        return f"noise: {NOISE_K:g}σ = {NOISE_K * base_std:.2f}" if base_std is not None else "noise unknown (1 seed)"
    return {"beyond": "yes", "within": "no", "unknown": "unknown"}.get(row[f"{metric}_noise"], "")


def _test_cell(row: dict) -> str:
    if row["bleu_p_value"] is None:
        return ""
    n, of = row["bleu_differing"], row["bleu_sentences"]
    if n == 0:
        return f"identical outputs ({of} sentences)"
    if not row["bleu_tested"]:
        why = "equal BLEU" if row["delta_bleu"] is not None and round(row["delta_bleu"], 2) == 0 else \
            f"both BLEU < {BLEU_FLOOR:g}"
        return f"not tested: {why} ({n}/{of} sentences differ)"
    p = row["bleu_p_value"]
    return f"p = {p:.3f}, {n}/{of} sentences differ" if p >= 0.001 else f"p < 0.001, {n}/{of} sentences differ"


PPL_COLUMNS = ("row", "dev PPL ours", "dev PPL paper", "ΔPPL ours", "ΔPPL paper", "PPL agrees", "PPL beyond noise")


BLEU_COLUMNS = ("row", "dev BLEU ours", "dev BLEU paper", "ΔBLEU ours", "ΔBLEU paper", "BLEU agrees",
                "BLEU beyond noise", "paired bootstrap")


CONFIG_COLUMNS = ("row", *[h for h, _ in KNOBS], "params ours (M)", "params paper (M)", "status")


def ppl_cells(row: dict, table: dict) -> list[str]:
    return [row["variant"], _mstd(row["dev_ppl"], row["dev_ppl_std"], 2), fmt(row["paper_dev_ppl"], 2),
            _delta(row["delta_ppl"], row["delta_ppl_rel"], 2),
            _delta(row["paper_delta_ppl"], row["paper_delta_ppl_rel"], 2), _yes(row["ppl_agrees"]),
            _noise_cell(row, "ppl", table["base_std"]["ppl"])]


def bleu_cells(row: dict, table: dict) -> list[str]:
    sig = "*" if row["bleu_significant"] else ""
    return [row["variant"], _mstd(row["dev_bleu"], row["dev_bleu_std"], 2), fmt(row["paper_dev_bleu"], 1),
            _delta(row["delta_bleu"], row["delta_bleu_rel"], 2) + sig,
            _delta(row["paper_delta_bleu"], row["paper_delta_bleu_rel"], 1), _yes(row["bleu_agrees"]),
            _noise_cell(row, "bleu", table["base_std"]["bleu"]), _test_cell(row)]


def config_cells(row: dict, table: dict) -> list[str]:  # noqa: ARG001 - same signature as the others
    return [row["variant"], *[fmt_knob(row[key]) for _, key in KNOBS], _params_m(row["params"]),
            ("" if row["paper_params_m"] is None else f"{row['paper_params_m']:g}"), row["status"]]


def _md_table(table: dict, columns: tuple, cells, left: tuple = ()) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i == 0 or c in left else "--:" for i, c in enumerate(columns)) + "|"]
    for row in table["rows"]:
        lines.append("| " + " | ".join(md_cell(c) for c in cells(row, table)) + " |")
    return lines


def _fraction(pair: tuple[int, int]) -> str:
    k, n = pair
    return f"{k}/{n} rows ({100 * k / n:.0f}%)" if n else "no rows"


def agreement_line(table: dict) -> str:
    s = table["summary"]
    return (f"Direction agrees with the paper: dev PPL {_fraction(s['ppl'])}, dev BLEU {_fraction(s['bleu'])}, "
            f"both {_fraction(s['both'])}.")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not recorded"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def headline_lines(table: dict) -> list[str]:
    """The facts a reader wants first, one per line (``ltfm report`` prints them too)."""
    s, info, std = table["summary"], table["run_info"], table["base_std"]
    lines = [agreement_line(table)]
    if std["ppl"] is None and std["bleu"] is None:
        lines.append(f"Beyond seed noise: unknown, the base row has {table['base_seeds']} completed seed(s); "
                     "seed noise needs at least 2 (in the sweep file: `base: {seeds: [1, 2, 3]}`).")
    else:
        beyond = {m: s[f"{m}_noise"]["beyond"] for m in ("ppl", "bleu")}
        compared = {m: sum(s[f"{m}_noise"].values()) for m in ("ppl", "bleu")}
        lines.append(f"Rows beyond seed noise: dev PPL {beyond['ppl']}/{compared['ppl']}, dev BLEU "
                     f"{beyond['bleu']}/{compared['bleu']} (|Δ| > {NOISE_K:g} × the base's seed std: PPL "
                     f"{fmt(std['ppl'], 2) or '?'}, BLEU {fmt(std['bleu'], 2) or '?'}, over {table['base_seeds']} seeds).")
        lines.append(f"Direction agrees with the paper on the rows beyond noise: dev PPL {_fraction(s['ppl_beyond'])}, "
                     f"dev BLEU {_fraction(s['bleu_beyond'])}.")
    lines.append(f"Sweep: {info['runs']} completed run(s) of {info['records']}; wall time "
                 f"{_duration(info['wall_s'])} (first start to last end), training time summed over runs "
                 f"{_duration(info['train_s'])}.")
    lines.append("Machine: " + ("; ".join(info["machines"]) if info["machines"] else "not recorded") + ".")
    return lines


def headline_markdown(table: dict) -> str:
    seeds = table["seeds"]
    own = table.get("own_seeds") or {}
    sweep_seeds = table.get("sweep_seeds", seeds)
    seed_text = (f"seed{'s' if len(sweep_seeds) > 1 else ''} {', '.join(map(str, sweep_seeds))}"
                 + "".join(f"; {v} at seeds {', '.join(map(str, s))}" for v, s in own.items()))
    head = [f"# Table 3 replica: sweep `{table['sweep']}`", "",
            f"Base experiment `{table['experiment']}`; {seed_text}. Paper = Vaswani et al. (2017), Table 3 (newstest2013). Absolute values "
            "are not comparable across corpora, model sizes and BLEU tokenizations: compare the directions of "
            "change and their relative sizes.", ""]
    return "\n".join(head + [f"- {ln}" for ln in headline_lines(table)]) + "\n"


def ppl_markdown(table: dict) -> str:
    lines = ["## Dev perplexity", "",
             "Ours " + ("(mean ± std over the completed seeds) " if _several_seeds(table) else "")
             + "beside the paper's; Δ = change against the same side's base row, with its size relative to that "
               "base; \"agrees\" = our change has the paper's sign; \"beyond noise\": " + NOISE_RULE + ".", ""]
    return "\n".join(lines + _md_table(table, PPL_COLUMNS, ppl_cells, left=("PPL agrees", "PPL beyond noise"))) + "\n"


def bleu_markdown(table: dict) -> str:
    lines = ["## Dev BLEU", "",
             "As the perplexity table. \"paired bootstrap\": sacreBLEU's paired bootstrap resampling of the row's dev "
             "hypotheses against the base's (p-value, and how many sentences the two outputs differ in); it "
             "measures test-set sampling noise only, not the variation between training seeds. "
             f"\\* = p < {SIGNIFICANCE} on outputs that differ"
             + (", and beyond seed noise" if _several_seeds(table) else "") + "; identical outputs or equal BLEU "
             f"are never significant, nor are two outputs that both score below {BLEU_FLOOR:g} BLEU (no 4-gram to speak "
             "of: the score is set by smoothing).", ""]
    return "\n".join(lines + _md_table(table, BLEU_COLUMNS, bleu_cells,
                                       left=("BLEU agrees", "BLEU beyond noise", "paired bootstrap"))) + "\n"


def _several_seeds(table: dict) -> bool:
    return any((r["seeds_total"] or 0) > 1 for r in table["rows"])


def learning_curves(data: ReportData, variants: list[str]) -> dict:
    """Each row's dev perplexity at each validation step, the mean over its completed seeds (a step every seed
    logged): ``{"steps": [...], "rows": {variant: {step: ppl}}}``. At a short budget, whether the rows are
    still converging (and whether their order holds) is part of what the table says."""
    rows: dict[str, dict[int, float]] = {}
    for v in variants:
        series = [{int(h["step"]): h[R.DEV_PPL] for h in r.history if h.get(R.DEV_PPL) is not None}
                  for r in data.records if r.variant == v and r.completed]
        series = [s for s in series if s]
        if not series:
            continue
        common = set.intersection(*(set(s) for s in series))
        rows[v] = {st: sum(s[st] for s in series) / len(series) for st in sorted(common)}
    base_steps = sorted(rows.get("base", {}))
    steps = base_steps or sorted(set().union(*(set(r) for r in rows.values()))) if rows else []
    return {"steps": steps, "rows": rows}


def curves_markdown(table: dict) -> str:
    """Dev perplexity at each of the base's validation steps, per row (rows with more steps, such as big's
    3x budget, add their final value in the last column)."""
    curves = table.get("curves") or {"steps": [], "rows": {}}
    steps, rows = curves["steps"], curves["rows"]
    lines = ["## Learning curves", "",
             "Dev perplexity at each validation (mean over the completed seeds), the base's steps as columns; "
             "\"final\" is the row's last validation (big trains 3x the steps).", ""]
    if not steps or not rows:
        return "\n".join(lines + ["No validation history to show."]) + "\n"
    head = ["row", *[f"step {st}" for st in steps], "final"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["--:"] * (len(head) - 1)) + "|"]
    for v, series in rows.items():
        last = max(series)
        cells = [v] + [f"{series[st]:.1f}" if st in series else "" for st in steps] + [f"{series[last]:.1f} (step {last})"]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def config_markdown(table: dict) -> str:
    lines = ["## Configuration", "", "Each row's Table 3 knobs (ours), its parameter count beside the paper's, and "
             "its status; missing, failed, skipped and pruned rows keep their row.", ""]
    return "\n".join(lines + _md_table(table, CONFIG_COLUMNS, config_cells, left=("positional", "norm", "status"))) + "\n"


def notes_markdown(table: dict) -> str:
    s = table["summary"]
    lines = []
    if not table["has_base"]:
        lines.append("No completed base row: no change against the base can be computed.")
    if s["not_compared"]:
        lines.append("Not compared (no completed run): "
                     + ", ".join(f"{v} ({st.split()[0].rstrip(':;')})" for v, st in s["not_compared"]) + ".")
    if table["test_signature"]:
        lines.append(f"Paired bootstrap: sacreBLEU `{table['test_signature']}`.")
    for sig in table["bleu_signatures"]:
        lines.append(f"Our dev BLEU: sacreBLEU `{sig}`.")
    lines.append(f"Source: {table['source']}.")
    lines += table["notes"] + table["data_notes"]
    return "\n".join(["## Notes", "", *[f"- {ln}" for ln in lines]]) + "\n"


def table_markdown(table: dict) -> str:
    """table3.md: the headline, the PPL table, the BLEU table, the learning curves, the configuration table, notes (what the HTML
    shows, in the same order); one fact per line, so it diffs well in the repository."""
    return "\n".join(part(table) for part in (headline_markdown, ppl_markdown, bleu_markdown, curves_markdown,
                                              config_markdown, notes_markdown))


CSV_COLUMNS = ("variant", "family", "in_paper", *CSV_KNOBS.values(), "seeds_completed", "seeds_total",
               "dev_ppl", "dev_ppl_std", "paper_dev_ppl", "delta_ppl", "paper_delta_ppl", "delta_ppl_rel",
               "paper_delta_ppl_rel", "ppl_agrees", "ppl_noise",
               "dev_bleu", "dev_bleu_std", "paper_dev_bleu", "delta_bleu", "paper_delta_bleu", "delta_bleu_rel",
               "paper_delta_bleu_rel", "bleu_agrees", "bleu_noise", "bleu_tested", "bleu_p_value", "bleu_differing",
               "bleu_sentences", "bleu_significant", "params", "paper_params_m", "status")


def table_csv(table: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for row in table["rows"]:
        out = []
        for col in CSV_COLUMNS:
            value = row[{v: k for k, v in CSV_KNOBS.items()}.get(col, col)]
            if isinstance(value, float):
                value = f"{value:.6g}"
            out.append("" if value is None else value)
        w.writerow(out)
    return buf.getvalue()


def write_table(table: dict, out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return (write_text(out / "table3.md", table_markdown(table)), write_text(out / "table3.csv", table_csv(table)))

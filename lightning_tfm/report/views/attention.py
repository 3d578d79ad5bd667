"""Attention you can look at: a finished run's cross-attention alignments (Bahdanau et al., 2014, Figure 3) and the
positional encodings (Vaswani et al., 2017, Sec. 3.5; Table 3 row E), for the report notebooks.

* :func:`alignment_figure` loads a run of any architecture that gives its attention (its class's ``ATTENTION``) through
  :func:`~lightning_tfm.training.runs.checkpoints.load_model`, decodes the first few dev sentences with the run's own
  ``decode.*`` settings (beam search, or greedy at beam 1: :func:`~lightning_tfm.training.decode.translate_ids`),
  feeds each hypothesis back teacher-forced with ``features(src, tgt_in, need_attention=True)`` and draws the
  weights: output position i (the piece generated there, EOS last) against the source pieces (EOS last), one image
  per sentence, source on the x axis and output on the y axis, as Bahdanau's Figure 3, titled by what the class
  says they are (the RNN's additive attention's alpha_ij; the Transformer's last decoder layer's encoder-decoder
  attention, the mean over heads), plus, for a class whose ``ATTENTION_HEADS`` says so, a grid of every head for
  the first sentence (a second file).
* :func:`report_alignment_figure` is what a Table 2 report calls: one dev sentence's alignment of each
  architecture's row side by side (the Transformer's mean over heads beside the RNN's alpha_ij), each from the
  row's run folder in the results folder; a row without one (a report read from W&B or an export has no
  checkpoints) is a panel saying so in one line, and the report never fails on it.
* :func:`positional_figure`: the sinusoids as a position x dimension heat map and their position-similarity matrix
  (cosine similarity between the encodings of two positions: for sinusoids it depends on the offset alone), and,
  for a run with ``model.positional: learned``, the learned embeddings' similarity matrix beside it.
  :func:`report_positional_figure` is what a Table 3 report calls: row E's run when the report's records have a
  run folder here, else the sinusoids alone, and it never fails the report.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.plots import new_figure, save_figure

SENTENCES = 3   # dev sentences an alignment figure shows by default
POSITIONS = 64  # positions the positional figure shows by default (Multi30k sentences are shorter)
EOS_PIECE = "</s>"


@dataclass
class Alignment:
    """One sentence's cross-attention: ``weights[h][i][j]`` is head h's weight of source piece j when output piece i
    was predicted (one head for the RNN); each row sums to 1 over the source."""

    source: list[str]     # the source's BPE pieces, EOS last (the x axis)
    output: list[str]     # the hypothesis' BPE pieces, EOS last (the y axis)
    weights: Any          # a float tensor (heads, len(output), len(source))
    text: str             # the source sentence

    @property
    def mean(self):
        """The mean over heads, (len(output), len(source))."""
        return self.weights.mean(0)


def _dev_sentences(cfg, n: int) -> list[str]:
    from ...training.data.data import load_split

    if not cfg.data.dev_split:
        from ...base.errors import UserError
        raise UserError("the run's config names no dev split (data.dev_split): pass the sentences to draw instead")
    return list(load_split(cfg, cfg.data.dev_split, limit=n)["src"])


def _checkpoint_of(run_dir: Path) -> str:
    """The checkpoint the run's BLEU belongs to: the averaged one when ``ltfm train`` wrote it, else the last."""
    return "average" if (run_dir / "checkpoints" / "average.ckpt").is_file() else "last"


def alignments(run_dir: str | Path, sentences: int | list[str] = SENTENCES, checkpoint: str | None = None
               ) -> tuple[list[Alignment], dict]:
    """The run's alignments of ``sentences`` (a count: the first of its dev split; or the source lines themselves)
    and what the figure's title says: {"arch", "decode", "checkpoint", "run"}. ``checkpoint``: as ``ltfm evaluate
    --checkpoint`` (None: ``average`` when written, else ``last``). A run whose architecture gives no attention
    weights, or no sentence to draw, is a :class:`~lightning_tfm.base.errors.UserError`."""
    import torch

    from ...base.errors import UserError
    from ...model import BOS, EOS, registry
    from ...training.data.data import encode_lines
    from ...training.decode import translate_ids
    from ...training.runs.checkpoints import load_model

    run_dir = Path(run_dir)
    checkpoint = checkpoint or _checkpoint_of(run_dir)
    model, cfg, tokenizer = load_model(run_dir, checkpoint)
    if type(model).ATTENTION is None:
        drawn = ", ".join(name for name, a in registry.ARCHITECTURES.items() if a.cls.ATTENTION is not None)
        raise UserError(f"{run_dir}: architecture {cfg.model.arch!r} does not give its attention weights "
                        f"(its class declares no ATTENTION); alignments are drawn for runs of {drawn}")
    lines = _dev_sentences(cfg, sentences) if isinstance(sentences, int) else list(sentences)
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise UserError(f"no sentence to draw the alignments of {run_dir}: give at least one non-empty line")
    d = cfg.decode
    ids = [x[:model.max_positions - 1] for x in encode_lines(tokenizer, lines)]
    hyps = translate_ids(model, ids, beam_size=d.beam_size, alpha=d.length_penalty, max_len_a=d.max_len_a,
                         max_len_b=d.max_len_b, dtype=None)
    piece = tokenizer.id_to_token
    out = []
    with torch.no_grad():
        for line, src_ids, hyp in zip(lines, ids, hyps):
            src = torch.tensor([src_ids + [EOS]])
            tgt_in = torch.tensor([[BOS] + hyp.tokens])
            _, alpha = model.features(src, tgt_in, need_attention=True)
            alpha = alpha[0].float()
            heads = alpha if alpha.dim() == 3 else alpha.unsqueeze(0)  # the RNN's (T, S): one head
            out.append(Alignment([piece(i) for i in src_ids] + [EOS_PIECE],
                                 [piece(i) for i in hyp.tokens] + [EOS_PIECE], heads, line))
    decode = "greedy" if d.beam_size == 1 else f"beam {d.beam_size}"
    return out, {"arch": cfg.model.arch, "decode": decode, "checkpoint": checkpoint, "run": run_dir.name,
                 "attention": type(model).ATTENTION, "heads": type(model).ATTENTION_HEADS}


def _draw(ax, weights, source: list[str], output: list[str], vmax: float, fontsize: float = 8,
          labels: tuple = (True, True)):
    """One alignment image, white 0 to black ``vmax``, the source's pieces along the top, the output's down the
    side."""
    image = ax.imshow(weights.numpy(), cmap="Greys", vmin=0.0, vmax=vmax, aspect="equal", interpolation="nearest")
    ax.xaxis.tick_top()
    ax.set_xticks(range(len(source)), source if labels[0] else [""] * len(source), rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(output)), output if labels[1] else [""] * len(output), fontsize=fontsize)
    ax.tick_params(length=0)
    return image


def _title(meta: dict) -> str:
    return f"{meta['run']} ({meta['arch']}, {meta['decode']}, {meta['checkpoint']} checkpoint)\n{meta['attention']}"


def _top(weights) -> float:
    """The gray scale's black: the largest weight drawn (a small model's attention is too flat to see on 0-1)."""
    return max(float(weights.max()), 1e-6)


def plot_alignments(aligns: list[Alignment], title: str):
    """The figure of :func:`alignment_figure`: one image per sentence (the mean over heads), stacked, each on a gray
    scale from 0 (white) to its largest weight (black), its colour bar beside it."""
    from matplotlib.figure import Figure

    cell = 0.24  # inches a piece
    widths = [len(a.source) for a in aligns]
    heights = [len(a.output) for a in aligns]
    fig = Figure(figsize=(max(6.0, cell * max(widths) + 2.5), cell * sum(heights) + 2.2 * len(aligns) + 0.6), dpi=100,
                 layout="constrained")
    fig.suptitle(title, fontsize=9)
    subfigs = fig.subfigures(len(aligns), 1, height_ratios=[h + 8 for h in heights], squeeze=False)[:, 0]
    for k, (sub, a) in enumerate(zip(subfigs, aligns)):
        ax = sub.subplots()
        image = _draw(ax, a.mean, a.source, a.output, _top(a.mean))
        ax.set_xlabel(f"sentence {k + 1}: source", fontsize=8)
        ax.set_ylabel("output", fontsize=8)
        sub.colorbar(image, ax=ax, shrink=0.6, aspect=15).ax.tick_params(labelsize=7)
    return fig


def plot_heads(a: Alignment, title: str):
    """Every head of one sentence's alignment, a grid of up to four columns on one gray scale (0 to the largest
    weight of any head)."""
    h = len(a.weights)
    cols = min(h, 4)
    rows = math.ceil(h / cols)
    cell = 0.18
    fig, axes = new_figure(rows, cols, max(6.0, cols * (cell * len(a.source) + 1.4)),
                           rows * (cell * len(a.output) + 1.3) + 0.6)
    fig.suptitle(title, fontsize=9)
    for k, ax in enumerate(axes.flat):
        if k >= h:
            ax.set_visible(False)
            continue
        image = _draw(ax, a.weights[k], a.source, a.output, _top(a.weights), fontsize=6,
                      labels=(True, k % cols == 0))
        ax.set_xlabel(f"head {k + 1}", fontsize=8)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, aspect=15).ax.tick_params(labelsize=7)
    return fig


def alignment_figure(run_dir: str | Path, sentences: int | list[str] = SENTENCES, path: str | Path = "alignment.png",
                     formats=("png",), checkpoint: str | None = None) -> list[str]:
    """Draw a finished run's cross-attention for a few sentences (:func:`alignments`) as ``path`` (PNG, and each
    other of ``formats`` beside it: :func:`~lightning_tfm.report.core.plots.save_figure`); for a Transformer also every
    head of the first sentence as ``<path stem>_heads.png``. Returns the PNGs written, the mean first: a notebook
    shows them with ``for png in alignment_figure(...): display(Image(filename=png))``."""
    aligns, meta = alignments(run_dir, sentences, checkpoint)
    path = Path(path)
    written = [save_figure(plot_alignments(aligns, _title(meta)), path, formats)]
    if meta["heads"] and len(aligns[0].weights) > 1:
        title = f"{meta['run']}: each head of the last decoder layer's encoder-decoder attention, sentence 1"
        written.append(save_figure(plot_heads(aligns[0], title), heads_path(path), formats))
    return written


def checkpoint_run(data, records) -> tuple[str | None, str]:
    """(a run folder here, with checkpoints, of the first completed record of ``records``, by seed; or None and why
    there is none) in a report's :class:`~.records.ReportData`. A report read from an export or
    from W&B has no run folder to load."""
    source = str(data.source)
    if source.startswith(("export", "W&B")):
        return None, f"needs the results folder (the run folders' checkpoints); this report read {source}"
    for r in sorted((r for r in records if r.completed), key=lambda r: (r.seed is None, r.seed or 0)):
        if r.run and (Path(r.run) / "checkpoints").is_dir():
            return str(r.run), ""
    return None, "needs a run folder with checkpoints in the results folder: no completed run of it has one here"


def _failure(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else repr(e)


def heads_path(path: str | Path) -> Path:
    """Where an alignment figure at ``path`` puts its heads' grid: ``<path stem>_heads.png`` beside it."""
    path = Path(path)
    return path.with_name(f"{path.stem}_heads.png")


def report_alignment_figure(data, rows: list, path: str | Path, formats=("png",),
                            sentences: int = SENTENCES) -> tuple[str, str]:
    """A Table 2 report's alignment figure and its caption (markdown): for each architecture of ``rows`` (the
    table's rows in order, :class:`~lightning_tfm.report.table2.columns.Row`: its ``variant`` and ``arch``) the
    first row whose run folder loads, the cross-attention of its first ``sentences`` dev sentences
    (:func:`alignments`: the mean over heads for the Transformer), a column per architecture and a row per sentence;
    a row that cannot be drawn is a panel saying why
    (:func:`checkpoint_run`). The Transformer's heads of the first sentence go to ``<path stem>_heads.png``
    (:func:`plot_heads`) when it has more than one. Never raises for a run."""
    by_arch: dict[str, list] = {}
    for row in rows:
        by_arch.setdefault(row.arch, []).append(row)
    panels = []  # (row, [Alignment] | None, meta | None, why)
    for arch_rows in by_arch.values():
        first = None
        for row in arch_rows:
            run, why = checkpoint_run(data, [r for r in data.records if r.variant == row.variant])
            if run is not None:
                try:
                    aligns, meta = alignments(run, sentences)
                    panels.append((row, aligns, meta, ""))
                    break
                except Exception as e:  # noqa: BLE001 - a damaged or foreign run folder: the panel says why
                    why = f"its run {Path(run).name} could not be loaded ({_failure(e)})"
            first = first or (row, None, None, why)
        else:
            panels.append(first)
    n = max([len(a) for _, a, _, _ in panels if a] or [1])
    cell = 0.24
    widths = [max(4.0, cell * max(len(x.source) for x in a) + 2.0) if a else 4.0 for _, a, _, _ in panels]
    heights = [max([cell * len(a[k].output) + 1.2 for _, a, _, _ in panels if a and k < len(a)] or [3.0])
               for k in range(n)]
    fig, axes = new_figure(n, len(panels), sum(widths), sum(heights) + 1.4)
    for col, (panel_width, (row, aligns, meta, why)) in enumerate(zip(widths, panels)):
        for k in range(n):
            ax = axes[k][col]
            if aligns is None or k >= len(aligns):
                ax.axis("off")
                if k == 0:
                    ax.text(0.5, 0.5, f"{row.variant} ({row.arch}): not drawn:\n{why}", ha="center",
                            va="center", wrap=True, fontsize=8, transform=ax.transAxes)
                continue
            a = aligns[k]
            image = _draw(ax, a.mean, a.source, a.output, _top(a.mean))
            if k == 0:
                # wrapped to the panel (~11 characters an inch at 8 pt, the colour bar beside): a run name and its
                # decoding do not fit on one line of a narrow panel, and a longer line is cut at the figure's edge
                title = f"row {row.variant}: {_title(meta)}".split("\n")
                ax.set_title("\n".join(w for line in title for w in textwrap.wrap(line, int(panel_width * 11))),
                             fontsize=8)
            ax.set_xlabel(f"dev sentence {k + 1}: source", fontsize=8)
            ax.set_ylabel("output", fontsize=8)
            fig.colorbar(image, ax=ax, shrink=0.6, aspect=15).ax.tick_params(labelsize=7)
    fig.suptitle(f"Cross-attention of the first {n} dev sentence(s), each architecture's (Bahdanau et al., 2014, "
                 "Figure 3)", fontsize=9)
    png = save_figure(fig, path, formats)
    path = Path(path)
    heads = [(row, a[0], meta) for row, a, meta, _ in panels if a and meta["heads"] and len(a[0].weights) > 1]
    if heads:
        row, a, meta = heads[0]
        title = f"row {row.variant}, run {meta['run']}: each head of the last decoder layer's encoder-decoder " \
                "attention, dev sentence 1"
        save_figure(plot_heads(a, title), heads_path(path), formats)
    drawn = [f"{row.variant} ({meta['arch']}, run {meta['run']}, {meta['decode']})"
             for row, a, meta, _ in panels if a is not None]
    missing = [f"{row.variant} ({row.arch}) not drawn: {why}" for row, a, _, why in panels if a is None]
    reasons = {why for _, a, _, why in panels if a is None}
    if not drawn and len(reasons) == 1:  # one line: the report read no run folder (W&B), or none is here
        return png, f"Cross-attention of the first dev sentences per architecture: not drawn, {reasons.pop()}."
    caption = (f"Cross-attention of the first {n} dev sentence(s), one per row: output BPE pieces down, source pieces "
               "along the top (EOS last), each panel on a gray scale from 0 to its largest weight; the Transformer's "
               "last decoder layer, mean over heads, the RNN's additive attention"
               + (f": {'; '.join(drawn)}" if drawn else "") + "." + "".join(f" {m}." for m in missing)
               + (f" Each head of the Transformer's first sentence: `{heads_path(path).name}`." if heads else ""))
    return png, caption


# --------------------------------------------------------------------------------------------- positions
def cosine_similarity(table):
    """(P, d) position vectors -> (P, P) cosine similarity of every two positions."""
    import torch

    unit = torch.nn.functional.normalize(table.double(), dim=-1)
    return (unit @ unit.T).float()


def learned_positions(run_dir: str | Path, checkpoint: str | None = None):
    """(d_model, the learned position table (max_positions, d_model) or None for sinusoids) of a Transformer run."""
    from ...base.errors import UserError
    from ...model import LearnedPositions
    from ...training.runs.checkpoints import load_model

    run_dir = Path(run_dir)
    model, cfg, _ = load_model(run_dir, checkpoint or _checkpoint_of(run_dir))
    positions = getattr(model, "positions", None)
    if positions is None:
        raise UserError(f"{run_dir} is a {cfg.model.arch!r} run: it has no positional encodings (give a transformer "
                        f"run)")
    table = positions.table.weight.detach() if isinstance(positions, LearnedPositions) else None
    return cfg.model.d_model, table


def positional_figure(run_dir: str | Path | None, path: str | Path, formats=("png",), positions: int = POSITIONS,
                      d_model: int = 512, checkpoint: str | None = None) -> str:
    """The sinusoids of Sec. 3.5 for the first ``positions`` positions: a position x dimension heat map and their
    cosine-similarity matrix; with a Transformer run (``run_dir``), at its d_model, and if it learned its positions
    (``model.positional: learned``, Table 3 row E) their cosine-similarity matrix beside the sinusoids'. Without a
    run, at ``d_model`` (the paper's 512 by default). Returns the PNG written."""
    from matplotlib.ticker import MaxNLocator

    from ...model import sinusoid_table

    learned = None
    if run_dir is not None:
        d_model, learned = learned_positions(run_dir, checkpoint)
    n = positions if learned is None else min(positions, learned.shape[0])
    sines = sinusoid_table(n, d_model)
    panels = 2 if learned is None else 3
    fig, axes = new_figure(1, panels, 4.6 * panels, 4.4)
    ax = axes[0][0]
    image = ax.imshow(sines.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set(title=f"sinusoids PE(pos, i), d_model={d_model}", xlabel="dimension i", ylabel="position")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=ax, shrink=0.8)
    sims = [("sinusoids: cosine similarity of positions", cosine_similarity(sines))]
    if learned is not None:
        sims.append((f"learned (row E, {Path(run_dir).name}): cosine similarity", cosine_similarity(learned[:n])))
    for ax, (title, sim) in zip(axes[0][1:], sims):
        image = ax.imshow(sim.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="equal", interpolation="nearest")
        ax.set(title=title, xlabel="position", ylabel="position")
        ax.title.set_fontsize(9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    return save_figure(fig, path, formats)


def learned_position_run(data) -> tuple[str | None, int | None, str]:
    """(a run folder here of a completed run with ``model.positional: learned``, or None; the d_model of that row,
    else of the base row, else the commonest of the report's runs, or None; why there is no run folder) from a
    report's :class:`~.records.ReportData`. A report built from an export has no run folder to
    load, nor one built from W&B (its records name W&B runs)."""
    learned = [r for r in data.records if r.config.get("model.positional") == "learned"]
    base = [r for r in data.records if r.variant == "base"]
    d_models = [r.config.get("model.d_model") for r in learned + base + list(data.records)]
    d_models = [int(d) for d in d_models if d]
    d_model = d_models[0] if d_models else None
    if str(data.source).startswith("export"):
        return None, d_model, "a report rebuilt from an export has no run folder to load the learned positions from"
    for r in learned:
        if r.completed and r.run and (Path(r.run) / "checkpoints").is_dir():
            return str(r.run), d_model, ""
    return None, d_model, "the report's records have no run folder here of a run with learned positions (row E)"


def report_positional_figure(data, path: str | Path, formats=("png",)) -> tuple[str, str]:
    """A report's positional figure and its caption (markdown): :func:`positional_figure` of the learned-positions
    run of :func:`learned_position_run` when there is one, else (or when it cannot be loaded, said in the caption)
    of the sinusoids alone at the report's d_model. Never raises for the run: a report is not failed by it."""
    run, d_model, why = learned_position_run(data)
    d_model = d_model or 512
    if run is not None:
        try:
            png = positional_figure(run, path, formats)
            return png, (f"Positional encodings: the sinusoids (Sec. 3.5) and the learned position embeddings of "
                         f"{Path(run).name} (row E), as cosine similarity between positions.")
        except Exception as e:  # noqa: BLE001 - a damaged or foreign run folder leaves the sinusoids alone
            why = f"row E's run {Path(run).name} could not be loaded ({str(e).splitlines()[0] if str(e) else e!r})"
    png = positional_figure(None, path, formats, d_model=d_model)
    return png, f"Positional encodings: the sinusoids (Sec. 3.5) at d_model {d_model} alone: {why}."

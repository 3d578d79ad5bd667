"""The Table 3 replica as LaTeX: ``table3.tex``, a booktabs table to ``\\input`` into a paper, and
``table3-standalone.tex``, which compiles it on its own (``pdflatex table3-standalone.tex`` in the report folder).

``table3.tex`` holds one ``table`` float (caption, ``\\label{tab:<sweep>}``) around a ``tabular`` with the paper's
columns (:data:`~.table3.columns.LATEX`, declared in :mod:`.table3.columns` beside the markdown views): the row, the
knobs N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls and train steps, then dev PPL, dev BLEU and the parameter count
(×10^6), each as ours beside the paper's under one header (``\\cmidrule``). As in the paper, a row other than the base
shows only the knobs that differ from the base's; a knob that is none of the paper's columns (positions, norm) is
named beside the row's name. The rows are in the table's order, a ``\\midrule`` between two row families; the numbers
are printed as ``table3.md`` prints them. The preamble needs ``\\usepackage{booktabs}``.

Every string (a row's name, the sweep's, a status) goes in through :func:`tex_text`: LaTeX's special characters
are escaped, so a name reads as itself and never runs as a command; brackets and ``*`` are braced (after ``\\\\``
or ``\\midrule`` a ``[2pt]`` would be read as an optional argument), dashes and quotes are kept from their
ligatures (``---`` prints three hyphens, not an em dash), and the output is ASCII: an accented Latin letter is
written with its accent command (``é``: ``\\'{e}``), any other character the default (OT1) fonts lack as a visible
``\\texttt{U+1F600}`` (an emoji or a CJK character would stop ``pdflatex``).
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from ...base.atomic import write_text
from ..table3.columns import LATEX, columns
from ..table3.table import Table3

TEX_FILE, STANDALONE_FILE = "table3.tex", "table3-standalone.tex"

# LaTeX's special characters, and the symbols of our own cells, as glyphs the default (OT1) fonts have: no text
# companion (TS1) font, which a basic TeX installation may lack as an outline font (\textdollar is one)
_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"$\mathdollar$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\~{}", "^": r"\^{}", "<": r"\textless{}", ">": r"\textgreater{}",
            "|": r"\textbar{}", "±": r"$\pm$", "×": r"$\times$", "Δ": r"$\Delta$", "σ": r"$\sigma$",
            "ε": r"$\epsilon$", "→": r"$\to$", "−": "-",
            # read as an optional argument after \\ or \midrule, or as \\*: braced, they print as themselves
            "[": "{[}", "]": "{]}", "*": "{*}",
            "`": "{`}",  # `` a quote, !` ?` inverted marks: ligatures broken by a group (and -- '' below)
            # letters OT1 has under a command of their own
            "ß": r"\ss{}", "æ": r"\ae{}", "Æ": r"\AE{}", "œ": r"\oe{}", "Œ": r"\OE{}", "ø": r"\o{}",
            "Ø": r"\O{}", "ł": r"\l{}", "Ł": r"\L{}", "ı": r"\i{}", "¡": "!{`}", "¿": "?{`}", "·": r"$\cdot$",
            "°": r"$^\circ$", "…": r"\ldots{}", "–": "-{}-{}", "—": "-{}-{}-{}", "“": "``", "”": "''",
            "‘": "`", "’": "'", "\u00a0": "~"}
# the combining accents OT1 sets over a letter: NFD's mark -> its accent command
_ACCENTS = {"\u0300": "`", "\u0301": "'", "\u0302": "^", "\u0303": "~", "\u0308": '"', "\u0304": "=",
            "\u0306": "u", "\u0307": ".", "\u030a": "r", "\u030b": "H", "\u030c": "v", "\u0327": "c"}
# a character whose ligature with the next one (-- an en dash, --- an em dash, '' a quote) is broken by a group
_LIGATURES = {"-": "-{}", "'": "'{}"}
_SPECIAL = re.compile("|".join(f"{re.escape(c)}(?={re.escape(c)})" for c in _LIGATURES) + "|"
                      + "|".join(map(re.escape, _ESCAPES)) + "|[^\x20-\x7e]")


def _char(c: str) -> str:
    """One character of :func:`tex_text`: its escape, a Latin letter with its accent commands, else a visible
    ``\texttt{U+XXXX}`` (nothing the default fonts lack reaches pdflatex)."""
    if c in _ESCAPES or c in _LIGATURES:  # a "-" or "'" is matched only before another
        return _ESCAPES.get(c) or _LIGATURES[c]
    base, *marks = unicodedata.normalize("NFD", c)
    if base.isascii() and base.isalpha() and marks and all(m in _ACCENTS for m in marks):
        out = r"\i" if base == "i" and marks else base
        for m in marks:
            out = rf"\{_ACCENTS[m]}{{{out}}}"
        return out
    return rf"\texttt{{U+{ord(c):04X}}}"


def tex_text(value) -> str:
    """``value`` as LaTeX text that prints as itself, on one line, in ASCII (the module docstring)."""
    return _SPECIAL.sub(lambda m: _char(m.group()), " ".join(str(value).split()))


def _label(sweep: str) -> str:
    return "tab:" + re.sub(r"[^A-Za-z0-9.:-]+", "-", sweep)


def _header(shown) -> list[str]:
    """The two header lines: the groups (``\\multicolumn`` over their columns, a ``\\cmidrule`` under each), the
    columns' own titles."""
    spans: list[tuple[str, int, int]] = []  # (group, first column, last column), 1-based
    for i, s in enumerate(shown, 1):
        if s.group and spans and spans[-1][0] == s.group and spans[-1][2] == i - 1:
            spans[-1] = (s.group, spans[-1][1], i)
        elif s.group:
            spans.append((s.group, i, i))
    if not spans:
        return [" & ".join(s.title for s in shown) + r" \\"]
    cells, at = [], 1
    for group, first, last in spans:
        cells += [""] * (first - at) + [rf"\multicolumn{{{last - first + 1}}}{{c}}{{{group}}}"]
        at = last + 1
    cells += [""] * (len(shown) + 1 - at)
    rules = " ".join(rf"\cmidrule(lr){{{first}-{last}}}" for _, first, last in spans)
    return [" & ".join(cells) + r" \\", rules, " & ".join(s.title for s in shown) + r" \\"]


def _caption(table: Table3) -> str:
    several = any((r.seeds_total or 0) > 1 for r in table.rows)
    parts = []
    if table.pipeline_check:
        parts.append("Pipeline check, not a result (runs tagged pipeline-check): its numbers say nothing about the "
                     "paper's claims.")
    parts.append(rf"Table~3 replica, sweep \texttt{{{tex_text(table.sweep)}}} (base experiment "
                 rf"\texttt{{{tex_text(table.experiment)}}}), ours beside Vaswani et al.\ (2017), Table~3 "
                 "(newstest2013). Dev perplexity and BLEU"
                 + (r", ours the mean $\pm$ standard deviation over the completed seeds" if several else "")
                 + "; a blank knob is the base row's. Absolute values are not comparable across corpora, model "
                 "sizes and BLEU tokenizations: compare the directions of change and their relative sizes.")
    missing = [r for r in table.rows if not r.seeds_completed]
    if missing:
        what = [(r.variant, (r.status.split() or ["unknown"])[0].rstrip(":;")) for r in missing]
        parts.append("No completed run: " + ", ".join(f"{tex_text(v)} ({tex_text(s)})" for v, s in what) + ".")
    return " ".join(parts)


def table_latex(table: Table3) -> str:
    """table3.tex of ``table`` (:func:`~lightning_tfm.report.table3.table.build_table`)."""
    cols = columns(LATEX)
    shown = [c.latex for c in cols]
    lines = [f"% {TEX_FILE}: the Table 3 replica of sweep {' '.join(str(table.sweep).split())}, written by "
             "`ltfm report` (booktabs).",
             rf"% In a paper: \usepackage{{booktabs}} in the preamble, then \input{{{Path(TEX_FILE).stem}}} "
             f"({len(shown)} columns: a full-width table* or a landscape page).",
             f"% On its own: pdflatex {STANDALONE_FILE} (in this folder).",
             r"\begin{table}[htbp]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             rf"\caption{{{_caption(table)}}}", rf"\label{{{_label(table.sweep)}}}",
             r"\begin{tabular}{" + "".join("l" if s.left else "r" for s in shown) + "}", r"\toprule",
             *_header(shown), r"\midrule"]
    previous = None
    for i, row in enumerate(table.rows):
        if i and row.family != previous:
            lines.append(r"\midrule")
        previous = row.family
        lines.append(" & ".join(tex_text(s.cell(row, table)) for s in shown) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def standalone_latex() -> str:
    """table3-standalone.tex: an article of one landscape page that inputs table3.tex."""
    return "\n".join([
        f"% {STANDALONE_FILE}: {TEX_FILE} on a page of its own; compile in this folder: pdflatex {STANDALONE_FILE}",
        r"\documentclass{article}", r"\usepackage[utf8]{inputenc}", r"\usepackage{booktabs}",
        r"\usepackage[landscape,margin=1.5cm]{geometry}", r"\pagestyle{empty}", r"\begin{document}",
        rf"\input{{{Path(TEX_FILE).stem}}}", r"\end{document}"]) + "\n"


def write_latex(table: Table3, out_dir: str | Path) -> tuple[Path, Path]:
    """``table3.tex`` and ``table3-standalone.tex`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_text(out / TEX_FILE, table_latex(table)), write_text(out / STANDALONE_FILE, standalone_latex())

"""table3.tex (lightning_tfm/report/views/latex.py): the Table 3 replica as a booktabs table, the paper's columns with
ours beside the paper's, built from the committed CPU reference's export (no training); every string escaped; it
compiles with pdflatex where TeX is installed (Debian: texlive-latex-base and texlive-latex-recommended)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lightning_tfm import report as rd
from lightning_tfm.report.table3.columns import LATEX, columns
from lightning_tfm.report.views.latex import STANDALONE_FILE, TEX_FILE, table_latex, tex_text, write_latex
from lightning_tfm.report.views.render import write_table
from lightning_tfm.sweep import load_sweep

from conftest import ROOT, write_sweep

SWEEP = ROOT / "sweeps" / "table3-cpu.yaml"
EXPORT = ROOT / "reports" / "reference" / "table3-cpu-2026-11-25" / "export"
CELL_SEP = re.compile(r"(?<!\\)&")
NASTY = r"x_1&{\textbf{bad}}%$#~^<|>"   # a name that would be markup, a comment and math if not escaped


@pytest.fixture(scope="module")
def table():
    return rd.build_table(rd.load_report_data(SWEEP, export_dir=EXPORT))


def body(tex: str) -> tuple[list[str], list[str]]:
    """(the header lines between \\toprule and the first \\midrule, the lines between it and \\bottomrule)."""
    lines = tex.splitlines()
    top, bottom = lines.index(r"\toprule"), lines.index(r"\bottomrule")
    first_mid = lines.index(r"\midrule", top)
    return lines[top + 1:first_mid], lines[first_mid + 1:bottom]


def cells(line: str) -> list[str]:
    assert line.endswith(r" \\"), line
    return [c.strip() for c in CELL_SEP.split(line[:-3])]


def md_cells(md: str, section: str) -> dict[str, dict[str, str]]:
    """row -> {header: cell} of the markdown table under ``## section`` of table3.md."""
    part = md.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in part.splitlines() if ln.startswith("| ")]
    return {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}


def test_the_paper_columns_ours_beside_the_papers_one_line_a_row_grouped_by_family(table):
    tex = table_latex(table)
    lines = tex.splitlines()
    assert lines.count(r"\toprule") == lines.count(r"\bottomrule") == 1
    assert r"\begin{tabular}{lrrrrrrrrrrrrrrrl}" in lines and r"\label{tab:table3-cpu}" in lines
    head, rows = body(tex)
    # two header lines: the groups over ours and the paper's (a \cmidrule under each), then the columns
    assert cells(head[0])[10:] == [r"\multicolumn{2}{c}{PPL (dev)}", r"\multicolumn{2}{c}{BLEU (dev)}",
                                   r"\multicolumn{2}{c}{params $\times 10^6$}", ""] and len(cells(head[0])) == 14
    assert head[1] == r"\cmidrule(lr){11-12} \cmidrule(lr){13-14} \cmidrule(lr){15-16}"
    assert cells(head[2]) == ["", "$N$", r"$d_{\mathrm{model}}$", r"$d_{\mathrm{ff}}$", "$h$", "$d_k$", "$d_v$",
                              r"$P_{\mathrm{drop}}$", r"$\epsilon_{\mathrm{ls}}$", "train steps",
                              "ours", "paper", "ours", "paper", "ours", "paper", "answer"]
    assert [c.latex.title for c in columns(LATEX)] == cells(head[2])  # the columns' one home: report/table3/columns.py
    # one line per row of the table, in its order, a \midrule between two families
    data = [ln for ln in rows if ln != r"\midrule"]
    assert len(data) == len(table.rows) == 21
    assert all(len(cells(ln)) == 17 for ln in data)
    assert [cells(ln)[16] for ln in data] == [r.answer or "" for r in table.rows]  # the base has none
    names = [cells(ln)[0].split(" (")[0] for ln in data]
    assert names == [r.variant for r in table.rows]
    families = [r.family for r in table.rows]
    changes = sum(a != b for a, b in zip(families, families[1:]))
    assert rows.count(r"\midrule") == changes == 7  # base | A | B | C | D | E | big | norm
    assert rows[rows.index(r"\midrule") + 1].startswith("A1 &")

    # the numbers as table3.md prints them; the knobs as the paper prints them (another row: what differs)
    md = rd.table_markdown(table)
    ppl, bleu, conf = (md_cells(md, s) for s in ("Dev perplexity", "Dev BLEU", "Configuration"))
    by = {name: cells(ln) for name, ln in zip(names, data)}
    for v, c in by.items():
        assert c[10:12] == [ppl[v]["dev PPL ours"].replace("±", r"$\pm$"), ppl[v]["dev PPL paper"]], v
        assert c[12:14] == [bleu[v]["dev BLEU ours"].replace("±", r"$\pm$"), bleu[v]["dev BLEU paper"]], v
        assert c[14:16] == [conf[v]["params ours (M)"], conf[v]["params paper (M)"]], v
    base = by["base"]
    assert base[1:10] == [conf["base"][k] for k in ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls",
                                                    "train steps")]
    assert base[10] == r"37.10 $\pm$ 1.93" and base[11] == "4.92"   # ours: mean ± std over the base's 3 seeds
    assert by["A1"][1:10] == ["", "", "", "1", "128", "128", "", "", ""]
    assert by["big"][1:10] == ["", "256", "1024", "8", "", "", "0.3", "", "1800"]
    # a knob that is none of the paper's columns is named beside the row, as the paper's row E says it
    assert cells(data[names.index("E")])[0] == "E (positional learned)"
    assert cells(data[names.index("prenorm")])[0] == "prenorm (norm pre)" and by["prenorm"][11] == ""
    caption = next(ln for ln in lines if ln.startswith(r"\caption{"))
    assert r"sweep \texttt{table3-cpu}" in caption and r"mean $\pm$ standard deviation" in caption
    assert "Pipeline check" not in tex and "No completed run" not in caption


def test_every_string_is_escaped_and_a_pipeline_check_says_so(tmp_path):
    assert tex_text(NASTY) == (r"x\_1\&\{\textbackslash{}textbf\{bad\}\}\%$\mathdollar$\#\~{}\^{}"
                               r"\textless{}\textbar{}\textgreater{}")
    assert tex_text("4.92 ± 0.03\nΔ") == r"4.92 $\pm$ 0.03 $\Delta$"
    table = nasty_table(tmp_path)
    tex = table_latex(table)
    _, rows = body(tex)
    line = next(ln for ln in rows if ln.startswith("x"))
    assert cells(line)[0] == tex_text(NASTY) and cells(line)[10] == "30.00"
    assert len(cells(line)) == 17  # its "&" is text, not a column
    caption = next(ln for ln in tex.splitlines() if ln.startswith(r"\caption{"))
    assert caption.startswith(r"\caption{Pipeline check, not a result")
    assert r"sweep \texttt{odd\_name\%1}" in caption
    assert r"No completed run: A1 (missing), \{x\}\_y (failed)." in caption
    assert not re.search(r"(?<!\\)%", tex.split(r"\begin{table}")[1])  # no % that would comment a line out


def nasty_table(tmp_path: Path) -> dict:
    sweep = load_sweep(write_sweep(tmp_path / "odd.yaml", "odd", {"base": {}, "A1": {}}))
    sweep.name = "odd_name%1"
    recs = [rd.RunRecord(variant="base", family="base", seed=1, status="completed", dev_ppl=20.0, dev_bleu=10.0,
                         params=10 ** 6),
            rd.RunRecord(variant=NASTY, family="weird", seed=1, status="completed", dev_ppl=30.0, dev_bleu=5.0),
            rd.RunRecord(variant="{x}_y", family="weird", seed=1, status="failed", note="50% & more")]
    table = rd.build_table(rd.ReportData(sweep, recs, "test", {}), bootstrap=False)
    table.pipeline_check = True
    return table


def test_write_table_writes_the_latex_beside_the_markdown(table, tmp_path):
    write_table(table, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"table3.md", "table3.csv", TEX_FILE, STANDALONE_FILE}
    assert (tmp_path / TEX_FILE).read_text() == table_latex(table)
    standalone = (tmp_path / STANDALONE_FILE).read_text()
    assert r"\usepackage{booktabs}" in standalone and r"\input{table3}" in standalone


def pdflatex(folder: Path) -> subprocess.CompletedProcess:
    if not shutil.which("pdflatex"):
        pytest.skip("pdflatex not installed (Debian texlive-latex-base)")
    if subprocess.run(["kpsewhich", "booktabs.sty"], capture_output=True, text=True).returncode != 0:
        pytest.skip("booktabs.sty not installed (Debian texlive-latex-recommended)")
    return subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", STANDALONE_FILE], cwd=folder,
                          capture_output=True, text=True, timeout=120)


#: Row names that were read as something else (#52, 12): an optional argument after \midrule or \\ ([2pt]), \\*,
#: an em dash, quote ligatures, and characters the default fonts lack (pdflatex stopped at an emoji or CJK).
ODD = ["[2pt]x", "*y", "a---b -- c", "``q''", "Zürich café ı", "emoji 😀 中文"]


def test_a_cell_prints_as_given_never_an_argument_a_dash_ligature_or_a_missing_glyph():
    assert tex_text("[2pt]x") == "{[}2pt{]}x" and tex_text("*y") == "{*}y"
    assert tex_text("a---b -- c") == "a-{}-{}-b -{}- c" and tex_text("-0.50 x-y") == "-0.50 x-y"
    assert tex_text("``q''") == "{`}{`}q'{}'"
    assert tex_text("Zürich café ı") == r"Z\"{u}rich caf\'{e} \i{}"
    assert tex_text("emoji 😀 中文") == r"emoji \texttt{U+1F600} \texttt{U+4E2D}\texttt{U+6587}"
    for name in ODD:
        assert tex_text(name).isascii()


def odd_table(tmp_path: Path) -> dict:
    """A table whose rows are named :data:`ODD`, each the first of its family (after a \\midrule) or after a \\."""
    sweep = load_sweep(write_sweep(tmp_path / "odd.yaml", "odd", {"base": {}, "A1": {}}))
    recs = [rd.RunRecord(variant="base", family="base", seed=1, status="completed", dev_ppl=20.0, dev_bleu=10.0)]
    recs += [rd.RunRecord(variant=name, family=f"f{i // 2}", seed=1, status="completed", dev_ppl=30.0 + i,
                          dev_bleu=5.0) for i, name in enumerate(ODD)]
    return rd.build_table(rd.ReportData(sweep, recs, "test", {}), bootstrap=False)


def test_odd_row_names_are_their_own_cells_after_a_midrule_or_a_line_end(tmp_path):
    tex = table_latex(odd_table(tmp_path))
    _, rows = body(tex)
    firsts = [cells(ln)[0] for ln in rows if ln != r"\midrule"]
    assert sorted(tex_text(n) for n in ODD) == sorted(f for f in firsts if f not in ("base", "A1"))
    assert tex.isascii() and "[2pt]" not in tex and "---" not in tex
    after = [rows[i + 1] for i, ln in enumerate(rows[:-1]) if ln == r"\midrule" or ln.endswith(r"\\")]
    assert not any(ln.startswith(("[", "*")) for ln in after)


@pytest.mark.parametrize("which", ["reference", "nasty", "odd"])
def test_it_compiles_on_its_own(which, table, tmp_path):
    write_latex({"reference": lambda: table, "nasty": lambda: nasty_table(tmp_path),
                 "odd": lambda: odd_table(tmp_path)}[which](), tmp_path / "out")
    p = pdflatex(tmp_path / "out")
    assert p.returncode == 0, p.stdout[-3000:]
    pdf = tmp_path / "out" / STANDALONE_FILE.replace(".tex", ".pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-" and "Output written" in p.stdout
    assert "Overfull" not in p.stdout  # the landscape page holds the whole table

"""The paper's tables (Vaswani et al., 2017) as package resources: Table 3's rows' numbers
(``lightning_tfm/resources/paper_table3.csv``, :func:`load_paper`) and its row order (:data:`PAPER_ORDER`); Table 2's
BLEU and training FLOPs (``lightning_tfm/resources/paper_table2.csv``, :func:`load_paper2`) and the rows the Table 2
report shows (:data:`PAPER2_SHOWN`)."""
from __future__ import annotations

import csv
import io
from importlib import resources

from ...training.config.config import SCHEMA, TABLE3_KNOBS

PAPER_ORDER = ("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
               "D1", "D2", "D3", "D4", "E", "big")


# Table 2's rows beside ours: the strongest single recurrent and convolutional systems, and the Transformer's two.
PAPER2_SHOWN = ("GNMT + RL", "ConvS2S", "Transformer (base model)", "Transformer (big)")


def _rows(name: str) -> list[dict]:
    text = resources.files("lightning_tfm").joinpath(f"resources/{name}").read_text()
    return list(csv.DictReader(io.StringIO(text)))


def load_paper2() -> dict[str, dict]:
    """The paper's Table 2 (lightning_tfm/resources/paper_table2.csv): model -> row, its BLEU (EN-DE, EN-FR) and
    training FLOPs (EN-DE, EN-FR) as floats, None where the paper gives none."""
    out = {}
    for row in _rows("paper_table2.csv"):
        out[row["model"]] = {**row, **{k: float(row[k]) if row[k] else None for k in
                                       ("bleu_en_de", "bleu_en_fr", "train_flops_en_de", "train_flops_en_fr")}}
    return out


def load_paper() -> dict[str, dict]:
    """The paper's Table 3 (lightning_tfm/resources/paper_table3.csv): name -> row with numbers parsed. Its knob
    columns are those of the Table 3 knobs it has (:data:`~lightning_tfm.training.config.config.TABLE3_KNOBS`' CSV
    names), each read as its config key's type."""
    out = {}
    for row in _rows("paper_table3.csv"):
        parsed = dict(row)
        for key in ("dev_ppl", "dev_bleu", "params_m"):
            parsed[key] = float(row[key]) if row[key] else None
        for knob in TABLE3_KNOBS:
            kind = SCHEMA[knob.key.split(".")[0]][knob.key.split(".")[1]][0]
            if knob.csv in row and kind in (int, float):
                parsed[knob.csv] = kind(row[knob.csv]) if row[knob.csv] else None
        out[row["name"]] = parsed
    return out

"""The paper's Table 3 (Vaswani et al., 2017): its rows' numbers, read from the package resource
``lightning_tfm/resources/paper_table3.csv`` (:func:`load_paper`), and its row order (:data:`PAPER_ORDER`)."""
from __future__ import annotations

import csv
import io
from importlib import resources


PAPER_ORDER = ("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
               "D1", "D2", "D3", "D4", "E", "big")


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

"""The report of a sweep: ``ltfm report SWEEP.yaml`` runs a notebook that calls this package.

One job per module; imports point one way (model <- training <- sweep <- report: this package reads the
sweep's trial configs and search space from :mod:`lightning_tfm.sweep`, the sweep never imports it):

- :mod:`.records`: a sweep's runs as :class:`RunRecord` lists: local run folders, the Optuna study, W&B;
- :mod:`.sources`: :func:`load_report_data`: the records of a sweep from its results, W&B or an export;
- :mod:`.budget`: a run read at its own sweep's budget when another sweep trained its folder on;
- :mod:`.paper`: the paper's Table 3 numbers (a package resource) and its row order;
- :mod:`.table`: the Table 3 replica beside the paper's (:func:`build_table`): rows, statuses, order, knobs,
  learning curves;
- :mod:`.stats`: the seed-noise rule, direction agreement, sacreBLEU's paired bootstrap, the dev references;
- :mod:`.verdict`: a row's verdict (holds, may flip, within noise, too few points) from its learning curve
  extrapolated;
- :mod:`.compute`: training FLOPs per step of a row and its dev PPL at the base's compute (equal-compute Δ);
- :mod:`.export`: the records a report is built from as one JSON file, and the report rebuilt from it;
- :mod:`.table2`: the paper's Table 2 at small scale (a sweep with a row of another architecture than the
  Transformer): each row's BLEU, FLOPs, time and parameters beside the paper's rows, and the claim checked at equal training FLOPs;
  :mod:`.table2_claims`, the claim's lines (a pair within seed noise: when it would settle, in seeds and in steps);
  :mod:`.table2_columns`, its typed row and its columns, declared once with :mod:`.columns`' mechanism;
- :mod:`.compare`: two Table 3 replicas side by side (``ltfm report A --against B``): transfers, flips;
- :mod:`.columns`: the table's typed row and its columns, declared once (every view reads them); a report's
  :class:`~.columns.Kind` (what W&B and optuna-dashboard take of its table);
- :mod:`.render`: the Table 3 replica as text: headline, markdown tables, CSV, :func:`write_table`;
- :mod:`.search`: the search report: one row per trial, Optuna's plots;
- :mod:`.figures`: the Table 3 figures (matplotlib), in PNG and, with ``--formats``, SVG and PDF;
- :mod:`.lead`: the report's lead figure: every row's change against the base beside the paper's;
- :mod:`.latex`: the replica as a booktabs table (``table3.tex``);
- :mod:`.attention`: cross-attention alignments of a run (either architecture) and the positional encodings;
- :mod:`.text`: cell formatting: numbers, knobs, markdown cells, one-line error messages;
- :mod:`.notebooks`: ``ltfm report``: papermill execution of the packaged notebooks
  (``lightning_tfm/resources/notebooks/``), HTML export, publishing the report folder;
- :mod:`.dashboards`: after a Table 3 or Table 2 report, the same report as one W&B run (job type ``report``) and as the
  study's optuna-dashboard note and custom plots.

The notebooks stay thin: ``from lightning_tfm import report as rd`` and the names below.
"""
import warnings

# tqdm.auto (imported by optuna and datasets) warns in a kernel without ipywidgets; a report has no progress bars.
warnings.filterwarnings("ignore", message="IProgress not found")

import importlib  # noqa: E402
import importlib.util  # noqa: E402

# The package's names, imported on first use (PEP 562): ``ltfm --help`` imports this package for the report
# command's declaration (:mod:`.commands`) and must not import torch or Optuna. A name and its module:
_HOMES = {
    "compare": ("comparison_markdown", "compare_tables", "plot_comparison", "write_comparison"),
    "compute": ("interpolate",),
    "export": ("read_export", "write_export"),
    "attention": ("alignment_figure", "positional_figure"),
    "lead": ("changes_markdown", "plot_changes"),
    "latex": ("write_latex",),
    "figures": ("plot_bleu_vs_params", "plot_dev_ppl_by_family", "plot_norm_curves", "plot_ppl_vs_flops"),
    "records": ("ReportData", "RunRecord", "latest_per_key", "planned_configs", "wandb_record"),
    "sources": ("load_report_data",),
    "search": ("plot_intermediate_values", "plot_optimization_history", "plot_param_importances", "search_markdown",
               "search_rows", "search_study", "write_search"),
    "render": ("bleu_markdown", "config_markdown", "curves_markdown", "headline_markdown", "notes_markdown",
               "ppl_markdown", "table_markdown", "write_table"),
    "stats": ("NOISE_RULE", "bleu_significant", "dev_references", "noise_verdict", "paired_test"),
    "table": ("build_table", "learning_curves"),
    "verdict": ("curve_verdict", "verdict_rule"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule not imported yet: ``report.render``
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})

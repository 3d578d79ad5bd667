"""The report of a sweep: ``ltfm report SWEEP.yaml`` runs a notebook that calls this package.

One job per module; imports point one way (model <- training <- sweep <- report: this package reads the
sweep's trial configs and search space from :mod:`lightning_tfm.sweep`, the sweep never imports it):

- :mod:`.records`: a sweep's runs as :class:`RunRecord` lists: local run folders, the Optuna study, W&B;
- :mod:`.budget`: a run read at its own sweep's budget when another sweep trained its folder on;
- :mod:`.paper`: the paper's Table 3 numbers (a package resource) and its row order;
- :mod:`.table`: the Table 3 replica beside the paper's (:func:`build_table`): rows, statuses, order, knobs,
  learning curves;
- :mod:`.stats`: the seed-noise rule, direction agreement, sacreBLEU's paired bootstrap, the dev references;
- :mod:`.verdict`: the budget verdict of a row (finding, still moving, within noise) from the learning curves;
- :mod:`.compute`: training FLOPs per step of a row and its dev PPL at the base's compute (equal-compute Δ);
- :mod:`.export`: the records a report is built from as one JSON file, and the report rebuilt from it;
- :mod:`.compare`: two Table 3 replicas side by side (``ltfm report A --against B``): transfers, flips;
- :mod:`.render`: the Table 3 replica as text: headline, markdown tables, CSV, :func:`write_table`;
- :mod:`.search`: the search report: one row per trial, Optuna's plots;
- :mod:`.figures`: the Table 3 figures (matplotlib);
- :mod:`.text`: cell formatting: numbers, knobs, markdown cells, one-line error messages;
- :mod:`.notebooks`: ``ltfm report``: papermill execution of the packaged notebooks
  (``lightning_tfm/resources/notebooks/``), HTML export, publishing the report folder;
- :mod:`.dashboards`: after a Table 3 report, the same report as one W&B run (job type ``report``) and as the
  study's optuna-dashboard note and custom plots.

The notebooks stay thin: ``from lightning_tfm import report as rd`` and the names below.
"""
import warnings

# tqdm.auto (imported by optuna and datasets) warns in a kernel without ipywidgets; a report has no progress bars.
warnings.filterwarnings("ignore", message="IProgress not found")

from .compare import comparison_markdown, compare_tables, plot_comparison, write_comparison  # noqa: E402
from .compute import interpolate  # noqa: E402
from .export import read_export, write_export  # noqa: E402
from .figures import plot_bleu_vs_params, plot_dev_ppl_by_family, plot_norm_curves, plot_ppl_vs_flops  # noqa: E402
from .records import (ReportData, RunRecord, latest_per_key, load_report_data, planned_configs,  # noqa: E402
                      wandb_record)
from .search import (plot_intermediate_values, plot_optimization_history, plot_param_importances,  # noqa: E402
                     search_markdown, search_rows, search_study, write_search)
from .render import (bleu_markdown, config_markdown, curves_markdown, headline_markdown, notes_markdown,  # noqa: E402
                     ppl_markdown, table_markdown, write_table)
from .stats import NOISE_RULE, bleu_significant, dev_references, noise_verdict, paired_test  # noqa: E402
from .table import build_table, learning_curves  # noqa: E402
from .verdict import curve_verdict, verdict_rule  # noqa: E402

__all__ = ["NOISE_RULE", "ReportData", "RunRecord", "bleu_markdown", "bleu_significant", "build_table",
           "compare_tables", "comparison_markdown", "config_markdown", "curve_verdict", "curves_markdown",
           "interpolate", "plot_comparison", "plot_ppl_vs_flops", "read_export", "verdict_rule", "write_comparison",
           "write_export", "dev_references", "learning_curves", "headline_markdown", "latest_per_key", "load_report_data",
           "noise_verdict", "notes_markdown", "paired_test", "planned_configs", "plot_bleu_vs_params",
           "plot_dev_ppl_by_family", "plot_intermediate_values", "plot_norm_curves", "plot_optimization_history",
           "plot_param_importances", "ppl_markdown", "search_markdown", "search_rows", "search_study",
           "table_markdown", "wandb_record", "write_search", "write_table"]

"""The report of a sweep: ``ltfm report SWEEP.yaml`` runs a notebook that calls this package.

Imports point one way (model <- training <- bench <- sweep <- report: this package reads the sweep's trial configs
and search space from :mod:`lightning_tfm.sweep`, the sweep never imports it), and so do they between the report's
own rooms, one concern each, bottom to top:

- :mod:`.core`: what every part is made of: cell text (:mod:`.core.text`), a table's typed row and its columns
  declared once (:mod:`.core.columns`: the mechanism both tables use, and a report's :class:`~.core.columns.Kind`),
  a figure's canvas and files (:mod:`.core.plots`);
- :mod:`.inputs`: a sweep's runs as :class:`~.inputs.records.RunRecord` lists, from local run folders, the Optuna
  study, W&B or an export (:func:`~.inputs.sources.load_report_data`), read at their own sweep's budget, and written
  as an export;
- :mod:`.table3`: the paper's Table 3 replicated: the paper's numbers, the seed-noise rule and significance, a
  row's verdict from its learning curve, compute, the replica's row and columns, :func:`~.table3.table.build_table`,
  and two replicas compared (``--against``);
- :mod:`.views` and :mod:`.table2`, side by side (neither imports the other): the replica as a reader sees it
  (markdown, CSV, LaTeX, the lead figure and the others, attention, the search report), and the paper's Table 2 at
  small scale, built on Table 3's rows and verdict (its table, claims and columns);
- :mod:`.publish`: the report taken out of Python: the notebooks executed (:mod:`.publish.notebooks`: papermill,
  HTML), what each kind of report gives the outside (:mod:`.publish.kinds`), the W&B report run
  (:mod:`.publish.wandb_run`), the study's optuna-dashboard note and plots (:mod:`.publish.optuna_note`), and
  :func:`~.publish.published.publish`, which sends it to both and says where it was published;
- at the top, :mod:`.backtest`
  (``ltfm report --backtest``: a short sweep's verdicts against a later export's curves; it builds tables and draws
  the outlook figure, so it sits above both), and :mod:`.calibration` (the committed back-tests' calibration page,
  and the command that writes the verdict's constants, :mod:`lightning_tfm.findings.calibrate`).

A room imports only from the rooms below it (tests/test_layers.py: ``REPORT_ROOMS``). The notebooks stay thin:
``from lightning_tfm import report as rd`` and the names below, beside the modules they import by name.
"""
import warnings

# tqdm.auto (imported by optuna and datasets) warns in a kernel without ipywidgets; a report has no progress bars.
warnings.filterwarnings("ignore", message="IProgress not found")

from ..base.lazy import lazy_names  # noqa: E402

# The package's names, imported on first use (PEP 562): a notebook's ``from lightning_tfm import report as rd``
# imports only what it uses (torch and Optuna when it asks for them). A name and its module:
_HOMES = {
    "table3.compare": ("comparison_markdown", "compare_tables", "plot_comparison", "write_comparison"),
    "table3.compute": ("interpolate",),
    "inputs.export": ("read_export", "write_export"),
    "views.attention": ("alignment_figure", "positional_figure"),
    "views.lead": ("changes_markdown", "plot_changes"),
    "views.latex": ("write_latex",),
    "views.figures": ("plot_bleu_vs_params", "plot_dev_ppl_by_family", "plot_norm_curves", "plot_ppl_vs_flops"),
    "inputs.records": ("ReportData", "RunRecord", "latest_per_key", "planned_configs", "wandb_record"),
    "inputs.sources": ("load_report_data",),
    "views.search": ("plot_intermediate_values", "plot_optimization_history", "plot_param_importances",
                     "search_markdown", "search_rows", "search_study", "write_search"),
    "views.render": ("bleu_markdown", "config_markdown", "curves_markdown", "headline_markdown", "notes_markdown",
                     "ppl_markdown", "table_markdown", "write_table"),
    "table3.stats": ("bleu_significant", "dev_references", "paired_test"),
    "table3.table": ("build_table", "learning_curves"),
    "table3.verdict": ("curve_verdict", "verdict_rule"),
}
__all__, __getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)

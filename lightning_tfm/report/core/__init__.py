"""What every part of the report is made of, whatever the table: :mod:`.text` (how a cell prints: numbers, knobs,
markdown, one-line errors), :mod:`.columns` (a table's typed row and its columns declared once: the mechanism both
tables' declarations use, and :class:`~.columns.Kind`, a report's table as W&B and optuna-dashboard take it) and
:mod:`.plots` (a figure's canvas and its files: PNG, SVG, PDF; a figure left out says why). Imports nothing of the
report's other sub-packages."""

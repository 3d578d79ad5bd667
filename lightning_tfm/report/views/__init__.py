"""What a reader sees of a Table 3 replica and of a search: :mod:`.render` (headline, markdown tables, CSV, notes:
:func:`~.render.write_table`), :mod:`.latex` (``table3.tex``), :mod:`.lead` (the lead figure: every row's change
beside the paper's), :mod:`.figures` (the replica's other figures, the verdict's outlook among them),
:mod:`.attention` (a run's cross-attention alignments and the positional encodings) and :mod:`.search` (the search
report: a row per trial, Optuna's plots). Imports :mod:`.core`, :mod:`.inputs` and :mod:`.table3`, never
:mod:`.table2`."""

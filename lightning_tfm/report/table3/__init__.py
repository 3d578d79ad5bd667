"""The paper's Table 3 replicated: the numbers, the rules they are judged by, and the table built from a sweep's
records. :mod:`.paper` (the paper's Table 3 and Table 2 numbers, a package resource), :mod:`.stats` (the
seed-noise rule, direction agreement, sacreBLEU's paired bootstrap, seeds to settle a pair), :mod:`.verdict` (a
row's verdict from its learning curve extrapolated), :mod:`.answers` (a row's answer from its own seeds: better,
worse, the same, unsettled), :mod:`.compute` (training FLOPs a step, dev PPL at the base's
compute), :mod:`.columns` (the replica's typed row and its columns, declared once), :mod:`.table`
(:func:`~.table.build_table`: rows, statuses, order, knobs, learning curves; and the table rebuilt from an export)
and :mod:`.compare` (two replicas side by side: ``ltfm report A --against B``). Imports :mod:`.core` and
:mod:`.inputs`; Table 2's report (:mod:`.table2`) builds on this one."""

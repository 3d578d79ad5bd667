"""The paper's Table 2 at small scale (a sweep with a row of another architecture than the Transformer):
:mod:`.table` (each row's BLEU, FLOPs, time and parameters beside the paper's rows, the claim checked at equal
training FLOPs, its markdown, CSV and figure), :mod:`.claims` (the claim's lines; a pair within seed noise: when it
would settle, in seeds and in steps) and :mod:`.columns` (its typed row and its columns, with
:mod:`.core.columns`' mechanism). Built on Table 3's machinery (:mod:`.table3`: rows, curves, the verdict);
imports :mod:`.core`, :mod:`.inputs` and :mod:`.table3`, never :mod:`.views`."""

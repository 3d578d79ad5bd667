#!/usr/bin/env bash
# make rerender: every committed reference page re-rendered from its export by today's report code, in place. The
# exports, provenance.txt and status.txt are the measurements and stay as they are; the pages (markdown, CSV, HTML,
# LaTeX, figures) are replaced. On a main whose pages are current this changes nothing (git diff stays empty).
# Table 2's page has no export (its report writes none) and is not re-rendered.
set -euo pipefail
cd "$(dirname "$0")/../.."
LTFM=${LTFM:-.venv/bin/ltfm}
PY=${PY:-.venv/bin/python}
BUILD=reports/build/rerender
rm -rf "$BUILD"; mkdir -p reports/build
pages() {  # copy a report's pages over the committed ones (not its export, notebook or the run's own records)
  local from=$1 to=$2
  find "$from" -maxdepth 1 -type f ! -name '*.ipynb' -exec cp {} "$to"/ \;
}
for export in reports/reference/*/export/*.json; do
  ref=$(dirname "$(dirname "$export")")
  name=$(basename "$ref")
  sweep=sweeps/$("$PY" -c 'import json, sys, pathlib; print(pathlib.Path(json.load(open(sys.argv[1]))["sweep_file"]).name)' "$export")
  echo "rerender: $name (from $export, $sweep)"
  "$LTFM" report "$sweep" --from-export "$(dirname "$export")" --out "$BUILD/$name" > "$BUILD.$name.log" 2>&1 || {
    cat "$BUILD.$name.log"; exit 1; }
  pages "$BUILD/$name" "$ref"
done
# the comparison of the 600-step table with its rows continued to 1,800 steps
echo "rerender: table3-cpu-600-vs-1800"
"$LTFM" report sweeps/table3-cpu-continued.yaml --from-export reports/reference/table3-cpu-continued/export \
  --against sweeps/table3-cpu.yaml --against-export reports/reference/table3-cpu-2026-11-25/export \
  --out "$BUILD/table3-cpu-600-vs-1800" > "$BUILD.cmp.log" 2>&1 || { cat "$BUILD.cmp.log"; exit 1; }
pages "$BUILD/table3-cpu-600-vs-1800" reports/reference/table3-cpu-600-vs-1800
# Table 3 on en->fr beside en->de at 1,800 steps (rows at seed 1, the base at seeds 1-3 on both sides): the en->de
# rows of the continued table (C1, C6, D1, E) and of the held-out one (A1, B1, C4, prenorm)
for de in continued heldout; do
  echo "rerender: table3-cpu-fr-vs-de-$de"
  mkdir -p reports/reference/table3-cpu-fr-vs-de-$de
  "$LTFM" report sweeps/table3-cpu-heldout-fr.yaml --from-export reports/reference/table3-cpu-heldout-fr/export \
    --against sweeps/table3-cpu-$de.yaml --against-export reports/reference/table3-cpu-$de/export \
    --out "$BUILD/table3-cpu-fr-vs-de-$de" > "$BUILD.fr-$de.log" 2>&1 || { cat "$BUILD.fr-$de.log"; exit 1; }
  pages "$BUILD/table3-cpu-fr-vs-de-$de" reports/reference/table3-cpu-fr-vs-de-$de
done
echo "rerender: done; git diff --stat reports/reference shows what changed"

#!/usr/bin/env bash
# make rerender: every committed reference page re-rendered from its export by today's report code, in place (the
# Table 3 pages, the comparisons of comparisons.txt, the back-tests of backtest/backtests.txt and calibration.md). The
# exports, provenance.txt and status.txt are the measurements and stay as they are; the pages (markdown, CSV, HTML,
# LaTeX, figures) are replaced, and the settle loop's replays (settle-replay.md, settle-replay-fr.md). On a main
# whose pages are current this changes nothing (git diff stays empty).
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
# the comparisons (ltfm report A --against B), as comparisons.txt lists them
grep -v '^#' reports/reference/comparisons.txt | while read -r page sweep export against against_export; do
  [ -n "$page" ] || continue
  echo "rerender: $page"
  mkdir -p "reports/reference/$page"
  "$LTFM" report "$sweep" --from-export "$export" --against "$against" --against-export "$against_export" \
    --out "$BUILD/$page" > "$BUILD.$page.log" 2>&1 < /dev/null || { cat "$BUILD.$page.log"; exit 1; }
  pages "$BUILD/$page" "reports/reference/$page"
done
# the verdict's back-tests, as backtest/backtests.txt lists them (their JSON, table and figure), then the generated
# part of backtest/calibration.md from them
grep -v '^#' reports/reference/backtest/backtests.txt | while read -r name sweep export args; do
  [ -n "$name" ] || continue
  echo "rerender: backtest-$name"
  # shellcheck disable=SC2086  # args: the back-test's arguments, split as listed
  "$LTFM" report "$sweep" --from-export "$export" $args --out "$BUILD/backtest-$name.json" \
    > "$BUILD.backtest-$name.log" 2>&1 < /dev/null || { cat "$BUILD.backtest-$name.log"; exit 1; }
  cp "$BUILD/backtest-$name".{json,md,png} reports/reference/backtest/
done
"$PY" -m lightning_tfm.report.calibration reports/reference/backtest --page
# the settle loop replayed on the committed exports (en->de with its grid of settings, then en->fr)
DE="reports/reference/table3-cpu-heldout/export reports/reference/table3-cpu-continued/export"
DE="$DE reports/reference/table3-cpu-heldout-s3/export reports/reference/table3-cpu-heldout-s4/export"
echo "rerender: settle-replay"
# shellcheck disable=SC2086  # DE: the exports, split
"$LTFM" report sweeps/table3-cpu.yaml --settle-grid --settle-replay $DE --out reports/reference/settle-replay.md \
  > "$BUILD.settle-replay.log" 2>&1 < /dev/null || { cat "$BUILD.settle-replay.log"; exit 1; }
"$LTFM" report sweeps/table3-cpu.yaml --settle-replay reports/reference/table3-cpu-heldout-fr/export \
  --out reports/reference/settle-replay-fr.md > "$BUILD.settle-replay-fr.log" 2>&1 < /dev/null || {
  cat "$BUILD.settle-replay-fr.log"; exit 1; }
echo "rerender: done; git diff --stat reports/reference shows what changed"

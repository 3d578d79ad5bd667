#!/usr/bin/env bash
# A reference run across sessions, on machines that keep nothing but the repository (make reference-carry, make
# reference). A `make reference` stopped part way (Ctrl-C: its trials stop at a step and go back to the queue) is
# packed by `make reference-carry` into reports/reference/<name>-carry.tar.gz, to be committed: the study's
# database, the segments' wall times, and every completed run folder without its checkpoints and tokenizer (the
# runs' summaries, curves, dev hypotheses, W&B offline files and configs: what the settle loop, --status and the
# report read). On a fresh clone `make reference` unpacks it first into the empty results folder and goes on: the
# completed trials are not trained again; a trial that had not completed starts again from its first step (its
# checkpoints stayed behind). Its provenance.txt sums the segments' wall times.
#
#   carry.sh save CARRY RESULTS STUDY      # pack (refused while a trial of the study trains)
#   carry.sh restore CARRY RESULTS STUDY   # unpack into RESULTS (refused if RESULTS holds the study already)
#   carry.sh segment RESULTS STUDY T0 T1 COMMIT   # note a segment (make reference does, as it ends)
#   carry.sh wall RESULTS STUDY            # the segments' wall seconds, summed
set -euo pipefail
die() { echo "ltfm: $*" >&2; exit 2; }
[ $# -ge 3 ] || die "usage: carry.sh save|restore CARRY RESULTS STUDY | segment RESULTS STUDY T0 T1 COMMIT | wall RESULTS STUDY"
cmd=$1
case $cmd in
save)
  carry=$2 results=$3 study=$4
  [ -f "$results/$study.db" ] || die "no study $study in $results/ ($results/$study.db): nothing to carry"
  runs=()
  for summary in "$results"/"$study"-*/summary.json; do
    [ -f "$summary" ] || continue
    run=$(dirname "$summary")
    if [ -f "$run/train.lock" ] && ! flock -n "$run/train.lock" true; then
      die "$(basename "$run") is training now: stop the sweep first (Ctrl-C), then make reference-carry"
    fi
    if grep -q '"status": *"completed"' "$summary"; then runs+=("$(basename "$run")"); fi
  done
  tmp="$carry.partial"
  mkdir -p "$(dirname "$carry")"
  tar -czf "$tmp" -C "$results" --exclude=checkpoints --exclude=tokenizer.json --exclude=train.lock \
    "$study.db" $( [ -f "$results/$study.segments" ] && echo "$study.segments") "${runs[@]}"
  mv "$tmp" "$carry"
  echo "ltfm: carried the study $study and ${#runs[@]} completed runs to $carry ($(du -h "$carry" | cut -f1)); commit it, and make reference on a fresh clone goes on from there"
  ;;
restore)
  carry=$2 results=$3 study=$4
  [ -f "$carry" ] || die "no carry $carry"
  [ ! -e "$results/$study.db" ] || die "$results/ already holds the study $study: the carry $carry would replace it (move $results/ aside, or remove $carry to go on from $results/)"
  mkdir -p "$results"
  tar -xzf "$carry" -C "$results"
  n=$(tar -tzf "$carry" | grep -c '/summary.json$' || true)
  echo "ltfm: resuming the reference from $carry: the study $study and $n completed runs of earlier sessions"
  ;;
segment)
  results=$2 study=$3
  mkdir -p "$results"
  echo "$4 $5 $6" >> "$results/$study.segments"
  ;;
wall)
  results=$2 study=$3
  awk '{ s += $2 - $1 } END { print s + 0 }' "$results/$study.segments" 2>/dev/null || echo 0
  ;;
*) die "carry.sh: unknown command $cmd (save, restore, segment, wall)" ;;
esac

#!/usr/bin/env bash
# make gpu-prep: what travels to a lent GPU machine with tests/gpu_check.sh (run it here, in the checkout that the
# device call sends, before that call). Into .gpu-carry/ (ignored; the device call names it in carry):
#   wheels/    tests/gpu/wheels.txt as CPython 3.12 manylinux x86_64 wheels (pip download --no-deps --only-binary),
#              wheels no longer listed removed;
#   multi30k/  a copy of $DATA (../shared/data/multi30k: it does not travel beside the checkout).
# Then checks the wheels against the image's packages (tests/gpu/device-packages.txt) and the total that travels
# (tracked and untracked-not-ignored files plus .gpu-carry) against 60 MiB: the device call takes 64 MiB by its own
# count, which refused 63.8 MiB by this one. Exit 1 on either.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-../shared/data/multi30k}
CARRY=${CARRY:-.gpu-carry}
PIP_PY=${PIP_PY:-python3}       # any python with pip: the wheels are chosen for the target, not for it
PY=${PY:-.venv/bin/python}      # one with `packaging` for the check
LIMIT=$((60 * 1024 * 1024))
mkdir -p "$CARRY/wheels"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
"$PIP_PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$CARRY/wheels" -r tests/gpu/wheels.txt
# wheels of versions no longer listed: two versions of one package would stop the install there
"$PY" - "$CARRY/wheels" tests/gpu/wheels.txt <<'PY'
import sys
from pathlib import Path
from packaging.utils import canonicalize_name, parse_wheel_filename
want = {canonicalize_name(l.split("==")[0]): l.split("==")[1].strip() for l in Path(sys.argv[2]).read_text().splitlines()
        if l.strip() and not l.startswith("#")}
for w in Path(sys.argv[1]).glob("*.whl"):
    name, version, _, _ = parse_wheel_filename(w.name)
    if want.get(name) != str(version):
        print(f"gpu-prep: removing {w.name} (not in tests/gpu/wheels.txt)")
        w.unlink()
PY
if [ ! -f "$DATA/train.en.gz" ]; then echo "gpu-prep: no Multi30k at $DATA (DATA=folder with train.en.gz ...)" >&2; exit 1; fi
rm -rf "$CARRY/multi30k"; cp -r "$DATA" "$CARRY/multi30k"
"$PY" tests/gpu/tools.py depcheck "$CARRY/wheels" --manifest tests/gpu/device-packages.txt | grep -v "^  unverified"
tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
carry=$(find "$CARRY" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
total=$((tree + carry))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu-prep: $(ls "$CARRY"/wheels/*.whl | wc -l) wheels ($(mib "$(find "$CARRY/wheels" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')")), data $(mib "$(du -sb "$CARRY/multi30k" | cut -f1)"); travels: tree $(mib "$tree") + $CARRY $(mib "$carry") = $(mib "$total") of 60 MiB"
if [ "$total" -gt "$LIMIT" ]; then echo "gpu-prep: over 60 MiB (the device call takes 64 by its own count): carry less (tests/gpu/wheels.txt) or untrack large files" >&2; exit 1; fi

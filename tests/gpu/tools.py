"""Helpers of tests/gpu_check.sh and tests/gpu/prep.sh (standard library and ``packaging`` only: they run on the
lent GPU machine's python3 before the carried wheels are on the path).

  depcheck WHEELS [--manifest FILE]  every carried wheel fits the target: tags for CPython 3.12 on manylinux x86_64,
                                     Requires-Python, one version of each, and each requirement met by another carried
                                     wheel or by the machine's packages: the running environment's (on the device), or
                                     FILE's (tests/gpu/device-packages.txt: names, versions where known). Exit 1 on a
                                     conflict; requirements on a package of unknown version are listed as unverified.
  imports WHEELS [--manifest FILE]   import every carried wheel's top-level modules, then (where torch imports) the
                                     project's CLI and the modules its commands import lazily; exit 1 naming those that
                                     fail (with FILE: one missing a package FILE lists is deferred to the device).
  rows SWEEP OUT ROW...              OUT: SWEEP with only the named rows, at the sweep's first seed (the rows' values
                                     stay in SWEEP: nothing copied by hand).
  figures WORK                       the summary page's figures from what the steps left in WORK (markdown).
"""
from __future__ import annotations

import email.parser
import glob
import json
import os
import re
import sys
import zipfile
from pathlib import Path

# The lent machine's interpreter: what the wheels are downloaded for (tests/gpu/prep.sh) and checked against here.
TARGET_PYTHON = (3, 12)
TARGET_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
# Datasheet dense bf16 peaks (FLOP/s, no sparsity) of the cards a lent machine may have: MFU is given against both
# this and the matrix product ltfm bench measures on the card.
BF16_DATASHEET = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
# Modules our commands import only when they run (each layer's lazy imports): imported here so that a missing wheel
# shows in seconds, not as a failed step minutes later.
LAZY_MODULES = ("lightning_tfm.cli", "lightning_tfm.training.train", "lightning_tfm.sweep.worker",
                "lightning_tfm.cli.report", "optuna", "sqlalchemy", "wandb", "sacremoses", "sacrebleu",
                "papermill", "nbconvert", "transformers", "pytorch_lightning")


def _wheels(folder: str) -> list[Path]:
    return sorted(Path(folder).glob("*.whl"))


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        return email.parser.Parser().parsestr(z.read(name).decode())


def _target_env() -> dict:
    v = ".".join(map(str, TARGET_PYTHON))
    return {"python_version": v, "python_full_version": v + ".3", "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": "x86_64", "implementation_name": "cpython", "os_name": "posix",
            "platform_python_implementation": "CPython", "extra": ""}


def depcheck(folder: str, manifest: str | None) -> int:
    from packaging import tags
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version

    if manifest:  # what the lent machine's image holds, as listed; unknown versions are None
        machine: dict[str, str | None] = {}
        for line in Path(manifest).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                name, _, version = line.partition("==")
                machine[canonicalize_name(name)] = version or None
        py = machine.pop("python", None) or ".".join(map(str, TARGET_PYTHON))
        env = _target_env()
        supported = set(tags.cpython_tags(TARGET_PYTHON, platforms=TARGET_PLATFORMS)) | set(
            tags.compatible_tags(TARGET_PYTHON, "cp312", TARGET_PLATFORMS))
        where = f"the image's list ({manifest})"
    else:  # this interpreter's own packages, without the carried ones (they are not on the path yet)
        from importlib import metadata

        machine = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()
                   if d.metadata["Name"]}
        py, env, supported = ".".join(map(str, sys.version_info[:3])), None, set(tags.sys_tags())
        where = f"this python ({sys.executable}, {py})"
    wheels = _wheels(folder)
    if not wheels:
        print(f"depcheck: no wheels in {folder} (make gpu-prep downloads them)")
        return 1
    carried: dict[str, str] = {}
    errors, unverified, shadowing = [], [], []
    readable = []
    for w in wheels:
        try:
            name, version, _, wtags = parse_wheel_filename(w.name)
            meta = _metadata(w)
        except Exception as e:  # noqa: BLE001 - a file pip would refuse: the finding
            errors.append(f"{w.name}: not a readable wheel ({type(e).__name__}: {e})")
            continue
        readable.append(meta)
        if name in carried:
            errors.append(f"two versions of {name}: {carried[name]} and {version} (pip stops on both)")
        carried[name] = str(version)
        if not (set(wtags) & supported):
            errors.append(f"{w.name}: no tag for CPython {py} on manylinux x86_64")
        if name in machine:
            shadowing.append(f"{name} {version} (the machine has {machine[name] or 'a version not listed'})")
    for meta in readable:
        who = f"{meta['Name']} {meta['Version']}"
        rp = meta.get("Requires-Python")
        if rp and not SpecifierSet(rp).contains(py, prereleases=True):
            errors.append(f"{who} requires Python {rp}: the machine has {py}")
        for raw in meta.get_all("Requires-Dist") or []:
            req = Requirement(raw)
            if req.marker and not req.marker.evaluate(env):
                continue
            name = canonicalize_name(req.name)
            have = carried.get(name) or machine.get(name)
            if name not in carried and name not in machine:
                errors.append(f"{who} requires {req}: neither carried nor on the machine "
                              "(add it to tests/gpu/wheels.txt)")
            elif have is None:
                unverified.append(f"{who} requires {req}")
            elif req.specifier and not req.specifier.contains(Version(have), prereleases=True):
                src = "carried" if name in carried else "on the machine"
                errors.append(f"{who} requires {req}: {name} {have} is {src}")
    print(f"depcheck: {len(wheels)} wheels in {folder} against {where}")
    for s in shadowing:
        print(f"  carried over the machine's own: {s}")
    for u in unverified:
        print(f"  unverified (version not listed; read on the device): {u}")
    for e in errors:
        print(f"  CONFLICT: {e}")
    print(f"depcheck: {'ok' if not errors else f'{len(errors)} conflict(s)'}, {len(unverified)} unverified")
    return 1 if errors else 0


def _top_level(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if top:
            mods = z.read(top[0]).decode().split()
        else:  # from the files it installs
            mods = {n.split("/")[0].removesuffix(".py") for n in names
                    if not n.split("/")[0].endswith((".dist-info", ".data")) and (n.endswith(".py") or "/" in n)}
    return sorted(m.replace("/", ".") for m in mods if m.isidentifier() and not m.startswith("_") and m != "tests")


# import name -> distribution, where they differ (for the rehearsal's reading of a missing module)
MODULE_DIST = {"yaml": "pyyaml", "dateutil": "python-dateutil", "google": "protobuf", "PIL": "pillow",
               "sklearn": "scikit-learn", "attr": "attrs", "zmq": "pyzmq", "jwt": "pyjwt",
               "cv2": "opencv-python-headless"}


def _manifest_names(manifest: str) -> set[str]:
    names = set()
    for line in Path(manifest).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(re.sub(r"[-_.]+", "-", line.partition("==")[0]).lower())
    return names


def imports(folder: str, manifest: str | None = None) -> int:
    """With ``manifest`` (the rehearsal, on a bare Python 3.12): a module missing because it needs a package the image
    has (and this Python lacks) is listed as deferred, not failed; what it would have imported next is not checked."""
    import importlib

    image = _manifest_names(manifest) if manifest else set()
    mods = [m for w in _wheels(folder) for m in _top_level(w)]
    try:
        import torch  # noqa: F401
        mods += list(LAZY_MODULES)
    except ImportError:
        print(f"imports: no torch in {sys.executable} ({sys.version.split()[0]}): the project's own modules are left "
              "to the smoke step")
    mods = list(dict.fromkeys(mods))
    failed, deferred = [], []
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - every failure is the finding
            top = (getattr(e, "name", None) or "").split(".")[0]
            dist = MODULE_DIST.get(top, re.sub(r"[-_.]+", "-", top).lower())
            if isinstance(e, ModuleNotFoundError) and top and dist in image:
                deferred.append(f"{m} (needs {dist}: the image has it, this Python does not)")
            else:
                failed.append(f"{m}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print(f"imports: {len(mods) - len(failed) - len(deferred)} of {len(mods)} modules imported with {sys.executable} "
          f"({sys.version.split()[0]}), {len(deferred)} deferred to the device, {len(failed)} failed")
    for d in deferred:
        print(f"  deferred {d}")
    for f in failed:
        print(f"  FAILED {f}")
    return 1 if failed else 0


def rows(sweep: str, out: str, *names: str) -> int:
    import yaml

    spec = yaml.safe_load(Path(sweep).read_text())
    missing = [n for n in names if n not in spec["variants"]]
    if missing:
        print(f"rows: {', '.join(missing)} not rows of {sweep}")
        return 1
    spec["variants"] = {n: {**(spec["variants"][n] or {}), "seeds": spec["seeds"][:1]} for n in names}
    spec["name"] = f"{spec['name']}-timing"
    spec["experiment"] = str((Path(sweep).parent / spec["experiment"]).resolve())
    Path(out).write_text(yaml.safe_dump(spec, sort_keys=False))
    return 0


def _load(path: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def figures(work: str) -> int:
    w = Path(work)
    for label, pattern in (("smoke training", "smoke/*/summary.json"), ("1-GPU DDP run", "ddp/*/summary.json")):
        for f in sorted(glob.glob(str(w / pattern))):
            s = _load(f) or {}
            print(f"- {label}: precision {s.get('precision')}, {s.get('steps')} steps in {s.get('wall_time_s')} s, "
                  f"{s.get('tokens_per_s')} tokens/s, dev PPL {s.get('dev_ppl')}, dev BLEU {s.get('dev_bleu')}")
    for f in sorted(glob.glob(str(w / "bench-*.json"))):
        b = _load(f)
        if not b:
            continue
        name = b.get("device_name", "?")
        sheet = next((v for k, v in BF16_DATASHEET.items() if k in name), None)
        peaks = b.get("matmul_peak_gflops", {})
        print(f"- bench {Path(f).stem[6:]} ({b.get('model')}; "
              f"batch {b['settings']['batch']} x {b['settings']['src_len']}; "
              f"{name}): measured matmul peak " + ", ".join(f"{k} {v / 1000:.0f} TFLOP/s" if v >= 1000 else
                                                            f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items())
              + (f"; bf16 datasheet {sheet / 1e12:.0f} TFLOP/s" if sheet else ""))
        print("  | model | dtype | train tokens/s | decode sent/s | peak MB | MFU (measured peak) "
              "| MFU (datasheet bf16) |")
        print("  | --- | --- | --- | --- | --- | --- | --- |")
        for kind in ("ours", "marian"):
            for dt, v in (b.get(kind) or {}).items():
                ds = (f"{v['mfu'] * peaks[dt] * 1e9 / sheet:.1%}" if sheet and dt == "bf16" and v.get("mfu") is not None
                      else "-")
                print(f"  | {kind} | {dt} | {v['train_tokens_per_s']:.0f} | {v['decode_sentences_per_s']:.1f} | "
                      f"{v['peak_memory_mb']:.0f} | {v['mfu']:.1%} | {ds} |")
        for dt, sp in (b.get("speedup") or {}).items():
            print(f"  ours / marian, {dt}: training {sp['train']:.2f}x, decoding {sp['decode']:.2f}x")
    st = _load(w / "table3-status.json")
    if st:
        rows_ = st if isinstance(st, list) else st.get("trials", st.get("rows", []))
        print("- Table 3 GPU protocol rows, packed on one GPU (steps: the last validated; s per 1,000 steps: a trial's "
              "time at the protocol's budget is this times its train.max_steps / 1,000, start-up included):")
        print("  | row | state | steps | duration s | s per 1,000 steps |")
        print("  | --- | --- | --- | --- | --- |")
        for r in rows_:
            steps, dur = r.get("steps"), r.get("duration_s")
            rate = f"{1000 * dur / steps:.0f}" if steps and dur else "-"
            print(f"  | {r.get('variant')} | {r.get('state')} | {steps} | {dur if dur is None else round(dur)} "
                  f"| {rate} |")
    return 0


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "depcheck":
        manifest = args[args.index("--manifest") + 1] if "--manifest" in args else None
        return depcheck(args[0], manifest)
    if cmd == "imports":
        return imports(args[0], args[args.index("--manifest") + 1] if "--manifest" in args else None)
    if cmd == "rows":
        return rows(*args)
    if cmd == "figures":
        return figures(args[0])
    print(__doc__)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("WANDB_SILENT", "true")
    sys.exit(main(sys.argv[1:]))

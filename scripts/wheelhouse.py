"""A folder of wheels for a GPU node without internet (`make wheelhouse`), and the node-side steps of
`make setup WHEELS=dir` (docs/real-data.md, "A GPU node without internet").

  build --out DIR --python-version 3.11 --platform manylinux_2_28_x86_64 [--with-torch]
      (a machine with the package index) every wheel that the two packages (tokenizer_pipeline with its [ffmpeg]
      extra), benchmarks/requirements.txt, pytest and the packages' build backend (hatchling, and editables for
      the editable installs) need, at the versions constraints.txt pins, for that Python and platform; plus
      README.md and wheelhouse.json saying what the folder is for. Without --with-torch the torch stack (TORCH_STACK:
      torch, torchaudio, triton, nvidia-*, cuda-*) and what only torch needs (sympy, networkx, ...) stay out: the
      node's torch is reused. The two packages themselves are not in it: the node installs them editable.
  node-check WHEELS        (the node's python) one line naming the fix, exit 2, when the folder is for another
                           Python, or when neither this python nor the folder has torch / torchaudio
  node-pth VENV            (the node's python) VENV's site-packages gets node-torch.pth: the site directories
                           where this python's torch and torchaudio live (none when it has no torch)
  node-constraints FILE    constraints.txt without the torch stack's and torchcodec's pins, to stdout
  origin                   (the new venv's python) which torch it imports, and from where

Only the standard library and pip (run as `python -m pip`): `build` runs with $(PYTHON) before any venv exists.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# canonical names (PEP 503): the node's torch provides these; a wheelhouse has them only with --with-torch
TORCH_STACK = re.compile(r"torch|torchaudio|triton|nvidia-.+|cuda-.+")
# built against one torch release: in the wheelhouse (a node without it gets 0.17, made for torch 2.11), but its pin
# is dropped on the node like the torch stack's, so a torchcodec the node has (made for its torch) is kept
TORCH_PAIRED = {"torchcodec"}
# hatchling's PEP 660 hook asks for this on top of [build-system] requires (hatchling.builders.constants)
EDITABLES = "editables~=0.3"
STUB = "wheelhouse.stub"  # local version label of the stand-in torch-stack wheels of a build without --with-torch
MANIFEST = "wheelhouse.json"


def canonical(name: str) -> str:
    """PEP 503's normalised name. Written out, not packaging's: the node-side steps run on the node's python, which
    may have no pip (and so no vendored packaging) to import."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_key(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file name: name-version(-build)?-py-abi-platform.whl"""
    name, version = filename.split("-")[:2]
    return canonical(name), version


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)


# ---- build (a machine with the index)


def platform_tags(platform: str) -> list[str]:
    """pip's --platform takes each tag literally: manylinux_2_28_x86_64 also needs every older manylinux tag (most
    wheels on PyPI are manylinux2014 = manylinux_2_17) to get what a glibc-2.28 node can run."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m[1]), m[2]
    tags = [f"manylinux_2_{g}_{arch}" for g in range(glibc, 4, -1)]
    return tags + [f"{alias}_{arch}" for g, alias in ((17, "manylinux2014"), (12, "manylinux2010"), (5, "manylinux1"))
                   if g <= glibc]  # fmt: skip


def pins(constraints: Path) -> dict[str, str]:
    out = {}
    for line in constraints.read_text().splitlines():
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+).*", line)
        if m:
            out[canonical(m[1])] = m[2]
    return out


def build_requires() -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip's own copy of tomli
        from pip._vendor import tomli as tomllib
    reqs = set()
    for pkg in ("tokenizer_pipeline", "adapter_trainer"):
        with open(REPO / "packages" / pkg / "pyproject.toml", "rb") as f:
            reqs.update(tomllib.load(f)["build-system"]["requires"])
    return sorted(reqs)


def write_stub(directory: Path, name: str, version: str) -> None:
    """A wheel with metadata only (no files, no dependencies): the resolver takes it for the node's torch-stack
    package, so neither its GBs nor torch's own dependencies are fetched. Its version is the pin with a local label,
    which `==pin` matches and which sorts above the index's own `pin`."""
    dist = f"{name.replace('-', '_')}-{version}+{STUB}"
    info = f"{dist}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}+{STUB}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: wheelhouse.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def resolve(report: Path, roots: list[str], constraints: Path, links: list[Path], target: list[str]) -> list[dict]:
    """pip's resolution, nothing installed (--dry-run --report): the items it would install."""
    pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), "-c", str(constraints),
        *(f"--find-links={d}" for d in links), *target, *roots)  # fmt: skip
    return json.loads(report.read_text())["install"]


def build(args: argparse.Namespace) -> None:
    from importlib.metadata import version

    if tuple(int(p) for p in version("pip").split(".")[:2]) < (22, 2):
        fail(
            f"make wheelhouse needs pip >= 22.2 (pip install --dry-run --report); {sys.executable} has {version('pip')}"
        )
    out, constraints = Path(args.out), Path(args.constraints).resolve()
    platforms = platform_tags(args.platform)
    target = ["--only-binary=:all:", "--python-version", args.python_version, "--implementation", "cp"]
    target += [f"--platform={p}" for p in platforms]
    roots = [f"{REPO / 'packages' / 'tokenizer_pipeline'}[ffmpeg]", str(REPO / "packages" / "adapter_trainer"),
             "-r", str(REPO / "benchmarks" / "requirements.txt"), "pytest", "pytest-xdist", *build_requires(), EDITABLES]  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheelhouse-", dir=out.parent) as tmp:
        tmp = Path(tmp)
        stubs, built, fresh = tmp / "stubs", tmp / "built", tmp / "wheels"
        for d in (stubs, built, fresh):
            d.mkdir()
        links = [built]
        if not args.with_torch:
            for name, pin in pins(constraints).items():
                if TORCH_STACK.fullmatch(name):
                    write_stub(stubs, name, pin)
            links.append(stubs)
        # 1. this machine's resolution finds the pins that PyPI has as sources only (antlr4-python3-runtime 4.9.3):
        #    pip resolves for another Python/platform from wheels only, so these are built here first; pure-Python
        #    ones give a py3-none-any wheel that any node can install
        print("make wheelhouse: resolving (sources to build)", flush=True)
        for item in resolve(tmp / "host.json", roots, constraints, links, []):
            info = item["download_info"]
            if "archive_info" in info and not info["url"].split("#")[0].endswith(".whl"):
                meta = item["metadata"]
                pip("wheel", "--quiet", "--no-deps", "-w", str(built), f"{meta['name']}=={meta['version']}")
        impure = [w.name for w in built.glob("*.whl") if not w.name.endswith("-none-any.whl")]
        if impure:
            fail(f"make wheelhouse: {', '.join(impure)} has no wheel on the index for {args.platform} and built into a "
                 "wheel for this machine only: build the wheelhouse on a machine like the node")  # fmt: skip
        # 2. the resolution for the node's Python and platform, wheels only
        print(f"make wheelhouse: resolving for Python {args.python_version}, {args.platform}", flush=True)
        items = resolve(tmp / "target.json", roots, constraints, links, ["--target", str(tmp / "unused"), *target])
        want = {}
        for item in items:
            meta, info = item["metadata"], item["download_info"]
            if "dir_info" in info or STUB in meta["version"]:  # the two packages (editable on the node), stand-ins
                continue
            want[canonical(meta["name"])] = meta["version"]
        leaked = sorted(n for n in want if TORCH_STACK.fullmatch(n)) if not args.with_torch else []
        if leaked:
            fail(
                f"make wheelhouse: torch-stack wheels {leaked} resolved without --with-torch: pin them in constraints.txt"
            )
        print(f"make wheelhouse: downloading {len(want)} wheels", flush=True)
        pip("download", "--quiet", "--no-deps", "-d", str(fresh), f"--find-links={built}", *target,
            *(f"{n}=={v}" for n, v in sorted(want.items())))  # fmt: skip
        got = {wheel_key(w.name)[0] for w in fresh.glob("*.whl")}
        if got != set(want):
            fail(f"make wheelhouse: expected wheels of {sorted(set(want) - got)}, got extra {sorted(got - set(want))}")
        # 3. the folder: this build's wheels only (a wheel of an earlier build for another Python would mislead)
        out.mkdir(exist_ok=True)
        for old in [*out.glob("*.whl"), out / "README.md", out / MANIFEST]:
            old.unlink(missing_ok=True)
        for w in fresh.glob("*.whl"):
            shutil.move(str(w), out / w.name)
    write_manifest(out, args, platforms, sorted(want))


def write_manifest(out: Path, args: argparse.Namespace, platforms: list[str], names: list[str]) -> None:
    wheels = sorted(out.glob("*.whl"), key=lambda w: w.name.lower())
    sizes = {w.name: w.stat().st_size for w in wheels}
    total = sum(sizes.values())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    excluded = "nothing (--with-torch / WITH_TORCH=1: the torch stack is included)"
    if not args.with_torch:
        excluded = ("the torch stack (torch, torchaudio, triton, nvidia-*, cuda-*) and what only torch needs "
                    "(sympy, networkx, ...): the node's torch is reused")  # fmt: skip
    manifest = {
        "python_version": args.python_version,
        "implementation": "cp",
        "platform": args.platform,
        "platform_tags": platforms,
        "with_torch": bool(args.with_torch),
        "excludes": [] if args.with_torch else ["torch", "torchaudio", "triton", "nvidia-*", "cuda-*"],
        "built": datetime.date.today().isoformat(),
        "commit": commit.stdout.strip() or None,
        "total_bytes": total,
        "wheels": [w.name for w in wheels],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    rows = "\n".join(f"| {n} | {b / 1e6:.1f} |" for n, b in sorted(sizes.items(), key=lambda x: -x[1]))
    (out / "README.md").write_text(f"""# Wheelhouse for `make setup WHEELS=<this folder>` (a node without internet)

- For: CPython {args.python_version} on {args.platform} (wheels tagged {platforms[0]} or older manylinux)
- Holds: every wheel tokenizer_pipeline[ffmpeg], adapter_trainer, benchmarks/requirements.txt (make bench-gpu),
  pytest and the packages' build backend (hatchling, editables) need, at the versions constraints.txt pins;
  not the two packages themselves (make setup installs them editable from the repository)
- Excludes: {excluded}
- Built {manifest["built"]} by `make wheelhouse` from commit {manifest["commit"]}: {len(wheels)} wheels,
  {total / 1e6:.0f} MB ({MANIFEST} says the same for scripts)

On the node, in a copy of the repository: `make setup WHEELS=<this folder>` (PYTHON=<the python whose torch to
reuse>, default python3). Then `make bench-gpu` as usual (docs/real-data.md, "A GPU node without internet").

| wheel | MB |
| --- | --- |
{rows}
""")
    print(
        f"make wheelhouse: {out}: {len(wheels)} wheels, {total / 1e6:.0f} MB ({len(names)} packages); {out}/README.md"
    )


# ---- node side (run by the node's python, and by the new venv's)


def torch_dirs() -> tuple[list[str], dict[str, str]]:
    """The site directories holding this python's torch and torchaudio (as on sys.path: symlinks are kept), and
    why a module is missing."""
    dirs, missing = [], {}
    for mod in ("torch", "torchaudio"):
        try:
            m = __import__(mod)
        except Exception as e:  # ImportError, or a torch whose CUDA libraries fail to load
            missing[mod] = f"{type(e).__name__}: {e}"
            continue
        d = os.path.dirname(os.path.dirname(os.path.abspath(m.__file__)))
        if d not in dirs:
            dirs.append(d)
    return dirs, missing


def node_check(args: argparse.Namespace) -> None:
    wheels = Path(args.wheels)
    if not wheels.is_dir():
        fail(f"make setup: WHEELS={wheels} is not a folder (make wheelhouse builds one, on a machine with internet)")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    manifest = wheels / MANIFEST
    if manifest.is_file():
        made_for = json.loads(manifest.read_text())["python_version"]
        if made_for != here:
            fail(f"make setup: {wheels} holds wheels for Python {made_for}, but PYTHON={sys.executable} is {here}: "
                 f"run make wheelhouse WHEEL_PYTHON={here} on a machine with internet (or PYTHON=python{made_for})")  # fmt: skip
    have = {wheel_key(w.name)[0] for w in wheels.glob("*.whl")}
    _, missing = torch_dirs()
    lacking = [m for m in missing if m not in have]
    if lacking:
        broken = "; ".join(missing[m] for m in lacking if not missing[m].startswith("ModuleNotFoundError"))
        fail(f"make setup: PYTHON={sys.executable} imports no {' and no '.join(lacking)}{f' ({broken})' if broken else ''} "
             f"and WHEELS={wheels} has none: install torch and torchaudio for that python on the node (or name one "
             f"that has them: PYTHON=...), or build the wheelhouse with make wheelhouse WITH_TORCH=1 (GBs)")  # fmt: skip


def node_pth(args: argparse.Namespace) -> None:
    venv_python = Path(args.venv) / "bin" / "python"
    site = subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    dirs, _ = torch_dirs()
    pth = Path(site) / "node-torch.pth"
    if dirs:
        # written by make setup WHEELS=...: these directories come after this venv's own site-packages
        pth.write_text("".join(f"{d}\n" for d in dirs))
        print(f"make setup: {pth.name} -> {', '.join(dirs)} (PYTHON's torch, reused)")
    else:
        pth.unlink(missing_ok=True)


def node_constraints(args: argparse.Namespace) -> None:
    print(f"# generated by make setup WHEELS=... from {args.constraints}: without the torch stack's and "
          f"{', '.join(sorted(TORCH_PAIRED))}'s pins (the node's own are reused)")  # fmt: skip
    for line in Path(args.constraints).read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==", line)
        if m and (TORCH_STACK.fullmatch(canonical(m[1])) or canonical(m[1]) in TORCH_PAIRED):
            continue
        print(line)


def origin(_: argparse.Namespace) -> None:
    import torch

    where = os.path.dirname(torch.__file__)
    inside = Path(where).resolve().is_relative_to(Path(sys.prefix).resolve())
    source = "installed from the wheelhouse" if inside else "PYTHON's own, reused through node-torch.pth"
    print(f"make setup: torch {torch.__version__} from {where} ({source})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True)
    b.add_argument("--python-version", required=True, help="e.g. 3.11")
    b.add_argument("--platform", required=True, help="e.g. manylinux_2_28_x86_64 (older manylinux tags included)")
    b.add_argument("--with-torch", action="store_true", help="also the torch stack (GBs)")
    b.add_argument("--constraints", default=str(REPO / "constraints.txt"))
    sub.add_parser("node-check").add_argument("wheels")
    sub.add_parser("node-pth").add_argument("venv")
    sub.add_parser("node-constraints").add_argument("constraints")
    sub.add_parser("origin")
    args = ap.parse_args()
    {"build": build, "node-check": node_check, "node-pth": node_pth, "node-constraints": node_constraints,
     "origin": origin}[args.cmd](args)  # fmt: skip


if __name__ == "__main__":
    main()

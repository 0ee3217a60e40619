"""`make wheelhouse` on a machine with the package index, then `make setup WHEELS=dir` on a "node" that reaches no
index and has its own torch (docs/real-data.md, "A GPU node without internet").

Opt-in (slow: the wheelhouse comes from the index, and the setup installs 85 wheels): make test-slow, or
`pytest tests/test_offline_install.py --run-slow`. The node is a copy of the working tree's files (tracked and
untracked, not ignored: no .venv, no build/) and a plain venv of the base interpreter whose torch stack is a directory
of symlinks to this test environment's torch, torchaudio and their dependencies, outside the wheelhouse."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import REPO

pytestmark = pytest.mark.slow

MAX_WHEELHOUSE_MB = 300  # measured: 85 wheels, 225 MB (CPython 3.11, manylinux_2_28_x86_64); the torch stack is GBs
TORCH_STACK = re.compile(r"torch|torchaudio|triton|nvidia-.+|cuda-.+")
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# no index and no pip configuration of this machine (its find-links or extra index would be reachable here)
PROXIES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy"}
MAKE_VARS = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}  # make test-slow's own command line
OFFLINE = {
    **{k: v for k, v in os.environ.items()
       if not k.startswith("PIP_") and k.lower() not in PROXIES and k not in MAKE_VARS | {"VIRTUAL_ENV", "PYTHONPATH"}},
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}  # fmt: skip


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(list(map(str, args)), cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out.stdout


def copy_worktree(dest: Path) -> None:
    """The working tree's files that git would carry (tracked, and untracked ones not ignored), as they are now."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")  # fmt: skip
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def torch_stack_links(dest: Path) -> None:
    """dest: a symlink per top-level entry (package, module, .dist-info) of torch, torchaudio and everything they
    require, transitively, from this test environment's site-packages: a torch the node has, not the wheelhouse's."""
    site = Path(importlib.metadata.distribution("torch").locate_file(""))
    dists = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(site)])}
    extras: dict[str, set[str]] = {}
    todo = [("torch", set()), ("torchaudio", set())]
    while todo:
        name, want = todo.pop()
        if name not in dists or (name in extras and want <= extras[name]):
            continue
        extras[name] = extras.get(name, set()) | want
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras[name])):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    dest.mkdir()
    for name in extras:
        for top in {f.parts[0] for f in dists[name].files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not top.endswith(".pth") and not (dest / top).exists():
                (dest / top).symlink_to(site / top)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("offline")
    repo, wheels = root / "repo", root / "wheelhouse"
    copy_worktree(repo)
    # on the machine with the index (this one, as configured): the wheelhouse for the node's Python
    run(["make", "wheelhouse", f"WHEELHOUSE={wheels}", f"PYTHON={sys.executable}", f"WHEEL_PYTHON={PY}"], repo,
        {k: v for k, v in os.environ.items() if k not in MAKE_VARS})  # fmt: skip
    # the node: a plain venv of the base interpreter, its torch stack outside the wheelhouse and outside that venv
    python = root / "node" / "bin" / "python"
    run([Path(sys.base_prefix) / "bin" / f"python{PY}", "-m", "venv", "--without-pip", root / "node"], root)
    torch_stack_links(root / "torch-stack")
    node_site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root).strip()
    (Path(node_site) / "torch-stack.pth").write_text(f"{root / 'torch-stack'}\n")
    node_torch = run([python, "-c", "import torch, torchaudio; print(torch.__file__)"], root, OFFLINE).strip()
    setup = run(["make", "setup", f"WHEELS={wheels}", f"PYTHON={python}"], repo, OFFLINE)
    return {"repo": repo, "wheels": wheels, "node_torch": Path(node_torch), "setup": setup}


def test_wheelhouse_is_small_names_its_target_and_has_no_torch(node: dict) -> None:
    wheels = sorted(node["wheels"].glob("*.whl"))
    names = {canonicalize_name(w.name.split("-")[0]) for w in wheels}
    assert not {n for n in names if TORCH_STACK.fullmatch(n)}
    assert {"transformers", "webdataset", "hatchling", "editables", "pytest", "torchcodec"} <= names
    mb = sum(w.stat().st_size for w in wheels) / 1e6
    assert mb < MAX_WHEELHOUSE_MB, f"{len(wheels)} wheels, {mb:.0f} MB"
    manifest = json.loads((node["wheels"] / "wheelhouse.json").read_text())
    assert (manifest["python_version"], manifest["with_torch"]) == (PY, False)
    assert sorted(manifest["wheels"]) == sorted(w.name for w in wheels)
    readme = (node["wheels"] / "README.md").read_text()
    assert f"CPython {PY} on manylinux_2_28_" in readme and "Excludes: the torch stack" in readme


def test_offline_setup_reuses_the_nodes_torch(node: dict) -> None:
    assert "PYTHON's own, reused through node-torch.pth" in node["setup"]
    venv = node["repo"] / ".venv"
    code = (
        "import json, torch, tokenizer_pipeline, adapter_trainer, transformers, webdataset; "
        "print(json.dumps({m.__name__: m.__file__ for m in (torch, tokenizer_pipeline, adapter_trainer)}))"
    )
    files = json.loads(run([venv / "bin" / "python", "-c", code], node["repo"], OFFLINE).splitlines()[-1])
    assert Path(files["torch"]) == node["node_torch"]  # the node's torch: the same file, not a copy in .venv
    assert not list(venv.glob("lib/python*/site-packages/torch"))
    for pkg in ("tokenizer_pipeline", "adapter_trainer"):  # editable: the copy's sources
        assert Path(files[pkg]).is_relative_to(node["repo"] / "packages" / pkg / "src")


def test_offline_venv_runs_the_packages_and_the_tests(node: dict) -> None:
    python = node["repo"] / ".venv" / "bin" / "python"
    cfg = run([python, "-m", "adapter_trainer", "+experiment=demo", "--cfg", "job"], node["repo"], OFFLINE)
    assert "max_seq_len: 128" in cfg
    # pytest from the wheelhouse, the repository's tests of the GPU check's attention-kernel rules, the node's torch
    out = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/trainer/model/test_sdpa_kernel_rules.py"],
              node["repo"], {**OFFLINE, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert re.search(r"\d+ passed", out)

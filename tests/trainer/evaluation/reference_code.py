"""Functions of the reference implementations, read from their installed source files (test-only pins, installed
`--no-deps` by `make setup`: fadtk 1.1.0 needs numpy < 2 and transformers < 5, audiocraft 1.3.0 pins torch 2.1).

Their packages' `__init__` imports model loaders and dependencies this environment does not have, so the named
top-level functions (or class methods) are taken from the installed file with `ast` and executed alone, with the
names they use (numpy, scipy.linalg, torch, torchaudio, a logger) in their namespace: their code, unchanged."""

from __future__ import annotations

import ast
import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np


def source_file(package: str, relative: str) -> Path:
    """The installed file of a package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, (
        f"{package} is not installed: run `make setup` (it installs the test-only pins fadtk==1.1.0 and "
        f"audiocraft==1.3.0 with --no-deps)"
    )
    return Path(spec.submodule_search_locations[0]) / relative


def load_functions(package: str, relative: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Top-level functions `names` (or "Class.method") of an installed file, executed in `namespace`."""
    tree = ast.parse(source_file(package, relative).read_text(encoding="utf-8"))
    nodes = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    out, ns = {}, dict(namespace)
    for name in names:
        cls, _, meth = name.partition(".")
        node = nodes[cls]
        if meth:
            node = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == meth)
        exec(compile(ast.Module(body=[node], type_ignores=[]), str(relative), "exec"), ns)
        out[name] = ns[node.name]
    return out


def fadtk() -> dict[str, Any]:
    """fadtk 1.1.0's fad.py calc_embd_statistics and calc_frechet_distance, and model_loader.py's CLAPLaionModel
    windowing (_get_embedding with its int16 round trip)."""
    import scipy.linalg
    from numpy.lib.scimath import sqrt as scisqrt

    ns = {"np": np, "linalg": scipy.linalg, "scisqrt": scisqrt, "log": logging.getLogger("fadtk")}
    fns = load_functions("fadtk", "fad.py", ["calc_embd_statistics", "calc_frechet_distance"], ns)
    import torch

    methods = ["CLAPLaionModel._get_embedding", "CLAPLaionModel.int16_to_float32", "CLAPLaionModel.float32_to_int16"]
    fns.update(load_functions("fadtk", "model_loader.py", methods, {"np": np, "torch": torch}))
    return fns


def audiocraft() -> dict[str, Any]:
    """audiocraft 1.3.0's data/audio_utils.py normalize_loudness and metrics/kld.py kl_divergence."""
    import torch
    import torchaudio

    fns = load_functions(
        "audiocraft", "data/audio_utils.py", ["normalize_loudness"], {"torch": torch, "torchaudio": torchaudio}
    )
    fns.update(load_functions("audiocraft", "metrics/kld.py", ["kl_divergence"], {"torch": torch}))
    return fns

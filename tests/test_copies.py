"""The code both packages need, kept as one copy per package (neither imports the other), must stay identical.

Each copy says `Copied from tokenizer_pipeline/...; tests/test_copies.py keeps them identical` (in its module docstring,
or in a comment above a copied definition).
A whole-module copy is compared byte for byte after its docstring; a partial copy by the source text of the named
top-level definitions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import REPO

PIPELINE = REPO / "packages" / "tokenizer_pipeline" / "src" / "tokenizer_pipeline"
TRAINER = REPO / "packages" / "adapter_trainer" / "src" / "adapter_trainer"
MARK = "; tests/test_copies.py keeps them identical"

# (original in tokenizer_pipeline, copy in adapter_trainer, the names copied; None = all but the module docstring)
COPIES = [
    (
        "remote/retry.py",
        "data/remote/retry.py",
        ("TRANSIENT_NAMES", "_chain", "http_status", "retry_after_s", "is_transient", "describe"),
    ),
    ("shards/keys.py", "data/sample_keys.py", None),
    ("hydra_cli.py", "hydra_cli.py", None),
    ("codec/encode.py", "model/builders.py", ("_looks_like_path",)),
    ("codec/decode_api.py", "generation/api.py", ("PAD_CODE",)),
]


def after_docstring(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    doc = ast.parse(text).body[0]
    return text.split("\n", doc.end_lineno)[-1]


def definitions(path: Path) -> dict[str, str]:
    """Top-level name -> its source text (functions, classes and assignments)."""
    text = path.read_text(encoding="utf-8")
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.get_source_segment(text, node)
    return out


def copy_problems(original: Path, copy: Path, names: tuple[str, ...] | None) -> list[str]:
    """What differs between `original` and its `copy`, and whether the copy names its original."""
    problems = []
    mark = f"Copied from tokenizer_pipeline/{original.relative_to(PIPELINE).as_posix()}{MARK}"
    if mark not in copy.read_text(encoding="utf-8"):
        problems.append(f"{copy}: lacks {mark!r}")
    if names is None:
        if after_docstring(original) != after_docstring(copy):
            problems.append(f"{copy} differs from {original}")
        return problems
    ours, theirs = definitions(original), definitions(copy)
    problems += [f"{name}: not in {original}" for name in names if name not in ours]
    problems += [f"{name}: {copy} differs from {original}" for name in names if ours.get(name) != theirs.get(name)]
    return problems


@pytest.mark.parametrize("original, copy, names", COPIES, ids=[c for _, c, _ in COPIES])
def test_each_copy_is_identical_to_its_original(original: str, copy: str, names: tuple[str, ...] | None) -> None:
    assert copy_problems(PIPELINE / original, TRAINER / copy, names) == []


def test_a_copy_that_drifts_is_caught(tmp_path: Path) -> None:
    original, copy, names = COPIES[0]
    drifted = tmp_path / "copy.py"
    text = (TRAINER / copy).read_text(encoding="utf-8")
    drifted.write_text(text.replace("408, 425, 429", "408, 429", 1), encoding="utf-8")
    assert copy_problems(PIPELINE / original, drifted, names)
    drifted.write_text(text.replace("Copied from", "Taken from"), encoding="utf-8")
    assert copy_problems(PIPELINE / original, drifted, names)

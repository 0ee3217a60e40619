"""Every JSON file either package writes is strict JSON: each json.dump/json.dumps call passes allow_nan=False, so a
NaN or infinity fails where it is made instead of reaching a reader that rejects `NaN` (the shard contract's JSON,
run outputs, download summaries)."""

from __future__ import annotations

import ast

from tests import REPO

PACKAGES = [REPO / "packages" / "tokenizer_pipeline" / "src", REPO / "packages" / "adapter_trainer" / "src"]


def _lenient_json_calls() -> list[str]:
    found = []
    for root in PACKAGES:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                f = node.func
                if not (isinstance(f.value, ast.Name) and f.value.id == "json" and f.attr in ("dump", "dumps")):
                    continue
                strict = any(
                    k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in node.keywords
                )
                if not strict:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_every_json_writer_refuses_nan() -> None:
    assert _lenient_json_calls() == []


def test_the_check_sees_json_calls() -> None:
    # the walk must reach the writers it guards: the pipeline's strict dumps helper is one of them
    n = 0
    for root in PACKAGES:
        for path in root.rglob("*.py"):
            n += path.read_text().count("json.dump")
    assert n >= 8

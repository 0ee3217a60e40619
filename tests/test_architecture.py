"""The import rules docs/architecture.md promises, checked on the source (ast, nothing imported):

- the two packages never import each other (the shard format is their only interface);
- adapter_trainer's rooms import one way (ALLOWED below): data/ imports no other room, model/ and evaluation/
  only data/; nothing but `__main__` imports the training recipe (statically: the package's lazy `recipe_main`
  export is by name); generation/ imports no training code but the library modules it shares with the recipe
  (device, checkpoint); demo/ is imported by no other room;
- the bottom of the top level (errors, conf_dir, config) imports no room, and each room imports only the
  top-level modules listed in TOP_ALLOWED (never `__main__` or a command module);
- the top-level command modules only forward to the room that holds the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import REPO

SRC = {pkg: REPO / "packages" / pkg / "src" / pkg for pkg in ("tokenizer_pipeline", "adapter_trainer")}
TRAINER = SRC["adapter_trainer"]
ROOMS = ("model", "data", "training", "generation", "evaluation", "demo")
COMMANDS = ("generate", "probe", "demo_models", "listen_page", "listen_check", "audio_metrics")


def module_name(path: Path, pkg: str) -> str:
    rel = path.relative_to(SRC[pkg]).with_suffix("")
    parts = [pkg, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, pkg: str) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved; function-level imports too)."""
    here = module_name(path, pkg).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def modules(pkg: str) -> dict[str, set[str]]:
    return {module_name(p, pkg): imports_of(p, pkg) for p in sorted(SRC[pkg].rglob("*.py"))}


def room_of(name: str) -> str:
    """`adapter_trainer.<room>[.module[.name]]` -> room; anything else of the package -> "top"."""
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in ROOMS else "top"


def top_module(name: str) -> str:
    """`adapter_trainer.config.ConfigError` -> `adapter_trainer.config` (for imports of top-level modules)."""
    return ".".join(name.split(".")[:2])


def test_the_import_scanner_sees_imports() -> None:
    """Guards the rules below against a scanner that finds nothing (they would pass vacuously)."""
    mods = modules("adapter_trainer")
    assert "adapter_trainer.training.recipe" in mods["adapter_trainer.__main__"]
    assert "adapter_trainer.model.builders" in mods["adapter_trainer.training.recipe"]
    assert "tokenizer_pipeline.errors" in modules("tokenizer_pipeline")["tokenizer_pipeline.cli"]  # relative import


@pytest.mark.parametrize(
    "pkg, other", [("tokenizer_pipeline", "adapter_trainer"), ("adapter_trainer", "tokenizer_pipeline")]
)
def test_the_packages_never_import_each_other(pkg: str, other: str) -> None:
    bad = {m: sorted(i for i in imps if i.split(".")[0] == other) for m, imps in modules(pkg).items()}
    assert not {m: v for m, v in bad.items() if v}


def test_nothing_but_main_imports_the_recipe() -> None:
    users = sorted(m for m, imps in modules("adapter_trainer").items() if "adapter_trainer.training.recipe" in imps)
    assert users == ["adapter_trainer.__main__"]


ALLOWED = {  # room -> rooms it may import from (besides itself and the top level)
    "model": {"data"},  # the token layout: vocab and ignore index
    "data": set(),
    "training": {"model", "data", "evaluation"},
    "generation": {"model", "data", "training"},  # training.device / training.checkpoint only (checked below)
    "evaluation": {"data"},
    "demo": {"model"},
}


def test_rooms_import_one_way() -> None:
    bad = []
    for mod, imps in modules("adapter_trainer").items():
        room = room_of(mod)
        if room == "top":
            continue
        for imp in imps:
            if imp.split(".")[0] != "adapter_trainer" or room_of(imp) in ("top", room):
                continue
            if room_of(imp) not in ALLOWED[room]:
                bad.append(f"{mod} -> {imp}")
    assert not bad


BOTTOM = {  # top-level modules every room may use, and what they themselves may import from the package
    "adapter_trainer.errors": set(),
    "adapter_trainer.conf_dir": set(),
    "adapter_trainer.config": {"adapter_trainer.errors"},
}
TOP_ALLOWED = {  # room -> top-level modules it may import (never __main__ or a command module)
    "data": {"adapter_trainer.errors"},
    "model": {"adapter_trainer.config", "adapter_trainer.errors"},
    "evaluation": {"adapter_trainer.errors"},
    "demo": {"adapter_trainer.config", "adapter_trainer.errors"},
    "training": {"adapter_trainer.config", "adapter_trainer.errors"},
    "generation": {"adapter_trainer.config", "adapter_trainer.errors", "adapter_trainer.conf_dir"},
}


def test_bottom_modules_import_no_room() -> None:
    mods = modules("adapter_trainer")
    for mod, allowed in BOTTOM.items():
        own = {top_module(i) for i in mods[mod] if i.split(".")[0] == "adapter_trainer"}
        assert own <= allowed, (mod, sorted(own - allowed))


def test_rooms_import_only_the_bottom_of_the_top_level() -> None:
    bad = []
    for mod, imps in modules("adapter_trainer").items():
        room = room_of(mod)
        if room == "top":
            continue
        for imp in imps:
            is_top = imp.split(".")[0] == "adapter_trainer" and room_of(imp) == "top" and imp != "adapter_trainer"
            if is_top and top_module(imp) not in TOP_ALLOWED[room]:
                bad.append(f"{mod} -> {imp}")
    assert not bad


def test_generation_uses_only_the_shared_training_library() -> None:
    shared = ("adapter_trainer.training.device", "adapter_trainer.training.checkpoint")
    bad = [
        f"{mod} -> {imp}"
        for mod, imps in modules("adapter_trainer").items()
        if room_of(mod) == "generation"
        for imp in imps
        if room_of(imp) == "training" and imp != "adapter_trainer.training" and not imp.startswith(shared)
    ]
    assert not bad


@pytest.mark.parametrize("command", COMMANDS)
def test_command_modules_only_forward_to_a_room(command: str) -> None:
    path = TRAINER / f"{command}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert len(imports) == 1 and isinstance(imports[0], ast.ImportFrom)
    assert room_of(imports[0].module) in ROOMS and [a.name for a in imports[0].names] == ["main"]
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not defs, f"{path.name} should hold no code of its own"

"""The import rules docs/architecture.md promises, checked on the source (ast, nothing imported).

Both packages:
- they never import each other (the shard format is their only interface);
- each is cut into rooms (subpackages) that import one way (`RULES[pkg].allowed`); the bottom of the top level
  (errors, config, ...) imports no room, and a room imports only that bottom of the top level;
- a top-level command module (`python -m <pkg>.<command>`) holds its command's parsing and `main` (or imports `main`
  from a room), does no work at import time, and ends with a guard that keeps main's exit status
  (`raise SystemExit(main())`; `main()` only where main returns None);
- the top level holds nothing else but the bottom and the package's entry (`__init__`, `__main__`, `cli`);
- no module is over `MAX_MODULE_LINES` lines (one concern per module); adapter_trainer's training recipe is held to
  `MAX_RECIPE_LINES`;
- no import circle between its modules (`import_cycles`), counting every import the source writes: at module level,
  inside a function (lazy), and under `if TYPE_CHECKING:` (a type-only import still ties the two modules together).
  An import of `<pkg>.<room>.<module>.<Name>` is one of that module, `from <pkg>.<room> import <module>` one of that
  module, and any other import of a package one of its `__init__`.

adapter_trainer: data/ imports no other room, model/ and evaluation/ only data/; nothing but `__main__` imports the
training recipe (statically: the package's lazy `recipe_main` export is by name); generation/ imports no training code
but the library modules it shares with the recipe (device, checkpoint), nor does sharing/ (export); demo/ is imported
by no other room.

tokenizer_pipeline: shards/ (the contract) imports no room, audio/ (reading files) only shards/; sources/ never imports the
encoder (codec/); demo/ is imported by nothing but its command modules.

Every rule is a function returning its violations, so the tests below also run it on mutated copies of the source
(`test_a_rule_broken_in_a_copy_is_caught`): a rule that cannot fail would pass vacuously.
"""

from __future__ import annotations

import ast
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import REPO

SRC = {pkg: REPO / "packages" / pkg / "src" / pkg for pkg in ("tokenizer_pipeline", "adapter_trainer")}
TRAINER = SRC["adapter_trainer"]
MAX_MODULE_LINES = 500
MAX_RECIPE_LINES = 450  # the recipe reads top to bottom (setup sequence, loop, cleanup); the rest is library
RECIPE = "training/recipe.py"  # relative to adapter_trainer's src dir


@dataclass(frozen=True)
class Rules:
    """One package's house: its rooms, who may import whom, and its bottom and command modules."""

    rooms: tuple[str, ...]
    allowed: dict[str, set[str]]  # room -> rooms it may import from (besides itself and the top level)
    bottom: dict[str, set[str]]  # bottom top-level module -> top-level modules of the package it may import
    top_allowed: dict[str, set[str]]  # room -> top-level modules it may import (never __main__ or a command)
    commands: tuple[str, ...]  # top-level command modules: a command's parsing and `main`, no work at import time
    entry: tuple[str, ...]  # the other top-level modules (package, `python -m <pkg>`, its Hydra parsing)
    demo_users: set[str] = field(default_factory=set)  # the only modules outside demo/ that may import it


PIPELINE_BOTTOM = {"tokenizer_pipeline.errors", "tokenizer_pipeline.hydra_cli", "tokenizer_pipeline.config"}
RULES = {
    "adapter_trainer": Rules(
        rooms=("model", "data", "training", "generation", "evaluation", "demo", "sharing"),
        allowed={
            "model": {"data"},  # the token layout: vocab and ignore index
            # export reads a run's checkpoint (training.checkpoint) and the sampling defaults (generation.config)
            "sharing": {"model", "data", "training", "generation"},
            "data": set(),
            "training": {"model", "data", "evaluation"},
            "generation": {"model", "data", "training"},  # training.device / training.checkpoint only (checked below)
            "evaluation": {"data"},
            "demo": {"model", "data"},  # the demo MusicGen pretrains on a shard set's codes
        },
        bottom={
            "adapter_trainer.errors": set(),
            "adapter_trainer.hydra_cli": set(),
            "adapter_trainer.config": {"adapter_trainer.errors"},
            "adapter_trainer.file_modes": set(),
        },
        top_allowed={
            "data": {"adapter_trainer.errors", "adapter_trainer.hydra_cli"},  # hints quoted for Hydra and the shell
            "model": {"adapter_trainer.config", "adapter_trainer.errors"},
            "evaluation": {"adapter_trainer.errors"},
            "demo": {"adapter_trainer.config", "adapter_trainer.errors", "adapter_trainer.file_modes"},
            "training": {
                "adapter_trainer.config",
                "adapter_trainer.errors",
                "adapter_trainer.file_modes",
                "adapter_trainer.hydra_cli",  # the resume and next-step commands quoted for Hydra and the shell
            },
            "generation": {
                "adapter_trainer.config",
                "adapter_trainer.errors",
                "adapter_trainer.hydra_cli",
            },
            "sharing": {"adapter_trainer.config", "adapter_trainer.errors", "adapter_trainer.file_modes"},
        },
        commands=("generate", "export", "probe", "demo_models", "listen_page", "listen_check", "audio_metrics"),
        entry=("__init__", "__main__"),
        demo_users={
            "adapter_trainer.demo_models",
            "adapter_trainer.listen_page",
            "adapter_trainer.listen_check",
            "adapter_trainer.demo",
        },
    ),
    "tokenizer_pipeline": Rules(
        rooms=("sources", "audio", "codec", "shards", "run", "fetch", "demo", "remote"),
        allowed={
            "shards": set(),  # the contract: keys, records, the tar writer, verify
            "audio": {"shards"},  # reading audio files; a clip's failure speaks the contract's reasons
            "codec": {"audio", "shards"},  # decode reads shard sets; embeddings read wavs
            "sources": {"audio", "shards"},  # headers for planning, the key rule; never the encoder
            "run": {"sources", "audio", "codec", "shards"},
            "fetch": {"sources", "audio", "shards"},  # the CSV rows, the ffmpeg cut
            "demo": {"audio"},
            "remote": {"shards"},  # push and verify a set at a URL: the contract's verify on what it reads
        },
        bottom={
            "tokenizer_pipeline.errors": set(),
            "tokenizer_pipeline.hydra_cli": set(),
            "tokenizer_pipeline.config": set(),
            "tokenizer_pipeline.dir_lock": {"tokenizer_pipeline.errors"},
        },
        top_allowed={
            "shards": PIPELINE_BOTTOM,
            "audio": PIPELINE_BOTTOM,
            "codec": PIPELINE_BOTTOM,
            "sources": PIPELINE_BOTTOM,
            "run": PIPELINE_BOTTOM | {"tokenizer_pipeline.dir_lock"},
            "fetch": PIPELINE_BOTTOM | {"tokenizer_pipeline.dir_lock"},
            "demo": PIPELINE_BOTTOM,
            "remote": PIPELINE_BOTTOM,
        },
        commands=("download", "decode", "verify", "push", "codec_embeddings", "standin_corpus", "demo_codec"),
        entry=("__init__", "__main__"),
        demo_users={"tokenizer_pipeline.standin_corpus", "tokenizer_pipeline.demo_codec"},
    ),
}


def module_name(path: Path, pkg: str, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [pkg, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, pkg: str, root: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved; function-level imports too)."""
    here = module_name(path, pkg, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            names = {f"{mod}.{alias.name}" for alias in node.names}  # `from pkg import module` names the module
            found.update(names)
            if not all(_is_module(name, pkg, root) for name in names):  # a name defined in `mod`: it imports `mod`
                found.add(mod)
    return found


def _is_module(name: str, pkg: str, root: Path) -> bool:
    """Whether `name` is a module (or subpackage) of `pkg`, whose source is under `root`."""
    parts = name.split(".")
    if parts[0] != pkg or len(parts) < 2:
        return False
    path = root.joinpath(*parts[1:])
    return path.with_name(path.name + ".py").is_file() or (path / "__init__.py").is_file()


def modules(pkg: str, root: Path | None = None) -> dict[str, set[str]]:
    root = root or SRC[pkg]
    return {module_name(p, pkg, root): imports_of(p, pkg, root) for p in sorted(root.rglob("*.py"))}


def room_of(name: str) -> str:
    """`<pkg>.<room>[.module[.name]]` -> room; anything else of the package -> "top"."""
    parts = name.split(".")
    rooms = RULES[parts[0]].rooms if parts[0] in RULES else ()
    return parts[1] if len(parts) >= 2 and parts[1] in rooms else "top"


def top_module(name: str) -> str:
    """`adapter_trainer.config.ConfigError` -> `adapter_trainer.config` (for imports of top-level modules)."""
    return ".".join(name.split(".")[:2])


def own(pkg: str, imp: str) -> bool:
    return imp.split(".")[0] == pkg


# ------------------------------------------------------------------------------------------------- rules


def cross_package_imports(pkg: str, mods: dict[str, set[str]]) -> list[str]:
    other = next(p for p in SRC if p != pkg)
    return [f"{m} -> {i}" for m, imps in mods.items() for i in sorted(imps) if own(other, i)]


def room_violations(pkg: str, mods: dict[str, set[str]]) -> list[str]:
    rules = RULES[pkg]
    bad = []
    for mod, imps in mods.items():
        room = room_of(mod)
        if room == "top":
            continue
        for imp in sorted(imps):
            if not own(pkg, imp) or room_of(imp) in ("top", room):
                continue
            if room_of(imp) not in rules.allowed[room]:
                bad.append(f"{mod} -> {imp}")
    return bad


def bottom_violations(pkg: str, mods: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, allowed in RULES[pkg].bottom.items():
        used = {top_module(i) for i in mods[mod] if own(pkg, i)} - {pkg}
        bad += [f"{mod} -> {u}" for u in sorted(used - allowed)]
    return bad


def top_level_violations(pkg: str, mods: dict[str, set[str]]) -> list[str]:
    """A room imports only the top-level modules its rules list (never __main__, cli or a command module)."""
    rules = RULES[pkg]
    bad = []
    for mod, imps in mods.items():
        room = room_of(mod)
        if room == "top":
            continue
        for imp in sorted(imps):
            is_top = own(pkg, imp) and room_of(imp) == "top" and imp != pkg
            if is_top and top_module(imp) not in rules.top_allowed[room]:
                bad.append(f"{mod} -> {imp}")
    return bad


def demo_importers(pkg: str, mods: dict[str, set[str]]) -> list[str]:
    """Modules outside demo/ that import it, other than its command modules."""
    users = RULES[pkg].demo_users
    return [
        f"{m} -> {i}"
        for m, imps in mods.items()
        if room_of(m) != "demo" and m not in users
        for i in sorted(imps)
        if own(pkg, i) and room_of(i) == "demo"
    ]


def command_problems(pkg: str, command: str, root: Path | None = None) -> list[str]:
    """A command module holds its command (`main`, its own or imported from a room) and does no work at import time:
    module level holds imports, definitions, constants (no call) and, last, the guard that keeps main's status."""
    path = (root or SRC[pkg]) / f"{command}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    problems = []
    for node in body:
        is_constant = isinstance(node, (ast.Assign, ast.AnnAssign)) and not any(
            isinstance(n, ast.Call) for n in ast.walk(node)
        )
        kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
        if not (isinstance(node, kinds) or is_constant or _is_main_guard(node)):
            problems.append(f"{path.name}: work at import time: {ast.unparse(node)[:60]!r}")
    if not body or not _is_main_guard(body[-1]) or sum(map(_is_main_guard, body)) != 1:
        problems.append(f'{path.name}: must end with its one `if __name__ == "__main__":`')
        return problems
    call = ast.unparse(body[-1].body[0]) if len(body[-1].body) == 1 else ""
    if not (
        call == "raise SystemExit(main())" or (call == "main()" and _main_returns_none(root or SRC[pkg], pkg, command))
    ):
        problems.append(
            f"{path.name}: the guard must be `raise SystemExit(main())` (or `main()` where main returns None), "
            f"so `python -m` exits with main's status; found {call or 'no single statement'!r}"
        )
    return problems


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and not node.orelse and ast.unparse(node.test) == "__name__ == '__main__'"


def _main_returns_none(root: Path, pkg: str, command: str) -> bool:
    """Whether the command's `main` (its own, or the room function it imports) is annotated `-> None` (a Hydra main:
    it raises SystemExit itself for a status)."""
    path = root / f"{command}.py"
    for _ in range(2):
        if not path.is_file():
            return False
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "main":
                return isinstance(node.returns, ast.Constant) and node.returns.value is None
        module = next(
            (
                n.module or ""
                for n in tree.body
                if isinstance(n, ast.ImportFrom) and "main" in [a.name for a in n.names]
            ),
            "",
        )
        path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return False


def modules_outside_rooms(pkg: str, root: Path | None = None) -> list[str]:
    """Top-level modules that are neither the bottom, a command, nor the package's entry: code belongs in a room."""
    rules = RULES[pkg]
    known = {m.split(".")[-1] for m in rules.bottom} | set(rules.commands) | set(rules.entry)
    return [p.name for p in sorted((root or SRC[pkg]).glob("*.py")) if p.stem not in known]


def sources_import_the_encoder(mods: dict[str, set[str]]) -> list[str]:
    """sources/ plans what to encode from files and metadata alone: no codec room, no model library."""
    banned = ("tokenizer_pipeline.codec", "transformers", "encodec")
    return [
        f"{m} -> {i}"
        for m, imps in mods.items()
        if room_of(m) == "sources"
        for i in sorted(imps)
        if any(i == b or i.startswith(b + ".") for b in banned)
    ]


def import_graph(pkg: str, mods: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: an imported name counts as the longest module it starts with
    (`<pkg>.<room>.<module>.<Name>` -> `<pkg>.<room>.<module>`; `<pkg>.<room>` -> the room's `__init__`)."""
    graph: dict[str, set[str]] = {}
    for mod, imps in mods.items():
        targets = set()
        for imp in imps:
            parts = imp.split(".") if own(pkg, imp) else []
            prefixes = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
            targets.add(next((p for p in prefixes if p in mods), ""))
        graph[mod] = targets - {"", mod}
    return graph


def _circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest import path from `start` back to itself (breadth first), or None when none leads back."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


def import_cycles(pkg: str, mods: dict[str, set[str]]) -> list[str]:
    """Import circles between the package's modules, each as `a -> b -> ... -> a` (one per module not already on a
    reported circle). Every import the scanner sees counts: module level, function level and `if TYPE_CHECKING:`."""
    graph = import_graph(pkg, mods)
    found: list[str] = []
    seen: set[str] = set()
    for start in sorted(graph):
        circle = None if start in seen else _circle_through(graph, start)
        if circle:
            found.append(" -> ".join(circle))
            seen.update(circle)
    return found


def long_modules(root: Path) -> list[str]:
    lengths = {
        p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in root.rglob("*.py")
    }
    return [f"{name}: {n} lines" for name, n in sorted(lengths.items()) if n > MAX_MODULE_LINES]


def long_recipe(root: Path) -> list[str]:
    n = len((root / RECIPE).read_text(encoding="utf-8").splitlines())  # as long_modules counts
    return [f"{RECIPE}: {n} lines (at most {MAX_RECIPE_LINES})"] if n > MAX_RECIPE_LINES else []


# ------------------------------------------------------------------------------------------------- tests


def test_the_import_scanner_sees_imports() -> None:
    """Guards the rules below against a scanner that finds nothing (they would pass vacuously)."""
    mods = modules("adapter_trainer")
    assert "adapter_trainer.training.recipe" in mods["adapter_trainer.__main__"]
    assert "adapter_trainer.model.builders" in mods["adapter_trainer.training.recipe"]
    pipe = modules("tokenizer_pipeline")
    assert "tokenizer_pipeline.errors" in pipe["tokenizer_pipeline.__main__"]  # relative import
    assert "tokenizer_pipeline.codec.encode" in pipe["tokenizer_pipeline.run.pipeline"]  # `..codec.encode`
    assert "tokenizer_pipeline.sources.musiccaps" in pipe["tokenizer_pipeline.run.planning"]


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_the_packages_never_import_each_other(pkg: str) -> None:
    assert cross_package_imports(pkg, modules(pkg)) == []


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_every_room_exists_and_says_what_it_is(pkg: str) -> None:
    """Each room is a package whose docstring opens with one line naming its concern; no module sits outside a room."""
    for room in RULES[pkg].rooms:
        init = SRC[pkg] / room / "__init__.py"
        assert init.is_file(), f"{init} missing"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        first = doc.splitlines()[0] if doc else ""
        assert 20 <= len(first) <= 120 and first.endswith((".", ":")), f"{init}: one line first says the room's concern"
    dirs = {p.parent.relative_to(SRC[pkg]).parts[0] for p in SRC[pkg].rglob("*.py") if p.parent != SRC[pkg]}
    assert dirs <= set(RULES[pkg].rooms) | {"conf"}, sorted(dirs - set(RULES[pkg].rooms))


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_no_module_sits_outside_a_room_but_the_top_level_s_own(pkg: str) -> None:
    assert modules_outside_rooms(pkg) == []


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_rooms_import_one_way(pkg: str) -> None:
    assert room_violations(pkg, modules(pkg)) == []


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_bottom_modules_import_no_room(pkg: str) -> None:
    assert bottom_violations(pkg, modules(pkg)) == []


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_rooms_import_only_the_bottom_of_the_top_level(pkg: str) -> None:
    assert top_level_violations(pkg, modules(pkg)) == []


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_the_demo_room_is_imported_by_nothing_but_its_commands(pkg: str) -> None:
    assert demo_importers(pkg, modules(pkg)) == []


@pytest.mark.parametrize("pkg, command", [(p, c) for p in sorted(SRC) for c in RULES[p].commands])
def test_command_modules_hold_their_command_and_keep_its_status(pkg: str, command: str) -> None:
    assert command_problems(pkg, command) == []


def test_nothing_but_main_imports_the_recipe() -> None:
    users = sorted(m for m, imps in modules("adapter_trainer").items() if "adapter_trainer.training.recipe" in imps)
    assert users == ["adapter_trainer.__main__"]


def test_generation_and_sharing_use_only_the_shared_training_library() -> None:
    shared = ("adapter_trainer.training.device", "adapter_trainer.training.checkpoint")
    bad = [
        f"{mod} -> {imp}"
        for mod, imps in modules("adapter_trainer").items()
        if room_of(mod) in ("generation", "sharing")
        for imp in imps
        if room_of(imp) == "training" and imp != "adapter_trainer.training" and not imp.startswith(shared)
    ]
    assert not bad


def test_pipeline_sources_never_import_the_encoder() -> None:
    assert sources_import_the_encoder(modules("tokenizer_pipeline")) == []


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_no_import_circles(pkg: str) -> None:
    """Modules import one way inside a room too: a circle (even one closed only by a type-only import) means two
    modules each need the other, so code sits in the wrong one; it moves down (a shared type, a Protocol)."""
    assert import_cycles(pkg, modules(pkg)) == []


def test_the_import_graph_names_modules() -> None:
    """`from <pkg>.<room> import <module>` is an import of that module alone, a name's import one of its module."""
    graph = import_graph("adapter_trainer", modules("adapter_trainer"))
    assert graph["adapter_trainer.model.attention"] >= {"adapter_trainer.model.sdpa_kernels"}
    assert "adapter_trainer.model" not in graph["adapter_trainer.model.attention"]
    assert "adapter_trainer.data.token_layout" in graph["adapter_trainer.model.loss"]  # `...token_layout import Batch`


@pytest.mark.parametrize("pkg", sorted(SRC))
def test_no_module_is_over_the_limit(pkg: str) -> None:
    """One concern per module: a module past MAX_MODULE_LINES is cut by concern inside its room (as model/ keeps the
    MoT model, its layer, attention, KV cache and loss apart)."""
    assert long_modules(SRC[pkg]) == []


def test_the_recipe_stays_short() -> None:
    """The recipe reads top to bottom (setup's `_setup_*` sequence, the loop, cleanup): what grows beside them (data,
    eval, resume, logging, reports) goes to the training library module whose concern it is, not into the recipe."""
    assert long_recipe(TRAINER) == []


def test_the_pipeline_cli_is_the_only_top_level_user_of_the_run_room() -> None:
    """The run room is the stage's recipe: `__main__` drives it; no other room or command does."""
    users = sorted(
        m
        for m, imps in modules("tokenizer_pipeline").items()
        if room_of(m) != "run" and any(room_of(i) == "run" for i in imps if own("tokenizer_pipeline", i))
    )
    assert users == ["tokenizer_pipeline.__main__"]


# ------------------------------------------------------------------------------- the rules catch breakage


def _recipe_lines() -> int:
    return len((TRAINER / RECIPE).read_text(encoding="utf-8").splitlines())


TYPE_ONLY = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
# (package, file relative to its src dir, line appended, the check that must now report it)
MUTATIONS = [
    ("tokenizer_pipeline", "sources/plan.py", "from ..codec.encode import CodecEncoder", "sources_encoder"),
    ("tokenizer_pipeline", "sources/plan.py", "import transformers", "sources_encoder"),
    ("tokenizer_pipeline", "sources/plan.py", "from ..run.ranks import RankInfo", "rooms"),
    ("tokenizer_pipeline", "shards/verify.py", "from ..sources.musiccaps import ClipRow", "rooms"),
    ("tokenizer_pipeline", "audio/read_audio.py", "from ..codec.encode import resolve_device", "rooms"),
    ("tokenizer_pipeline", "run/loader.py", "from ..demo.demo_codec import main", "demo"),
    ("tokenizer_pipeline", "codec/decode.py", "from ..demo import standin_render", "demo"),
    ("tokenizer_pipeline", "config.py", "from .audio.read_audio import load_audio", "bottom"),
    ("tokenizer_pipeline", "errors.py", "from .shards import manifest", "bottom"),
    ("tokenizer_pipeline", "sources/musiccaps.py", "from ..cli import main", "top"),
    ("tokenizer_pipeline", "shards/keys.py", "import adapter_trainer.errors", "cross"),
    ("tokenizer_pipeline", "decode.py", "CONFIG = config_from_args(sys.argv[1:])", "command:decode"),
    ("tokenizer_pipeline", "run/finish.py", "\n" * MAX_MODULE_LINES, "length"),
    ("adapter_trainer", "model/mot.py", "\n" * MAX_MODULE_LINES, "length"),
    # blank lines that bring the recipe to one line over its limit (appended as "\n" + line + "\n")
    ("adapter_trainer", RECIPE, "\n" * (MAX_RECIPE_LINES - 1 - _recipe_lines()), "recipe_length"),
    ("adapter_trainer", "data/streaming.py", "from ..model import builders", "rooms"),
    ("adapter_trainer", "model/mot.py", "from ..demo import models", "demo"),
    ("adapter_trainer", "data/shards.py", "import tokenizer_pipeline.errors", "cross"),
    ("tokenizer_pipeline", "verify.py", "print('work at import time')", "command:verify"),
    ("adapter_trainer", "probe.py", "TIMEOUT_S = int('30')", "command:probe"),
    ("tokenizer_pipeline", "shortcut.py", "from .codec.encode import CodecEncoder", "outside_rooms"),
    ("adapter_trainer", "helpers.py", "from .model import builders", "outside_rooms"),
    # circles: the redo rule reading the decode side again (run/ had it: progress -> loader -> planning -> kept)
    ("tokenizer_pipeline", "run/progress.py", "from .loader import clip_failure", "cycles"),
    # one closed only by a type-only import (model/ had it: the loss naming the model class)
    ("adapter_trainer", "model/loss.py", TYPE_ONLY + "    from .mot import MoTAdapterModel", "cycles"),
    ("tokenizer_pipeline", "shards/manifest.py", TYPE_ONLY + "    from .write_shards import ShardPlan", "cycles"),
    # one through a function-level import, written `from <package> import <module>`
    ("adapter_trainer", "training/checkpoint.py", "def later():\n    from . import recipe", "cycles"),
]


def _violations(pkg: str, root: Path, check: str) -> list[str]:
    mods = modules(pkg, root)
    if check.startswith("command:"):
        return command_problems(pkg, check.split(":", 1)[1], root)
    return {
        "rooms": lambda: room_violations(pkg, mods),
        "demo": lambda: demo_importers(pkg, mods),
        "bottom": lambda: bottom_violations(pkg, mods),
        "top": lambda: top_level_violations(pkg, mods),
        "cross": lambda: cross_package_imports(pkg, mods),
        "sources_encoder": lambda: sources_import_the_encoder(mods),
        "length": lambda: long_modules(root),
        "recipe_length": lambda: long_recipe(root),
        "outside_rooms": lambda: modules_outside_rooms(pkg, root),
        "cycles": lambda: import_cycles(pkg, mods),
    }[check]()


@pytest.mark.parametrize("pkg, rel, line, check", MUTATIONS, ids=[f"{m[1]}:{m[3]}" for m in MUTATIONS])
def test_a_rule_broken_in_a_copy_is_caught(tmp_path: Path, pkg: str, rel: str, line: str, check: str) -> None:
    """Each rule passes on the real source (above) and reports a copy of it with the rule broken."""
    root = tmp_path / pkg
    shutil.copytree(SRC[pkg], root, ignore=shutil.ignore_patterns("__pycache__"))
    assert _violations(pkg, root, check) == [], "the unmutated copy must pass"
    target = root / rel
    before = target.read_text(encoding="utf-8") if target.exists() else ""  # a new file: a module added
    if check.startswith("command:"):  # before the guard: appended after it, any line breaks the guard-last rule
        guard = 'if __name__ == "__main__":'
        target.write_text(before.replace(guard, line + "\n\n\n" + guard), encoding="utf-8")
    else:
        target.write_text(before + "\n" + line + "\n", encoding="utf-8")
    assert _violations(pkg, root, check), f"{check} did not catch: {rel} + {line!r}"


# commands whose `main` returns an exit status (argparse mains): `main()` alone would drop it
STATUS_COMMANDS = [(p, c) for p in sorted(SRC) for c in RULES[p].commands if not _main_returns_none(SRC[p], p, c)]
GUARD_CASES = [(p, c, "main()") for p, c in STATUS_COMMANDS] + [
    (p, c, g) for p in sorted(SRC) for c in RULES[p].commands for g in ("pass", None)
]


@pytest.mark.parametrize("pkg, command, guard", GUARD_CASES, ids=[f"{c}:{g}" for _, c, g in GUARD_CASES])
def test_a_command_that_loses_main_s_exit_status_is_caught(
    tmp_path: Path, pkg: str, command: str, guard: str | None
) -> None:
    """`python -m <pkg>.<command>` must exit with main's status: `main()` alone exits 0 whatever an argparse main
    returns (1 for problems found, 2 for a user error), and a module without the guard, or whose guard does not
    call main, does nothing at all."""
    assert len(STATUS_COMMANDS) >= 8  # the argparse commands of both packages (a scanner that finds none is wrong)
    root = tmp_path / pkg
    shutil.copytree(SRC[pkg], root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / f"{command}.py"
    text = target.read_text(encoding="utf-8")
    tail = text[text.index('if __name__ == "__main__":') :]
    new_tail = "" if guard is None else f'if __name__ == "__main__":\n    {guard}\n'
    target.write_text(text.replace(tail, new_tail), encoding="utf-8")
    assert command_problems(pkg, command, root), f"{command}.py with guard {guard!r} was not reported"

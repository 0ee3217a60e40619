"""The commands the front page and the start-here pages show are right as written: each `python -m adapter_trainer`,
`python -m tokenizer_pipeline` and `python -m tokenizer_pipeline.download` line of their code blocks (also after
`torchrun ... -m`), and each `make audio|shards|train ... ARGS="..."` as the Makefile runs it, split as bash splits
it, passes its command's key check and composes into a valid config. Keys, groups and values are checked; the files
the commands name (shard sets, audio) are not read."""

from __future__ import annotations

import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from tests import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("start-*.md"))]
MODULES = ("adapter_trainer", "tokenizer_pipeline", "tokenizer_pipeline.download")
# make target -> (module, its variables as the Makefile passes them: VAR -> key); ARGS is split by the recipe's shell
MAKE_TARGETS = {
    "audio": ("tokenizer_pipeline.download", {"OUT": "out_dir"}),
    "shards": ("tokenizer_pipeline", {"DATA": "audio_dir", "OUT": "out_dir"}),
    "train": ("adapter_trainer", {}),
}


SHELL_FENCES = {"", "bash", "sh", "zsh", "shell", "console"}


def code_lines(text: str) -> list[str]:
    """The lines of `text`'s fenced blocks whose info string is a shell's (or none), read line by line (``` or ~~~
    fences, indented or not), continuation lines joined and a leading `$ ` prompt dropped."""
    lines, fence, shell = [], None, False
    for line in text.splitlines():
        m = re.match(r"\s*(`{3,}|~{3,})\s*([\w+-]*)", line)
        if m and fence is None:
            fence, shell = m.group(1), m.group(2).lower() in SHELL_FENCES
        elif m and line.strip().startswith(fence) and not m.group(2):
            fence = None
        elif fence is not None and shell:
            lines.append(line)
    joined = "\n".join(lines).replace("\\\n", " ")
    return [re.sub(r"^\s*\$\s+", "", line) for line in joined.splitlines()]


def shown_commands(text: str) -> list[tuple[str, list[str]]]:
    """(module, its arguments) of every command of `MODULES` in `text`'s shell blocks, split by shlex as bash splits
    them (comments dropped; `VAR=value` assignments before `make` skipped)."""
    found = []
    for line in code_lines(text):
        make = re.match(r"\s*(?:[A-Za-z_]\w*=\S*\s+)*make (audio|shards|train)\b", line)
        if not make and not any(f"-m {m}" in line for m in MODULES):
            continue  # output shown in a block, other commands
        words = shlex.split(line, comments=True)
        if make:
            module, variables = MAKE_TARGETS[make.group(1)]
            words = words[words.index("make") :]
            given = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            args = [f"{key}={given[var]}" for var, key in variables.items() if var in given]
            found.append((module, args + shlex.split(given.get("ARGS", ""))))
        elif "-m" in words:
            i = words.index("-m")
            if i + 1 < len(words) and words[i + 1] in MODULES:
                found.append((words[i + 1], [w for w in words[i + 2 :] if w != "..."]))
    return found


def _cases() -> list:
    return [
        pytest.param(module, args, id=f"{page.name}:{module}:{' '.join(args)[:60]}")
        for page in PAGES
        for module, args in shown_commands(page.read_text(encoding="utf-8"))
    ]


def test_the_pages_show_commands_of_every_module() -> None:
    modules = {module for module, _ in (c.values for c in _cases())}
    assert modules == set(MODULES), modules  # the extraction sees the commands (a page rewritten, a fence changed)


@pytest.mark.parametrize("module, args", _cases())
def test_a_shown_command_composes(module: str, args: list[str]) -> None:
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    if module == "adapter_trainer":
        from hydra.errors import CompactHydraException
        from omegaconf import OmegaConf

        from adapter_trainer.__main__ import KEYS_HINT
        from adapter_trainer.config import TrainConfig, shards_as_list, to_train_config
        from adapter_trainer.errors import UserError
        from adapter_trainer.hydra_cli import (
            config_groups,
            default_groups,
            find_conf_dir,
            refusal_line,
            undeclared_line,
        )

        conf, overrides = find_conf_dir(), shards_as_list(overrides)
        groups = config_groups(conf)
        try:  # what `python -m adapter_trainer` does with Hydra's refusal and with a key added by a +
            with initialize_config_dir(str(conf), version_base="1.3"):
                cfg = compose("config", overrides=overrides)
        except CompactHydraException as e:
            in_defaults = default_groups(conf / "config.yaml")
            raise UserError(refusal_line(overrides, TrainConfig, groups, in_defaults, KEYS_HINT) or str(e)) from e
        unknown = undeclared_line(OmegaConf.to_container(cfg), TrainConfig, overrides, groups, KEYS_HINT)
        if unknown:
            raise UserError(unknown)
        to_train_config(cfg)
        return
    from omegaconf import OmegaConf

    from tokenizer_pipeline.hydra_cli import config_groups as pipeline_groups
    from tokenizer_pipeline.hydra_cli import find_conf_dir as pipeline_conf
    from tokenizer_pipeline.hydra_cli import undeclared_line as pipeline_undeclared

    if module == "tokenizer_pipeline":
        from tokenizer_pipeline.__main__ import config_from_overrides
        from tokenizer_pipeline.config import PipelineConfig as schema

        primary, groups = "shards", pipeline_groups(pipeline_conf())
    else:
        from tokenizer_pipeline.fetch.config import DownloadConfig as schema
        from tokenizer_pipeline.fetch.download import config_from_overrides

        primary, groups = "download", set()
    with initialize_config_dir(str(pipeline_conf()), version_base="1.3"):  # Hydra refuses a key given without +
        composed = compose(primary, overrides=overrides)
    unknown = pipeline_undeclared(OmegaConf.to_container(composed), schema, overrides, groups, "")
    if unknown:
        from tokenizer_pipeline.errors import UserError

        raise UserError(unknown)
    config_from_overrides(overrides)


def test_the_rule_sees_a_wrong_shown_command() -> None:
    """A typo'd key or an unquoted zsh glob in a shown command is caught by the same path."""
    from adapter_trainer.errors import UserError

    page = "```bash\npython -m adapter_trainer +experiment=mps_small trainer.max_step=5   # a typo\n```\n"
    ((module, args),) = shown_commands(page)
    with pytest.raises(UserError, match="did you mean trainer.max_steps=5"):
        test_a_shown_command_composes(module, args)
    assert shown_commands("```bash\ntorchrun --nproc_per_node=2 -m tokenizer_pipeline \\\n  out_dir=x\n```") == [
        ("tokenizer_pipeline", ["out_dir=x"])
    ]
    assert shown_commands('```bash\nmake shards DATA=a OUT=b ARGS="limit=5 codec.device=auto"  # c\n```') == [
        ("tokenizer_pipeline", ["audio_dir=a", "out_dir=b", "limit=5", "codec.device=auto"])
    ]
    # a text block before a shell block does not hide it; ~~~ and `shell` fences, a `$ ` prompt, VAR=... make
    page = '```text\nnot a command\n```\n~~~shell\n$ CUDA_VISIBLE_DEVICES=0 make train ARGS="trainer.max_step=5"\n~~~\n'
    assert shown_commands(page) == [("adapter_trainer", ["trainer.max_step=5"])]

"""Hydra's own refusals are one line with the fix, in both stages (hydra_cli.py, one checked copy per package):
a value the override grammar cannot read names its quoted form, an option a config group lacks names the closest
one and every option, a value of the wrong type names the type and an example; the quoted forms paste back."""

from __future__ import annotations

import shlex
import subprocess
from types import SimpleNamespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from adapter_trainer.config import TrainConfig
from adapter_trainer.hydra_cli import config_groups, default_groups, find_conf_dir, group_options, refusal_line
from tokenizer_pipeline.hydra_cli import hydra_value, override_word, shell_word

CONF = find_conf_dir()
GROUPS = config_groups(CONF)


def _line(*argv: str) -> str | None:
    return refusal_line(list(argv), TrainConfig, GROUPS, default_groups(CONF / "config.yaml"), "HINT",
                        group_options(CONF, GROUPS))  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["+experiment=mps_smal"],
            "+experiment=mps_smal: experiment has no option 'mps_smal' (did you mean "
            "+experiment=mps_small?); its options: cuda_1b, demo, mps_small",
        ),
        (["+experiment=zzz"], "+experiment=zzz: experiment has no option 'zzz'; its options: cuda_1b, demo, mps_small"),
        (
            ["trainer.batch_size=two"],
            "trainer.batch_size=two: trainer.batch_size takes a whole number, not 'two'; e.g. trainer.batch_size=8",
        ),
        (["trainer.batch_size=2.5"], "takes a whole number, not '2.5'"),
        (["optimizer.lr=fast"], "optimizer.lr=fast: optimizer.lr takes a number, not 'fast'"),
        (["trainer.tensorboard=maybe"], "takes true or false, not 'maybe'; e.g. trainer.tensorboard="),
        (["trainer.output_dir=/tmp/Müsik ♪"], "type it as \"trainer.output_dir='/tmp/Müsik ♪'\""),
        (["data.shards=[~/sets/a,b c]"], "type it as \"data.shards=['~/sets/a','b c']\""),
    ],
)
def test_a_refused_override_is_one_line_naming_the_fix(argv: list[str], says: str) -> None:
    line = _line("+experiment=demo", *argv) if not argv[0].startswith("+experiment") else _line(*argv)
    assert line is not None and says in line, line
    assert "\n" not in line


@pytest.mark.parametrize(
    "argv", [["trainer.batch_size=8"], ["trainer.output_dir='/tmp/Müsik ♪'"], ["+experiment=demo"]]
)
def test_what_hydra_reads_is_not_refused(argv: list[str]) -> None:
    assert _line(*argv) is None


PATHS = [
    "build/x",
    "/tmp/Müsik ♪",
    "/tmp/a b/it's",
    "~/x",
    "C:\\music\\",
    "a\\b",
    "/x/$HOME !(bang)",
    "plain-1.5",
    "10",
    "1_0",
    "1e3",
    "null",
    "true",
    "inf",
    "nan",
    "-1.5",
]  # the last: plain for Hydra, yet not strings


@pytest.mark.parametrize("path", PATHS)
def test_a_quoted_override_reads_back_as_the_value_in_hydra_and_in_a_shell(path: str) -> None:
    """hydra_value is what Hydra parses, and OmegaConf composes, back to the path; override_word is what bash gives
    back as that override."""
    override = OverridesParser.create().parse_override(f"out_dir={hydra_value(path)}")
    assert OmegaConf.create({"out_dir": override.value()}).out_dir == path
    word = override_word("out_dir", path)
    echoed = subprocess.run(["bash", "-c", f"printf '%s' {word}"], capture_output=True, text=True, check=True).stdout
    assert echoed == f"out_dir={hydra_value(path)}"
    assert shlex.split(shell_word(echoed)) == [echoed]


def _hydra_values(command: str) -> dict[str, object]:
    """key -> value of each override of a printed command, as the shell splits it and Hydra then reads it."""
    parser = OverridesParser.create()
    return {o.key_or_group: o.value() for o in (parser.parse_override(w) for w in shlex.split(command) if "=" in w)}


def test_both_stages_print_hints_that_paste_back_for_a_path_with_a_space_and_non_ascii(tmp_path) -> None:
    from adapter_trainer.training.next_steps import next_steps, resume_command
    from tokenizer_pipeline.run.finish import RunResult, with_next_steps

    run = "runs/Müsik ♪"
    assert _hydra_values(resume_command(["+experiment=demo", "data.shards=[a]"], run))["trainer.output_dir"] == run
    listen = next(line for line in next_steps(["+experiment=demo", "trainer.seed=3"], run, 10) if "listen:" in line)
    assert _hydra_values(listen.split("&&")[0].split("listen:")[1])["trainer.output_dir"] == run
    out = tmp_path / "shards out ♪"
    manifest = SimpleNamespace(splits={"train": SimpleNamespace(n_samples=4), "eval": SimpleNamespace(n_samples=2)})
    result = with_next_steps(RunResult(manifest, out, 0, "ok"), "facebook/encodec_32khz", "train", "eval")  # type: ignore[arg-type]
    train = result.message.splitlines()[-1].split("(Apple")[0]
    assert _hydra_values(train)["data.shards"] == [str(out)]

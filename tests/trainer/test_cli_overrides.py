"""The trainer's command line (adapter_trainer.hydra_cli on Hydra's refusal and on the composed config): a key the
schema does not declare is refused in one line with the key it most likely meant, with a `+` or without, before any
model or shard set is read; legitimate overrides (groups, hydra.*, every declared key) pass; `data.shards` takes one
path or a comma list as well as a list."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep

from adapter_trainer.config import TrainConfig, shards_as_list
from adapter_trainer.hydra_cli import declared_keys
from tests.trainer.helpers import run_module_in_process


def _in_process(capfd: pytest.CaptureFixture[str], module: str, *args: str) -> subprocess.CompletedProcess:
    capfd.readouterr()
    code = run_module_in_process(module, *args)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([module, *args], code, out, err)


def _refused_in_one_line(proc: subprocess.CompletedProcess, must_say: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout and "HYDRA_FULL_ERROR" not in err, err[-2000:]
    assert len(err.splitlines()) == 1 and "error: " in err and must_say in err, err[-2000:]


@pytest.mark.parametrize(
    "override, must_say",
    [
        ("trainer.max_step=5", "did you mean trainer.max_steps=5?"),  # Hydra: "use +trainer.max_step=5"
        ("+trainer.max_step=5", "did you mean trainer.max_steps=5?"),  # Hydra: trains, max_steps unchanged
        ("++trainer.max_step=5", "did you mean trainer.max_steps=5?"),
        ("+max_step=5", "did you mean trainer.max_steps=5?"),  # the section left out
        ("optimizer.learning_rate=1e-4", "optimizer.learning_rate is not a config key"),
        ("+data.cache.polcy=lru", "did you mean data.cache.policy=lru?"),
        ("+trainer.max_steps=5", "drop the +: trainer.max_steps=5"),  # Hydra: "Could not append to config"
        ("experiment=demo", "add a +: +experiment=demo"),  # Hydra: "No match in the defaults list"
        ("+experimnt=demo", "did you mean +experiment=demo?"),
        ("+trainer.foo=1", "trainer.foo is not a config key; every key"),  # no section offered as a value's key
    ],
)
def test_an_unknown_key_is_refused_in_one_line_before_anything_loads(
    override: str, must_say: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # a missing model and shard set would be refused next: the key is refused first, and no run dir is made
    args = [f"model.llm={tmp_path / 'no-llm'}", f"data.shards=[{tmp_path / 'no-set'}]"]
    args += [f"trainer.output_dir={tmp_path / 'run'}", override]
    proc = _in_process(
        capfd, "adapter_trainer", *([] if override.startswith("experiment=") else ["+experiment=demo"]), *args
    )
    _refused_in_one_line(proc, must_say)
    assert not (tmp_path / "run").exists()


def test_generate_refuses_an_unknown_key_too(capfd: pytest.CaptureFixture[str]) -> None:
    proc = _in_process(capfd, "adapter_trainer.generate", "+experiment=demo", "generate.temprature=0.8")
    _refused_in_one_line(proc, "did you mean generate.temperature=0.8?")


def test_legitimate_overrides_pass(capfd: pytest.CaptureFixture[str]) -> None:
    args = ["+experiment=demo", "data=musiccaps", "trainer.max_steps=7", "++trainer.seed=3", "hydra.job.name=x"]
    args += ["hydra/job_logging=disabled", "data.cache.policy=lru", "optimizer.betas=[0.9,0.9]", "--cfg", "job"]
    proc = _in_process(capfd, "adapter_trainer", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max_steps: 7" in proc.stdout and "seed: 3" in proc.stdout and "policy: lru" in proc.stdout


@pytest.mark.parametrize(
    "override, shards",
    [
        ("data.shards=build/x", "  - build/x\n"),  # Hydra: "Value 'build/x' of type 'str' could not be converted"
        ("data.shards=a,b", "  - a\n  - b\n"),  # Hydra: "Ambiguous value for argument" (a sweep outside -m)
        ("data.shards=[a,b]", "  - a\n  - b\n"),
        ("data.shards='a,b'", "  - a,b\n"),  # quoted for Hydra: one path with a comma in it
        ("data.shards={path: a, weight: 2}", "  - path: a\n    weight: 2\n"),
    ],
)
def test_data_shards_takes_one_path_or_a_comma_list(
    override: str, shards: str, capfd: pytest.CaptureFixture[str]
) -> None:
    proc = _in_process(capfd, "adapter_trainer", "+experiment=demo", override, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"  shards:\n{shards}  train_split" in proc.stdout, proc.stdout[:400]


def test_under_multirun_a_comma_list_sweeps_over_single_sets(capfd: pytest.CaptureFixture[str]) -> None:
    out = shards_as_list(["-m", "+experiment=demo", "data.shards=a,b/c"])
    assert out == ["-m", "+experiment=demo", "data.shards=['a'],['b/c']"]
    sweep = OverridesParser.create().parse_override(out[-1]).value()
    assert isinstance(sweep, ChoiceSweep) and len(sweep.list) == 2
    assert shards_as_list(["+experiment=demo", "data.shards=[a]"]) == ["+experiment=demo", "data.shards=[a]"]
    assert shards_as_list(["data.shards="]) == ["data.shards=[]"]  # then refused as empty, naming the fix
    proc = _in_process(capfd, "adapter_trainer", "+experiment=demo", "data.shard=a", "--cfg", "job")
    _refused_in_one_line(proc, "did you mean data.shards=a?")


def test_the_declared_keys_are_the_schema() -> None:
    keys, open_keys = declared_keys(TrainConfig)
    assert {"trainer.max_steps", "data.cache.policy", "model.mot.lora_rank", "optimizer.betas"} <= keys
    assert {"data", "model.mot", "data.cache"} <= keys
    assert {"data.shards", "optimizer.betas"} <= open_keys

"""Every YAML composes against the structured schema; experiments convert to TrainConfig; bad values fail with the
fix; mps_small (pointed at tiny models, CPU) trains a couple of steps; a missing device is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from adapter_trainer.config import ConfigError, TrainConfig, to_train_config
from adapter_trainer.hydra_cli import find_conf_dir
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.helpers import run_module_in_process

pytestmark = pytest.mark.usefixtures("reused_tokenizers")

CONF = find_conf_dir()
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _compose(*overrides: str, return_hydra_config: bool = False):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def test_the_three_experiments_exist() -> None:
    assert {"demo", "mps_small", "cuda_1b"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_to_typed_config(name: str) -> None:
    cfg = _compose(f"+experiment={name}", "data.shards=[some/set]", "trainer.output_dir=out/x")
    typed = to_train_config(cfg)
    assert isinstance(typed, TrainConfig)
    assert typed.data.pattern in ("flatten", "delay") and typed.trainer.max_steps > 0
    first = (CONF / "experiment" / f"{name}.yaml").read_text().splitlines()
    assert first[0] == "# @package _global_"
    assert any(f"+experiment={name}" in ln for ln in first[:6]), "each experiment opens with its launch command"


def test_experiment_values() -> None:
    demo = to_train_config(_compose("+experiment=demo"))
    assert demo.model.llm == "build/demo/models/llm" and demo.data.shards == ["build/demo/shards"]
    assert demo.trainer.output_dir == "build/demo/runs/demo" and demo.trainer.device == "cpu"
    mps = to_train_config(_compose("+experiment=mps_small", "data.shards=[s]", "trainer.output_dir=o"))
    assert (mps.model.llm, mps.model.audio_lm) == ("meta-llama/Llama-3.2-1B", "facebook/musicgen-small")
    assert mps.trainer.batch_size == 1 and mps.trainer.grad_accum_steps > 1 and mps.data.max_seq_len == 1024
    assert mps.trainer.device == "mps" and mps.trainer.precision in ("fp32", "fp16")
    cuda = to_train_config(_compose("+experiment=cuda_1b", "data.shards=[s]", "trainer.output_dir=o"))
    assert cuda.trainer.precision == "bf16" and cuda.trainer.batch_size > mps.trainer.batch_size


def test_every_group_option_composes() -> None:
    for group in ("data", "model", "optimizer", "trainer"):
        for opt in sorted((CONF / group).glob("*.yaml")):
            to_train_config(_compose(f"{group}={opt.stem}", "data.shards=[s]", "trainer.output_dir=o"))


def test_every_yaml_opens_with_a_launch_command() -> None:
    for path in sorted(CONF.rglob("*.yaml")):
        head = "\n".join(path.read_text().splitlines()[:8])
        assert "python -m adapter_trainer" in head, f"{path} should open with its launch/override command"


def test_base_requires_shards() -> None:
    with pytest.raises(ConfigError, match=r"data.shards is not set.*data.shards=\["):
        to_train_config(_compose("trainer.output_dir=o"))


def test_unknown_key_and_wrong_type_are_rejected_by_the_schema() -> None:
    with pytest.raises(ConfigCompositionException):
        _compose("+experiment=demo", "trainer.bogus=1")
    with pytest.raises((ConfigCompositionException, ValidationError)):
        _compose("+experiment=demo", "trainer.max_steps=lots")


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("data.pattern=zigzag", "data.pattern='zigzag' is not supported; choose one of flatten, delay"),
        ("trainer.precision=fp8", "trainer.precision='fp8'"),
        ("model.dtype=int8", "model.dtype='int8'"),
        ("model.mot.audio_head_init=zeros", "model.mot.audio_head_init"),
        ("trainer.batch_size=0", "trainer.batch_size=0 must be > 0"),
        ("data.max_caption_tokens=300", "raise data.max_seq_len"),
        ("optimizer.betas=[0.9]", "optimizer.betas"),
        ("trainer.num_workers=-2", "trainer.num_workers=-2 must be -1 (auto)"),
        ("data.start_crop_prob=1.5", "data.start_crop_prob=1.5 must be in [0.0, 1.0]"),
        ("data.caption_dropout=1.0", "data.caption_dropout=1.0 must be in [0.0, 1.0)"),
    ],
)
def test_bad_values_name_key_and_fix(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        to_train_config(_compose("+experiment=demo", override))
    assert needle in str(e.value)


def test_every_value_is_overridable_and_hydra_writes_under_output_dir() -> None:
    overrides = (
        "+experiment=demo",
        "optimizer.lr=0.5",
        "model.mot.audio_tower=llm",
        "model.mot.audio_attention=lora",
        "model.mot.lora_rank=4",
        "data.eval_max_clips=3",
        "trainer.output_dir=/tmp/somewhere",
        "optimizer.betas=[0.8,0.9]",
    )
    hydra_cfg = _compose(*overrides, return_hydra_config=True).hydra
    assert hydra_cfg.run.dir == "/tmp/somewhere"
    assert hydra_cfg.sweep.dir == "/tmp/somewhere"
    typed = to_train_config(_compose(*overrides))
    assert typed.optimizer.lr == 0.5 and typed.model.mot.lora_rank == 4 and typed.optimizer.betas == [0.8, 0.9]


def test_resolved_config_round_trips_to_yaml() -> None:
    from adapter_trainer.config import config_to_yaml

    typed = to_train_config(_compose("+experiment=demo"))
    back = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.create(config_to_yaml(typed)))
    )
    assert back == typed


# --------------------------------------------------------------------------------------- device + small runs


def _missing_device() -> str | None:
    if not torch.cuda.is_available():
        return "cuda"
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return "mps"
    return None


def test_missing_device_is_a_clear_error_not_a_traceback(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The refusal through `python -m adapter_trainer`'s entry, run in this process (its SystemExit status and
    stderr); tests/trainer/test_cli_refusals.py checks that entry's status and stderr in a process of its own."""
    dev = _missing_device()
    if dev is None:
        pytest.skip("both cuda and mps exist here: no missing device to request")
    from adapter_trainer.training.device import resolve_device

    with pytest.raises(ConfigError, match=f"trainer.device={dev} was requested.*trainer.device=cpu"):
        resolve_device(dev)
    capfd.readouterr()
    code = run_module_in_process(
        "adapter_trainer", "+experiment=demo", f"trainer.device={dev}", f"trainer.output_dir={tmp_path / 'run'}"
    )
    out, err = capfd.readouterr()
    assert code == 2
    assert "trainer.device=cpu" in err and "Traceback" not in err + out
    assert not (tmp_path / "run").exists()  # Hydra's run dir (trainer.output_dir) goes with a refused run


def test_auto_device_picks_cpu_without_accelerators() -> None:
    from adapter_trainer.training.device import resolve_device

    want = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert resolve_device("auto").type == want
    with pytest.raises(ConfigError, match="not a device"):
        resolve_device("tpu-ish")


@pytest.fixture(scope="module")
def tiny(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's demo models (read only) and a small shard set."""
    shards = write_synthetic_set(tmp_path_factory.mktemp("tiny") / "shards", n_train=8, n_eval=3, frames=(10, 16))
    return {**models, "shards": shards}


def test_mps_small_runs_on_cpu_when_pointed_at_tiny_models(tiny: dict[str, Path], tmp_path: Path) -> None:
    from adapter_trainer.training.recipe import recipe_main

    cfg = to_train_config(
        _compose(
            "+experiment=mps_small",
            f"model.llm={tiny['llm']}",
            f"model.audio_lm={tiny['musicgen']}",
            f"data.shards=[{tiny['shards']}]",
            "trainer.device=cpu",
            f"trainer.output_dir={tmp_path}",
            "trainer.max_steps=2",
            "trainer.grad_accum_steps=3",
            "trainer.progress_bar=false",
            "trainer.eval_bootstrap=50",
            "trainer.log_every=1",
        )
    )
    assert cfg.trainer.batch_size == 1 and cfg.data.max_seq_len == 1024  # the experiment's own values survive
    final = recipe_main(cfg)
    assert final["step"] == 2 and final["progress"]["index"] + 8 * final["progress"]["epoch"] == 2 * 3
    assert (tmp_path / "checkpoints" / "step-000002" / "adapter.safetensors").is_file()


def test_multirun_gives_each_job_its_own_dir(
    tiny: dict[str, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`python -m adapter_trainer --multirun` through its entry, run in this process (Hydra's basic launcher runs the
    jobs one after the other in the calling process, as it does under `python -m`)."""
    capfd.readouterr()
    code = run_module_in_process(
        "adapter_trainer",
        "--multirun",
        "+experiment=demo",
        f"model.llm={tiny['llm']}",
        f"model.audio_lm={tiny['musicgen']}",
        f"data.shards=[{tiny['shards']}]",
        f"trainer.output_dir={tmp_path}",
        "data.max_seq_len=40",
        "data.max_caption_tokens=8",
        "trainer.batch_size=2",
        "trainer.max_steps=1",
        "trainer.progress_bar=false",
        "trainer.tensorboard=false",
        "trainer.eval_bootstrap=20",
        "optimizer.lr=1e-3,2e-3",
    )
    assert code == 0, capfd.readouterr().err[-3000:]
    for job, lr in (("0", 1e-3), ("1", 2e-3)):
        d = tmp_path / job
        assert (d / "final_metrics.json").is_file() and (d / "checkpoints" / "step-000001").is_dir()
        assert OmegaConf.load(d / "config.yaml").optimizer.lr == lr
        assert OmegaConf.load(d / "config.yaml").trainer.output_dir == str(d)

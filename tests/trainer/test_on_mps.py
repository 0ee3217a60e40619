"""The trainer on an (emulated) Apple MPS device: a demo training step with eval and a checkpoint, a resume from it,
and a generation run, all with trainer.device=mps under tests/mps_rules.EmulatedMPS, which raises where a real MPS
device (torch 2.11) refuses a call or gets it silently wrong (float64 on the device, a non-blocking copy from
unpinned memory, safetensors' device strings, ...). No Mac is needed; what only a Mac can show (kernel fallbacks,
numerics, memory) is listed in docs/architecture.md, "Apple MPS"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.hydra_cli import find_conf_dir
from tests.mps_rules import FAKE_ALLOCATED, EmulatedMPS
from tests.trainer.helpers import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread", "reused_tokenizers")

MPS_RUN = (
    "trainer.device=mps",
    "trainer.activation_checkpointing=true",  # as mps_small
    "trainer.grad_accum_steps=2",
    "trainer.eval_every=1",
    "trainer.ckpt_every=1",
)


@pytest.fixture(scope="module")
def mps_run(models, shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two optimizer steps (2 micro-batches each) on mps, an eval and a checkpoint after each."""
    from adapter_trainer.training.recipe import recipe_main

    out = tmp_path_factory.mktemp("mps") / "run"
    with EmulatedMPS():
        recipe_main(make_cfg(models, shards, out, *MPS_RUN, "trainer.max_steps=2"))
    return out


@pytest.fixture(scope="module")
def cpu_run(models, shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run as `mps_run` on the CPU."""
    from adapter_trainer.training.recipe import recipe_main

    out = tmp_path_factory.mktemp("cpu") / "run"
    recipe_main(make_cfg(models, shards, out, *MPS_RUN[1:], "trainer.max_steps=2"))
    return out


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_step_eval_and_checkpoint_run_on_mps(mps_run: Path) -> None:
    final = json.loads((mps_run / "final_metrics.json").read_text())
    assert final["step"] == 2
    assert (mps_run / "checkpoints" / "step-000002" / "adapter.safetensors").is_file()
    train = [r for r in records(mps_run) if "train/loss" in r]
    assert len(train) == 2 and all(r["train/loss"] > 0 for r in train)
    # the device's memory is logged from torch.mps (the emulation's fixed figure: 1 GiB)
    assert train[0]["train/mem_allocated_gb"] == pytest.approx(FAKE_ALLOCATED / 2**30)


def test_mps_training_computes_what_cpu_training_computes(mps_run: Path, cpu_run: Path) -> None:
    """Same figures as a CPU run of the same config: step 1's loss exactly (nothing has been updated yet), later
    figures within 1e-5 relative (MPS steps with fused AdamW, CPU with torch's per-tensor loop: same math, other
    rounding)."""
    cpu = cpu_run
    on_mps, on_cpu = records(mps_run), records(cpu)
    loss = [[r["train/loss"] for r in rs if "train/loss" in r] for rs in (on_mps, on_cpu)]
    assert loss[0][0] == loss[1][0]
    assert loss[0][1] == pytest.approx(loss[1][1], rel=1e-5)
    final = [json.loads((d / "final_metrics.json").read_text()) for d in (mps_run, cpu)]
    assert final[0]["eval"]["ce"] == pytest.approx(final[1]["eval"]["ce"], rel=1e-5)
    assert "train/mem_allocated_gb" not in on_cpu[0]  # the CPU logs no device memory


def test_resume_on_mps(models, shards, mps_run: Path, tmp_path: Path) -> None:
    from adapter_trainer.training.recipe import recipe_main

    ckpt = mps_run / "checkpoints" / "step-000001"
    with EmulatedMPS():
        final = recipe_main(
            make_cfg(models, shards, tmp_path / "resumed", *MPS_RUN, "trainer.max_steps=2", f"trainer.resume={ckpt}")
        )
    assert final["step"] == 2


def generate(models, shards, run: Path, device: str, out: Path, *extra: str) -> list:
    """`generate` of two short clips from `run`'s adapter on `device` into `out`: the clips it wrote."""
    from hydra import compose, initialize_config_dir

    from adapter_trainer.data.samples import load_split
    from adapter_trainer.data.shards import read_manifest
    from adapter_trainer.generation.generate import run_generate, to_generate_config
    from tests.trainer.helpers import tiny_demo_overrides

    args = tiny_demo_overrides(models, shards, run, f"trainer.device={device}", *extra)
    args += ["generate.n=2", "generate.seconds=0.2", "generate.batch_size=2", f"generate.out_dir={out}"]
    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        run_generate(to_generate_config(compose("generate", overrides=args)))
    return load_split([read_manifest(out)], "generated")


def test_generation_on_mps_writes_what_the_cpu_writes(models, shards, mps_run: Path, tmp_path: Path) -> None:
    """The emulation computes on the CPU, so the mps run's sampled codes must equal a CPU run's exactly: the mps
    code paths (KV cache, sampler, attention) change where tensors live, never what is computed."""
    with EmulatedMPS():
        on_mps = generate(models, shards, mps_run, "mps", tmp_path / "mps")
    on_cpu = generate(models, shards, mps_run, "cpu", tmp_path / "cpu")
    assert len(on_mps) == 2 and [c.key for c in on_mps] == [c.key for c in on_cpu]
    for a, b in zip(on_mps, on_cpu):
        np.testing.assert_array_equal(a.codes, b.codes)


def test_adamw_is_fused_on_mps_only() -> None:
    """torch 2.11 has no foreach AdamW for MPS (a Python loop over the tensors); its fused one runs there."""
    import torch

    from adapter_trainer.config import OptimizerConfig
    from adapter_trainer.training.optim import build_optimizer

    with EmulatedMPS():
        on_mps = [torch.nn.Linear(4, 4).to("mps").weight]
        assert build_optimizer(on_mps, [], OptimizerConfig()).defaults["fused"] is True
    assert not build_optimizer([torch.nn.Parameter(torch.zeros(4, 4))], [], OptimizerConfig()).defaults["fused"]


def test_resume_keeps_this_devices_adamw_kernel(models, shards, mps_run: Path, cpu_run: Path, tmp_path: Path) -> None:
    """A checkpoint written on the CPU (torch's per-tensor AdamW) resumed on MPS runs fused AdamW, and an MPS
    checkpoint resumed on the CPU runs torch's default: the device of the run decides, not the checkpoint's."""
    from adapter_trainer.training.recipe import MoTAdapterRecipe

    def resumed_fused(device: str, ckpt: Path) -> object:
        recipe = MoTAdapterRecipe(
            make_cfg(
                models,
                shards,
                tmp_path / f"r-{device}",
                f"trainer.device={device}",
                "trainer.max_steps=2",
                f"trainer.resume={ckpt}",
            )
        )
        recipe.setup()
        return recipe.optimizer.param_groups[0]["fused"]

    cpu_ckpt, mps_ckpt = (run / "checkpoints" / "step-000001" for run in (cpu_run, mps_run))
    assert not torch.load(cpu_ckpt / "optimizer.pt", weights_only=True)["param_groups"][0]["fused"]
    assert torch.load(mps_ckpt / "optimizer.pt", weights_only=True)["param_groups"][0]["fused"]
    with EmulatedMPS():
        assert resumed_fused("mps", cpu_ckpt) is True
    assert not resumed_fused("cpu", mps_ckpt)


@pytest.mark.budget(90, reason="two short trainings (emulated MPS, CPU) and two generations of the musicgen tower")
def test_the_musicgen_tower_trains_and_generates_on_mps_as_on_the_cpu(models, shards, tmp_path: Path) -> None:
    """mps_small's tower (audio rows on MusicGen's own layers, the caption through its cross-attention, the KV cache of
    decode_step) under the emulated MPS rules: the same losses, eval CE and sampled codes as on the CPU."""
    from adapter_trainer.training.recipe import recipe_main

    tower = "model.mot.audio_tower=musicgen"
    runs = {d: tmp_path / d / "run" for d in ("mps", "cpu")}
    with EmulatedMPS():
        recipe_main(make_cfg(models, shards, runs["mps"], *MPS_RUN, tower, "trainer.max_steps=2"))
    recipe_main(make_cfg(models, shards, runs["cpu"], *MPS_RUN[1:], tower, "trainer.max_steps=2"))
    on_mps, on_cpu = ([r["train/loss"] for r in records(runs[d]) if "train/loss" in r] for d in ("mps", "cpu"))
    assert on_mps[0] == on_cpu[0] and on_mps[1] == pytest.approx(on_cpu[1], rel=1e-5)
    final = [json.loads((runs[d] / "final_metrics.json").read_text()) for d in ("mps", "cpu")]
    assert final[0]["eval"]["ce"] == pytest.approx(final[1]["eval"]["ce"], rel=1e-5)

    with EmulatedMPS():
        sampled_on_mps = generate(models, shards, runs["mps"], "mps", tmp_path / "gen-mps", tower)
    sampled_on_cpu = generate(models, shards, runs["mps"], "cpu", tmp_path / "gen-cpu", tower)
    assert len(sampled_on_mps) == 2
    for a, b in zip(sampled_on_mps, sampled_on_cpu):
        np.testing.assert_array_equal(a.codes, b.codes)

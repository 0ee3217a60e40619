"""The commands a run's last lines show (training.next_steps): built from the overrides as typed, quoted for any
shell, the run dir fixed and resume=latest; under torchrun the same launcher."""

from __future__ import annotations

import shlex

import pytest

from adapter_trainer.training.next_steps import interrupted_line, next_steps, resume_command


def test_the_resume_command_is_the_run_s_own_command_continuing_its_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["+experiment=demo", "data.shards=[a,b]", "trainer.output_dir=old", "trainer.overwrite=true"]
    cmd = resume_command(argv, "build/demo/runs/x")
    assert cmd == (
        "python -m adapter_trainer +experiment=demo 'data.shards=[a,b]' trainer.output_dir=build/demo/runs/x "
        "trainer.resume=latest"
    )
    assert shlex.split(cmd)[4] == "data.shards=[a,b]"  # zsh and bash hand Hydra the list as typed
    assert interrupted_line(argv, "r", 7).startswith("interrupted at step 7; resume with python -m adapter_trainer ")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert resume_command(["+experiment=cuda_1b"], "r").startswith("torchrun --nnodes=2 --nproc_per_node=2 -m ")


def test_a_finished_run_shows_export_generate_listen_and_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    demo = "\n".join(next_steps(["+experiment=demo", "trainer.max_steps=50"], "build/demo/runs/demo", 50))
    assert "python -m adapter_trainer.export build/demo/runs/demo --out build/demo/runs/demo/adapter" in demo
    assert 'make generate ADAPTER=build/demo/runs/demo/adapter TEXT="calm solo piano"' in demo
    assert "make listen RUN=build/demo/runs/demo" in demo
    assert "trainer.resume=latest trainer.max_steps=100" in demo
    # another model or data setting: generate with the run's own overrides, then decode
    other = "\n".join(next_steps(["+experiment=demo", "data.max_seq_len=64"], "runs/a", 5))
    assert "make listen" not in other
    assert "python -m adapter_trainer.generate +experiment=demo data.max_seq_len=64 trainer.output_dir=runs/a " in other
    assert "python -m tokenizer_pipeline.decode runs/a/generated out_dir=runs/a/listen" in other

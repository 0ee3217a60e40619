"""Resuming a checkpoint of the other audio tower: one short line naming the override that resumes it, not every
trainable tensor's shape that follows from the tower."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter_trainer.training.checkpoint import ResumeError, check_fingerprint


def test_another_tower_names_the_override_that_resumes_it() -> None:
    saved = {"model.mot": {"audio_tower": "llm"}, "trainable_shapes": {f"w{i}": [64, 64] for i in range(80)}}
    now = {"model.mot": {"audio_tower": "musicgen"}, "trainable_shapes": {f"v{i}": [32, 32] for i in range(80)}}
    with pytest.raises(ResumeError) as e:
        check_fingerprint(saved, now, Path("run/checkpoints/step-000010"))
    msg = str(e.value)
    assert "it trained model.mot.audio_tower=llm, this run model.mot.audio_tower=musicgen" in msg
    assert "add model.mot.audio_tower=llm to resume it" in msg and "trainable_shapes" not in msg and len(msg) < 400

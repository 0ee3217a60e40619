"""Resume on fewer GPUs: a checkpoint's CUDA generator states are restored only for the devices this process has
(faked here: the saved list is longer than torch.cuda.device_count())."""

from __future__ import annotations

import pytest
import torch

from adapter_trainer.training.checkpoint import capture_rng, restore_rng


def test_cuda_rng_of_more_devices_than_present_restores_only_those_present(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_states, other = capture_rng()
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]  # as if saved on 8 GPUs
    torch_states["cuda"] = saved
    restored: dict[int, torch.Tensor] = {}

    def set_all(states):  # what the real one does on a 1-GPU machine with 8 states: index device 1..7
        for i, s in enumerate(states):
            if i >= 1:
                raise IndexError(f"list index out of range (device {i})")
            restored[i] = s

    def set_one(state, device=0):
        if int(device) >= 1:
            raise IndexError(f"device {device} does not exist")
        restored[int(device)] = state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_one)
    cpu_before = torch.get_rng_state()
    torch.rand(3)  # move the CPU generator: restore must bring it back
    restore_rng(torch_states, other)
    assert list(restored) == [0] and torch.equal(restored[0], saved[0])
    assert torch.equal(torch.get_rng_state(), cpu_before)

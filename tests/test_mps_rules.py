"""The MPS emulation (tests/mps_rules.py) itself: each rule raises on the call real MPS refuses, and the same work
written the MPS-safe way passes (the control). Without these, a guard that never fires would look like a pass."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.mps_rules import FAKE_ALLOCATED, MPS, EmulatedMPS, MPSRuleError, on_mps


def test_the_emulated_device_looks_like_mps() -> None:
    with EmulatedMPS():
        assert torch.backends.mps.is_available()
        x = torch.zeros(3, device="mps")
        y = torch.ones(3).to(MPS)
        z = x + y
        w = torch.zeros(2, device=z.device)  # made where another tensor lives
        assert [t.device.type for t in (x, y, z, w)] == ["mps"] * 4 and z.is_mps
        host = z.cpu()
        assert host.device.type == "cpu" and not on_mps(host) and on_mps(z)
        assert host.numpy().tolist() == [1.0, 1.0, 1.0]
        lin = torch.nn.Linear(2, 2).to("mps")
        assert lin.weight.device.type == "mps" and lin(torch.ones(1, 2, device="mps")).device.type == "mps"
        assert isinstance(lin.weight, torch.nn.Parameter) and lin.weight.is_leaf
        kw = torch.nn.Linear(2, 2).to(device="mps", dtype=torch.float32)  # Module.to's keyword form
        assert kw.weight.device == torch.device("mps", 0) and str(kw.bias.device) == "mps:0"
        host.add_(1)
        assert z.cpu().tolist() == [1.0, 1.0, 1.0]  # .cpu() is a copy, as on a Mac
        assert torch.mps.current_allocated_memory() == FAKE_ALLOCATED
    assert not torch.zeros(1).is_mps  # nothing leaks out of the context


@pytest.mark.parametrize(
    ("rule", "bad"),
    [
        ("float64-on-mps", lambda: torch.tensor(3.0, dtype=torch.float64, device="mps")),
        ("float64-on-mps", lambda: torch.ones(2, device="mps").double()),
        ("float64-on-mps", lambda: torch.ones(2, device="mps").sum(dtype=torch.float64)),
        ("float64-on-mps", lambda: torch.zeros(2, dtype=torch.float64).to("mps")),
        ("cast-in-copy", lambda: torch.ones(2, device="mps").to("cpu", torch.float64)),
        ("async-unpinned", lambda: torch.ones(2).to("mps", non_blocking=True)),
        ("async-unpinned", lambda: torch.ones(2, device="mps").to("cpu", non_blocking=True)),
        ("async-unpinned", lambda: torch.empty(2, device="mps").copy_(torch.ones(2), non_blocking=True)),
        ("numpy-of-mps", lambda: torch.ones(2, device="mps").numpy()),
        ("device-mix", lambda: torch.ones(2, device="mps") + torch.ones(2)),
        ("device-mix", lambda: torch.cat([torch.ones(2, device="mps"), torch.ones(2)])),
        ("device-mix", lambda: torch.ones(2).add_(torch.ones(2, device="mps"))),
        ("float64-on-mps", lambda: torch.nn.Linear(2, 2).to(device="mps", dtype=torch.float64)),
    ],
)
def test_each_rule_refuses_what_mps_refuses(rule: str, bad) -> None:
    with EmulatedMPS(), pytest.raises(MPSRuleError, match=f"^{rule}: "):
        bad()


def test_the_mps_safe_forms_pass() -> None:
    """The controls: the same figures, computed the way MPS takes them."""
    with EmulatedMPS():
        x = torch.arange(4, device="mps", dtype=torch.float32)
        assert x.cpu().double().sum().item() == 6.0  # cast after the copy
        assert x.to("cpu").to(torch.float64).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert torch.tensor(float(7), dtype=torch.float64).item() == 7.0  # float64 on the host is fine
        assert x.to("mps", non_blocking=False).sum().item() == 6.0
        assert (x * torch.tensor(2.0)).sum().item() == 12.0  # a 0-dim host scalar is fine
        assert x[torch.tensor([0, 3])].tolist() == [0.0, 3.0]  # host indices are fine


def test_safetensors_and_torch_load_to_mps_are_refused(tmp_path) -> None:
    save_file({"w": torch.ones(2)}, tmp_path / "a.safetensors")
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    with EmulatedMPS():
        with pytest.raises(MPSRuleError, match="^safetensors-device: "):
            load_file(tmp_path / "a.safetensors", device="mps:0")
        with pytest.raises(MPSRuleError, match="^map-location: "):
            torch.load(tmp_path / "a.pt", map_location="mps", weights_only=True)
        moved = {k: v.to("mps") for k, v in load_file(tmp_path / "a.safetensors", device="cpu").items()}
        assert moved["w"].device.type == "mps"

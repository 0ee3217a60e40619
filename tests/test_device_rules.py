"""Static rules for code that puts tensors on an accelerator, over both packages (ast). The runtime guard
(tests/mps_rules.py: a training step, eval, resume, generation and the encoder under an emulated MPS device) sees
the paths the tests run; these rules see every line, run or not:

  non-blocking-literal   `non_blocking=True` written as a constant: a non-blocking copy is safe only from pinned
                         memory to CUDA (on MPS it can read freed host memory), so it must be decided per copy
  float64-on-device      a float64 dtype in a call that also names a device other than "cpu" (MPS has no float64)
  cast-in-copy           `.to(<device>, torch.float64)` / `.to(device=..., dtype=torch.float64)`: copy, then cast
  safetensors-device     `load_file(..., device=<anything but "cpu">)`: load to the host, then move
  map-location           `torch.load(..., map_location=<anything but "cpu">)`: the same
A float64 cast anywhere in an expression that is then moved off the host (`torch.cat([..., n.double()]).to(device)`)
counts as float64 on the device; `.to("cpu", torch.float64)` counts as a cast inside a copy (on a host tensor it is
harmless, but the rule cannot tell: write `.cpu().to(torch.float64)`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from tests import REPO

PACKAGES = [REPO / "packages" / "tokenizer_pipeline" / "src", REPO / "packages" / "adapter_trainer" / "src"]


def _is_float64(node: ast.AST | None) -> bool:
    """torch.float64 / torch.double (not numpy's float64: numpy arrays live on the host)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("float64", "double")
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )


def _is_dtype(node: ast.AST) -> bool:
    """torch.<dtype> (float32, long, ...)."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and (isinstance(getattr(torch, node.attr, None), torch.dtype))
    )


def _is_cpu(node: ast.AST | None) -> bool:
    """ "cpu", torch.device("cpu") or None (the host)."""
    if node is None or (isinstance(node, ast.Constant) and node.value in ("cpu", None)):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "device"
        and bool(node.args)
        and _is_cpu(node.args[0])
        and node.args[0] is not None
    )


def _makes_float64(node: ast.AST) -> bool:
    """Whether an expression casts to or names float64 anywhere inside (`.double()`, torch.float64)."""
    return any(
        _is_float64(n) or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "double")
        for n in ast.walk(node)
    )


def _called(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def violations(source: str, name: str = "<src>") -> list[str]:
    """`name:line rule` for every call in `source` that breaks a rule of the module docstring."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        where, called = f"{name}:{node.lineno}", _called(node.func)
        true_args = [a for a in node.args if isinstance(a, ast.Constant) and a.value is True]
        if (isinstance(kw.get("non_blocking"), ast.Constant) and kw["non_blocking"].value is True) or (
            called in ("to", "copy_", "cuda") and true_args
        ):
            found.append(f"{where} non-blocking-literal")
        device = kw.get("device")
        has_float64 = any(_is_float64(a) for a in node.args) or _is_float64(kw.get("dtype"))
        if "device" in kw and not _is_cpu(device) and has_float64:
            found.append(f"{where} float64-on-device")
        if called == "to":
            targets = [a for a in node.args if not _is_dtype(a) and not isinstance(a, ast.Constant | ast.Starred)]
            targets += [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            targets += [device] if "device" in kw else []
            if has_float64 and any(_is_cpu(t) for t in targets):
                found.append(f"{where} cast-in-copy")
            elif any(not _is_cpu(t) for t in targets) and (has_float64 or _makes_float64(node.func.value)):
                found.append(f"{where} float64-on-device")
        if called == "load_file":
            dev = device if "device" in kw else (node.args[1] if len(node.args) > 1 else None)
            if not _is_cpu(dev):
                found.append(f"{where} safetensors-device")
        if called == "load" and "map_location" in kw and not _is_cpu(kw["map_location"]):
            found.append(f"{where} map-location")
    return found


def _package_files() -> list[Path]:
    return [p for root in PACKAGES for p in sorted(root.rglob("*.py"))]


def test_no_package_line_breaks_a_device_rule() -> None:
    found = [v for p in _package_files() for v in violations(p.read_text(), str(p.relative_to(REPO)))]
    assert found == []


def test_each_rule_sees_what_it_guards() -> None:
    """The rules fire on the forms this checkout once had (and pass their MPS-safe rewrites)."""
    bad = {
        "non-blocking-literal": "x.to(device, non_blocking=True)",
        "float64-on-device": "torch.tensor(1.0, dtype=torch.float64, device=device)",
        "cast-in-copy": 'x.detach().to("cpu", torch.float64)',
        "safetensors-device": "load_file(path, device=str(device))",
        "map-location": "torch.load(path, map_location=device, weights_only=True)",
    }
    bad_too = {  # the other forms of the same mistakes (the first is the one this checkout had in step.py)
        "float64-on-device": [
            "dist.all_reduce_sum(torch.cat([head, ce_k, n_k.double()]).to(device)).cpu()",
            "torch.from_numpy(a).to(device, torch.float64)",
        ],
        "non-blocking-literal": ["x.to(d, torch.long, True)", "y.copy_(src, True)"],
        "safetensors-device": ["load_file(path, str(device))"],
    }
    for rule, lines in bad_too.items():
        for line in lines:
            assert [v.split()[-1] for v in violations(line)] == [rule], line
    for rule, line in bad.items():
        assert [v.split()[-1] for v in violations(line)] == [rule], line
    good = [
        "x.to(device, non_blocking=device.type == 'cuda' and x.is_pinned())",
        "torch.tensor([n], dtype=torch.long)",
        "torch.zeros(3, dtype=torch.float64)",
        "x.detach().cpu().to(torch.float64)",
        'load_file(path, device="cpu")',
        "np.zeros(3, dtype=np.float64)",
        'torch.zeros(2, dtype=torch.float64, device=torch.device("cpu"))',
        "torch.zeros(2, dtype=torch.float64, device=None)",
        "x.to(device, torch.float32)",
        "x.double().to(torch.float32)",
        "stats.cpu().double()",
        'torch.load(path, map_location="cpu", weights_only=True)',
    ]
    assert [v for line in good for v in violations(line)] == []
    assert len(_package_files()) > 100  # the walk reaches both packages

"""Static rules for code that puts tensors on an accelerator, over both packages (ast). The runtime guard
(tests/mps_rules.py: a training step, eval, resume, generation and the encoder under an emulated MPS device) sees
the paths the tests run; these rules see every line, run or not:

  non-blocking-literal   `non_blocking=True` written as a constant: a non-blocking copy is safe only from pinned
                         memory to CUDA (on MPS it can read freed host memory), so it must be decided per copy
  float64-on-device      a float64 dtype in a call that also names a device other than "cpu" (MPS has no float64)
  cast-in-copy           `.to(<device>, torch.float64)` / `.to(device=..., dtype=torch.float64)`: copy, then cast
  safetensors-device     `load_file(..., device=<anything but "cpu">)`: safetensors refuses some device strings
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import REPO

PACKAGES = [REPO / "packages" / "tokenizer_pipeline" / "src", REPO / "packages" / "adapter_trainer" / "src"]


def _is_float64(node: ast.AST) -> bool:
    """torch.float64 / torch.double (not numpy's float64: numpy arrays live on the host)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("float64", "double")
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )


def _is_cpu(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "cpu"


def violations(source: str, name: str = "<src>") -> list[str]:
    """`name:line rule` for every call in `source` that breaks a rule of the module docstring."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        where = f"{name}:{node.lineno}"
        if isinstance(kw.get("non_blocking"), ast.Constant) and kw["non_blocking"].value is True:
            found.append(f"{where} non-blocking-literal")
        device = kw.get("device")
        has_float64 = any(_is_float64(a) for a in node.args) or _is_float64(kw.get("dtype", ast.Constant(None)))
        if device is not None and not _is_cpu(device) and has_float64:
            found.append(f"{where} float64-on-device")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "to" and has_float64:
            names_device = device is not None or any(
                not _is_float64(a) and not (isinstance(a, ast.Constant) and isinstance(a.value, bool))
                for a in node.args
            )
            if names_device:
                found.append(f"{where} cast-in-copy")
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called == "load_file" and device is not None and not _is_cpu(device):
            found.append(f"{where} safetensors-device")
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
    }
    for rule, line in bad.items():
        assert [v.split()[-1] for v in violations(line)] == [rule], line
    good = [
        "x.to(device, non_blocking=device.type == 'cuda' and x.is_pinned())",
        "torch.tensor([n], dtype=torch.long)",
        "torch.zeros(3, dtype=torch.float64)",
        "x.detach().cpu().to(torch.float64)",
        'load_file(path, device="cpu")',
        "np.zeros(3, dtype=np.float64)",
    ]
    assert [v for line in good for v in violations(line)] == []
    assert len(_package_files()) > 100  # the walk reaches both packages

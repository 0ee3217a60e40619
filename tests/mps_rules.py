"""Apple MPS's limits, enforced on a machine without a Mac: `EmulatedMPS` runs code that targets `mps` on the CPU.

Inside `with EmulatedMPS():`
  - `torch.backends.mps.is_available()` is true and `torch.mps`'s memory queries answer (fixed numbers);
  - every torch call whose target device is `mps` (a `device=` argument, `Tensor.to(...)`, `Module.to(...)`) runs on
    the CPU instead and MARKS the tensors it makes as being on mps: `t.device` then reads `mps:0` (as on a Mac), and
    the results of torch calls on marked tensors stay marked (`torch.zeros(..., device=x.device)` lands on "mps" too;
    a marked parameter's `.grad` reads as marked);
  - `.cpu()` / `.to("cpu")` of a marked tensor gives an unmarked copy: the host copy;
  - what torch 2.11 on a real MPS device refuses, or gets silently wrong, raises `MPSRuleError` (the rule's id first):
      float64-on-mps       a float64 tensor on mps: MPS has no float64 (TypeError there; pytorch#122602)
      cast-in-copy         `.to("cpu", torch.float64)` of an mps tensor in one call (raises, or in later torch
                           silently writes zeros: pytorch#197715): copy with `.cpu()`, then cast
      device-mix           one op on an mps tensor and a host tensor of one or more dimensions ("Expected all
                           tensors to be on the same device"; 0-dim host scalars and host index tensors are allowed)
      numpy-of-mps         `.numpy()` of an mps tensor (torch raises: copy to the host first)
  - and the project's policies for any accelerator (safe on every torch version and device, not MPS limits as such):
      async-unpinned       a non_blocking copy to mps from unpinned host memory (torch 2.11's MPS copy could read
                           host memory freed after the call: pytorch#139550), or a non_blocking copy off mps
                           (returns before the data is there): non_blocking only for CUDA with pinned memory
      safetensors-device   `safetensors.torch.load_file(..., device="mps...")` (its safe_open): load to the CPU, then
                           move (older safetensors refused mps device strings, its #674)
      map-location         `torch.load(..., map_location=<mps>)`: load to the CPU, then move (a limit of this
                           emulation, whose device cannot hold a storage; a Mac accepts it)

What it cannot see: kernels MPS lacks (PYTORCH_ENABLE_MPS_FALLBACK), numerics, speed and memory, what autocast does
on MPS (mps_small trains in fp32), and device RNG state (torch.utils.checkpoint saves none for MPS). Only a Mac
confirms those (docs/real-data.md, "Apple MPS").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._pytree import tree_leaves

MPS = torch.device("mps", 0)  # what a real MPS tensor's .device reads
CPU = torch.device("cpu")
_MARK = "_emulated_mps"
_DEVICE_GET = torch.Tensor.device.__get__
_IS_MPS_GET = torch.Tensor.is_mps.__get__
_IS_CPU_GET = torch.Tensor.is_cpu.__get__
_DATA_SET = torch.Tensor.data.__set__
_PARSE_TO = torch._C._nn._parse_to  # Module.to's argument parser: its device must reach Tensor.to untouched
# calls that may take an mps tensor with host tensors: copies (their own rules), indexing with host indices,
# metadata and conversions to Python values
_MIX_ALLOWED = {
    torch.Tensor.to,
    torch.Tensor.cpu,
    torch.Tensor.copy_,
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.index_select,
    torch.Tensor.__repr__,
    torch.Tensor.__format__,
    torch.Tensor.__deepcopy__,
    torch.Tensor.__reduce_ex__,
    torch.Tensor.set_,
    torch._has_compatible_shallow_copy_type,  # Module._apply compares a parameter with its moved copy
}
# what torch.mps reports inside the emulation (bytes): fixed, so a test can recognise them in a log
FAKE_ALLOCATED, FAKE_DRIVER, FAKE_RECOMMENDED = 1 << 30, 2 << 30, 12 << 30


class MPSRuleError(RuntimeError):
    """A call that a real MPS device refuses or gets silently wrong (torch 2.11); the message starts with the rule."""


def on_mps(x: Any) -> bool:
    """Whether `x` is a tensor the emulation placed on mps."""
    return isinstance(x, torch.Tensor) and bool(getattr(x, _MARK, False))


def _mark(x: Any) -> None:
    for t in tree_leaves(x):
        if isinstance(t, torch.Tensor):
            setattr(t, _MARK, True)


def _device(d: Any) -> torch.device | None:
    """A device argument (str, torch.device, int = cuda index) -> torch.device; None stays None."""
    if d is None:
        return None
    if isinstance(d, int) and not isinstance(d, bool):
        return torch.device("cuda", d)
    return torch.device(d)


def _to_call(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.dtype | None, bool]:
    """`Tensor.to`'s (device, dtype, non_blocking), from any of its call forms (device/dtype/other tensor first)."""
    device, dtype = _device(kwargs.get("device")), kwargs.get("dtype")
    flags = []
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            device, dtype = (MPS if on_mps(a) else a.device), a.dtype
        elif isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, bool):
            flags.append(a)
        elif isinstance(a, (str, torch.device, int)):
            device = _device(a)
    non_blocking = kwargs.get("non_blocking", flags[0] if flags else False)
    return device, dtype, bool(non_blocking)


def _violation(rule: str, what: str, fix: str) -> MPSRuleError:
    return MPSRuleError(f"{rule}: {what} ({fix})")


class _MPSMode(TorchFunctionMode):
    """The torch-function mode behind `EmulatedMPS` (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == _DEVICE_GET:
            return MPS if on_mps(args[0]) else func(*args)
        if func == _IS_MPS_GET:
            return on_mps(args[0])
        if func == _IS_CPU_GET:
            return not on_mps(args[0]) and func(*args)
        if func == _DATA_SET:  # Module.to: `param.data = moved` puts the parameter itself on the device
            func(*args)
            setattr(args[0], _MARK, on_mps(args[1]))
            return None
        if func is _PARSE_TO:
            return func(*args, **kwargs)
        name = resolve_name(func) or repr(func)
        from_mps = any(on_mps(t) for t in tree_leaves((args, kwargs)))
        if from_mps and func not in _MIX_ALLOWED and not name.endswith(("__get__", "__set__")):
            self._check_one_device(args, kwargs, name)
        if func is torch.Tensor.to:
            return self._to(args, kwargs, name)
        if func is torch.Tensor.cpu:
            return args[0].clone() if on_mps(args[0]) else func(*args, **kwargs)
        if func is torch.Tensor.numpy and on_mps(args[0]):
            raise _violation("numpy-of-mps", f"{name} of an mps tensor", "copy it with .cpu() first")
        if func is torch.Tensor.copy_:
            self._check_copy(args, kwargs)
            return func(*args, **kwargs)
        target = _device(kwargs.get("device"))
        if target is not None and target.type == "mps":
            kwargs["device"] = CPU
        out = func(*args, **kwargs)
        if (target is not None and target.type == "mps") or (target is None and from_mps):
            self._check_no_float64(out, name)
            _mark(out)
        return out

    def _to(self, args: tuple, kwargs: dict, name: str) -> torch.Tensor:
        src = args[0]
        device, dtype, non_blocking = _to_call(args, kwargs)
        kw = {"dtype": dtype, "non_blocking": non_blocking} if dtype is not None else {"non_blocking": non_blocking}
        if device is not None and device.type == "mps":
            if not on_mps(src) and non_blocking and not src.is_pinned():
                raise _violation(
                    "async-unpinned",
                    f"{name}(mps, non_blocking=True) from unpinned host memory",
                    "non_blocking only for CUDA with pinned memory",
                )
            out = src.to(CPU, copy=not on_mps(src), **kw)
            self._check_no_float64(out, name)
            _mark(out)
            return out
        if on_mps(src) and device is not None:  # off the device: a host copy, unmarked
            if dtype == torch.float64 and src.dtype != torch.float64:
                raise _violation(
                    "cast-in-copy",
                    f"{name}({device}, {dtype}) of an mps tensor casts in the copy",
                    "copy with .cpu() first, then cast",
                )
            if non_blocking:
                raise _violation(
                    "async-unpinned",
                    f"{name}({device}, non_blocking=True) off mps returns before the data is there",
                    "a blocking copy",
                )
            return src.to(device, copy=True, **kw)
        out = src.to(*args[1:], **kwargs)
        if on_mps(src) and device is None:  # a cast that stays on mps
            self._check_no_float64(out, name)
            _mark(out)
        return out

    @staticmethod
    def _check_one_device(args: tuple, kwargs: dict, name: str) -> None:
        host = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and not on_mps(t) and t.dim()]
        if host:
            raise _violation(
                "device-mix",
                f"{name} takes an mps tensor and a host tensor of shape {tuple(host[0].shape)}",
                "move the host tensor to the device first",
            )

    @staticmethod
    def _check_copy(args: tuple, kwargs: dict) -> None:
        dst, src = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        if non_blocking and on_mps(dst) != on_mps(src) and not (on_mps(dst) and src.is_pinned()):
            raise _violation(
                "async-unpinned",
                "Tensor.copy_(non_blocking=True) between mps and unpinned host memory",
                "non_blocking only for CUDA with pinned memory",
            )
        if on_mps(dst) and dst.dtype == torch.float64:
            raise _violation("float64-on-mps", "Tensor.copy_ into a float64 mps tensor", "MPS has no float64")

    @staticmethod
    def _check_no_float64(out: Any, name: str) -> None:
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_leaves(out)):
            raise _violation(
                "float64-on-mps",
                f"{name} made a float64 tensor on mps",
                "MPS has no float64: count on the host, or use float32 there and cast after .cpu()",
            )


def _safe_open_refusing_mps(real):
    """safetensors' safe_open (behind load_file, however it was imported), refusing an mps device."""

    def safe_open(filename, framework, device="cpu", **kwargs):
        if str(device).startswith("mps"):
            raise _violation(
                "safetensors-device", f"safetensors load on device={device!r}", "load to the CPU, then move"
            )
        return real(filename, framework=framework, device=device, **kwargs)

    return safe_open


def _torch_load_refusing_mps(real):
    def load(*args, **kwargs):
        loc = kwargs.get("map_location")
        if loc is not None and not callable(loc) and not isinstance(loc, dict) and torch.device(loc).type == "mps":
            raise _violation("map-location", f"torch.load(map_location={loc!r})", "load to the CPU, then move")
        return real(*args, **kwargs)

    return load


@contextlib.contextmanager
def EmulatedMPS() -> Iterator[None]:
    """Run the body as if this machine had an MPS device, with its limits enforced (see the module docstring)."""
    import safetensors.torch

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        patch(mock.patch.object(torch.backends.mps, "is_available", lambda: True))
        patch(mock.patch.object(torch.backends.mps, "is_built", lambda: True))
        patch(mock.patch.object(torch.mps, "is_available", lambda: True))
        patch(mock.patch.object(torch.mps, "current_allocated_memory", lambda: FAKE_ALLOCATED))
        patch(mock.patch.object(torch.mps, "driver_allocated_memory", lambda: FAKE_DRIVER))
        patch(mock.patch.object(torch.mps, "recommended_max_memory", lambda: FAKE_RECOMMENDED))
        patch(mock.patch.object(torch.mps, "synchronize", lambda: None))
        patch(mock.patch.object(torch.mps, "empty_cache", lambda: None))
        patch(mock.patch.object(safetensors.torch, "safe_open", _safe_open_refusing_mps(safetensors.torch.safe_open)))
        patch(mock.patch.object(torch, "load", _torch_load_refusing_mps(torch.load)))
        patch(_MPSMode())
        yield

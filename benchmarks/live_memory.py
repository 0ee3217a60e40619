"""Peak of the tensor memory a region of code allocates, counted exactly from the tensors' storages (any device).

`LiveTensorBytes` is a TorchDispatchMode: every op that runs inside it hands back its outputs, and each output
storage that is new (none of the op's inputs shares it: not a view, not an in-place result) is counted with its
byte size until the storage is freed (a weak reference's callback). The peak is taken after every op, so it is the
largest sum of live tensor bytes the region ever held: what a GPU caching allocator's max_memory_allocated shows
for the same code, less its rounding and kernels' hidden work space, and independent of how the host's malloc
keeps or returns freed pages (a process's peak RSS is a high-water mark of the allocator, not of live tensors).
Storages that existed before the region (weights, optimizer state, the batch) are not counted; gradients of the
`grads_of` parameters are counted apart (`grad_bytes`), so `peak_bytes` is activations and temporaries only.

Why not torch.distributed._tools.mem_tracker.MemTracker (torch 2.11): it registers a gradient hook on every
parameter of a module it meets and raises on frozen ones ("cannot register a hook on a tensor that doesn't
require gradient"), and the MoT model's towers are frozen.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of storages created inside the mode while they live; `peak_bytes` is their largest sum.

    Args:
        grads_of: parameters whose .grad storages are moved out of the count once accumulated (into `grad_bytes`).
    """

    def __init__(self, grads_of: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live_bytes = 0  # storages created in the mode, alive, not parameters' gradients
        self.peak_bytes = 0
        self.grad_bytes = 0  # storages created in the mode that became a parameter's .grad
        self._live: dict[int, int] = {}  # StorageImpl address -> bytes, for storages counted in live_bytes
        self._params = list(grads_of)
        self._hooks: list = []

    def __enter__(self) -> LiveTensorBytes:
        self._hooks = [p.register_post_accumulate_grad_hook(self._to_grad) for p in self._params if p.requires_grad]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }  # storages the op read or wrote in place: its outputs that share one are no new memory
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key = st._cdata
                if key not in inputs and key not in self._live and st.nbytes() > 0:
                    self._live[key] = st.nbytes()
                    self.live_bytes += st.nbytes()
                    weakref.finalize(st, self._free, key)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def _to_grad(self, p: torch.Tensor) -> None:
        """A gradient was accumulated into p.grad: its storage is a gradient now, not an activation."""
        n = self._live.pop(p.grad.untyped_storage()._cdata, 0)
        self.live_bytes -= n
        self.grad_bytes += n

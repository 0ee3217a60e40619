"""The generation cache of the MoT adapter: every layer's keys and values of the positions seen so far."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class MoTKVCache:
    """Keys and values of every MoT layer for the positions seen so far (what `forward_step` returns and takes).

    Preallocated and written in place (like transformers' `StaticCache`), so a decoding step copies only its own
    keys; a full cache doubles its buffers. keys[l], values[l]: [B, n_kv_heads, S_total, head_dim], after RoPE,
    before the GQA repeat; S_total counts pads (they stay masked).
    """

    def __init__(self, keys: list[torch.Tensor] | None = None, values: list[torch.Tensor] | None = None) -> None:
        """A full cache of the given per-layer keys/values [B, KV, S_total, hd] (or an empty one)."""
        self._k, self._v = list(keys or []), list(values or [])  # per layer [B, KV, capacity, hd]
        self._len = int(self._k[0].shape[2]) if self._k else 0
        self.capacity = self._len
        self.has_pads = False  # a pad among the cached positions (set by forward_step; decode_step needs a mask)

    @classmethod
    def allocate(cls, max_len: int) -> MoTKVCache:
        """An empty cache with room for `max_len` positions (buffers are made by each layer's first update)."""
        cache = cls()
        cache.capacity = int(max_len)
        return cache

    @property
    def seq_len(self) -> int:
        return self._len

    @property
    def keys(self) -> list[torch.Tensor]:
        return [k[:, :, : self._len] for k in self._k]  # per layer [B, KV, S_total, hd]

    @property
    def values(self) -> list[torch.Tensor]:
        return [v[:, :, : self._len] for v in self._v]

    def layer(self, index: int) -> LayerKV:
        """Layer `index`'s handle, what MoTLayer.forward takes as `past`."""
        return LayerKV(self, index)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer's new keys/values k, v [B, KV, S_new, hd] at seq_len -> filled views [B, KV, S_total + S_new, hd].

        seq_len itself moves on in `advance`, once every layer has written the same new positions.
        """
        end = self._len + k.shape[2]
        if layer == len(self._k):  # this layer's first write: make its buffers
            shape = (k.shape[0], k.shape[1], max(self.capacity, end), k.shape[3])
            self._k.append(k.new_empty(shape))  # [B, KV, capacity, hd]
            self._v.append(v.new_empty(shape))
        if end > self._k[layer].shape[2]:  # out of room: double (keeps appends amortised O(1))
            grow = max(end, 2 * self._k[layer].shape[2]) - self._k[layer].shape[2]
            pad = (0, 0, 0, grow)  # pads dim 2 (positions) at the end
            self._k[layer] = F.pad(self._k[layer], pad)
            self._v[layer] = F.pad(self._v[layer], pad)
        self._k[layer][:, :, self._len : end] = k
        self._v[layer][:, :, self._len : end] = v
        self.capacity = max(self.capacity, self._k[layer].shape[2])
        return self._k[layer][:, :, :end], self._v[layer][:, :, :end]  # [B, KV, S_total + S_new, hd]

    def advance(self, n_new: int) -> MoTKVCache:
        """Count the n_new positions every layer has just written (returns self)."""
        self._len += int(n_new)
        return self

    def select(self, batch_idx: torch.Tensor) -> MoTKVCache:
        """Rows batch_idx [B'] of the batch (reorder, repeat for sampling several continuations, drop finished)."""
        out = MoTKVCache()
        out._k = [k.index_select(0, batch_idx) for k in self._k]  # [B', n_kv, capacity, hd]
        out._v = [v.index_select(0, batch_idx) for v in self._v]
        out._len, out.capacity, out.has_pads = self._len, self.capacity, self.has_pads
        return out


@dataclass
class LayerKV:
    """One layer's view of a MoTKVCache: `update(k, v)` writes there and returns the filled keys/values."""

    cache: MoTKVCache
    index: int

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(self.index, k, v)

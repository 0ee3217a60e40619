"""The preallocated KV cache (MoTKVCache.allocate): written in place, never reallocated while it has room, and the
same logits as one full forward; a cache from forward_step(cache=None) still grows."""

from __future__ import annotations

import torch

from adapter_trainer.data.token_layout import collate
from adapter_trainer.model.kv_cache import MoTKVCache
from tests.trainer.helpers import example, tiny_mot

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32, same math in a different order


def test_preallocated_cache_is_written_in_place_and_matches_the_full_forward() -> None:
    model, vocab = tiny_mot("delay")
    model.eval()
    batch = collate([example(vocab, 5, 6, seed=1), example(vocab, 3, 4, seed=2)], pad_id=0)
    S = batch.tokens.shape[1]
    with torch.no_grad():
        full, _ = model.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)  # [B, S, H, size]
        cache = MoTKVCache.allocate(S)
        pieces, ptrs, start = [], None, 0
        for end in [S - 4, S - 3, S - 1, S]:
            logits, cache = model.forward_step(
                batch.tokens[:, start:end], batch.is_audio[:, start:end], batch.attention_mask[:, :end], cache
            )
            got = [k.data_ptr() for k in cache.keys]
            assert ptrs is None or got == ptrs  # the same buffers every step: no copy of the past
            ptrs, start = got, end
            assert cache.seq_len == end and cache.capacity == S
            pieces.append(logits)
    # Real positions only: a right-padded forward without a cache runs maskless (causal order suffices there), so
    # its pad positions see other pads; no real position ever reads a pad's output.
    real = batch.attention_mask.bool()  # [B, S]
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], full[real], **TOL)


def test_a_full_cache_grows_and_select_keeps_the_length() -> None:
    model, vocab = tiny_mot("flatten")
    model.eval()
    batch = collate([example(vocab, 4, 3, seed=3, pattern="flatten")] * 2, pad_id=0)
    S = batch.tokens.shape[1]
    with torch.no_grad():
        full, _ = model.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)
        _, cache = model.forward_step(batch.tokens[:, :-2], batch.is_audio[:, :-2], batch.attention_mask[:, :-2])
        assert cache.capacity == S - 2  # exactly full
        cache = cache.select(torch.tensor([1, 0]))
        for p in (S - 2, S - 1):
            logits, cache = model.forward_step(
                batch.tokens[:, p : p + 1], batch.is_audio[:, p : p + 1], batch.attention_mask[:, : p + 1], cache
            )
            torch.testing.assert_close(logits[:, 0], full[:, p], **TOL)
        assert cache.seq_len == S and cache.capacity >= S


def test_under_bf16_autocast_the_cache_holds_keys_in_the_compute_dtype() -> None:
    """fp32 towers under bf16 autocast (cuda_1b's settings, here on CPU): RoPE's fp32 cos/sin must not promote the
    keys, or K is stored in fp32 (twice V's bytes) and re-cast to bf16 by sdpa's autocast every layer every step.
    The logits are those of the full forward (bf16 tolerance: the cache is read back exactly as sdpa got it)."""
    model, vocab = tiny_mot("delay")
    model.eval()
    batch = collate([example(vocab, 5, 6, seed=1), example(vocab, 3, 4, seed=2)], pad_id=0)
    S = batch.tokens.shape[1]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full, _ = model.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)
        _, cache = model.forward_step(
            batch.tokens[:, :-1], batch.is_audio[:, :-1], batch.attention_mask[:, :-1], MoTKVCache.allocate(S)
        )
        last, cache = model.forward_step(batch.tokens[:, -1:], batch.is_audio[:, -1:], batch.attention_mask, cache)
    assert {k.dtype for k in cache.keys} == {v.dtype for v in cache.values} == {torch.bfloat16}
    real = batch.attention_mask[:, -1]  # rows whose last position is real
    torch.testing.assert_close(last[real, 0].float(), full[real, -1].float(), rtol=2e-2, atol=2e-2)
    with torch.no_grad():  # fp32 without autocast: fp32 keys, as before
        _, cache32 = model.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)
    assert {k.dtype for k in cache32.keys} == {torch.float32}

"""MoT attention in the form the fused GPU kernels accept, checked against the attention it replaced.

The reference is the earlier call, copied here: ALWAYS attention_mask_4d's explicit [B, 1, S, S_k] bool mask and
enable_gqa=True (which sends CUDA to the math kernel). It is swapped in for `sdpa_mask` / `attend`, so everything
else (embeddings, projections, RoPE, the KV cache, heads, loss) is the same code in both runs.

Tolerance: fp32, atol = rtol = 1e-5 on logits, losses and gradients (the kernels differ: no mask vs a mask, expanded
vs grouped k/v, so summation order may differ; a leak through the mask moves logits by ~1e-1). Only real positions
are compared: with right padding a pad query now also sees earlier pads (sdpa_mask's docstring); nothing reads it.

Eligibility cannot be shown by running a CUDA kernel on CPU (PyTorch's can_use_efficient_attention stops at "all
tensors need to be on cuda", and CPU has only its flash and math kernels), so the tests assert the arguments the
kernels' rules depend on: no mask whenever causal order alone is exact (flash), and never enable_gqa with a mask
(memory-efficient / cuDNN reject it). `make bench-gpu` checks on CUDA which kernel actually ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import adapter_trainer.model.layers as layers_module
import adapter_trainer.model.mot as mot_module
from adapter_trainer.data.token_layout import Batch
from adapter_trainer.model import attention
from adapter_trainer.model.attention import attention_mask_4d
from adapter_trainer.model.kv_cache import MoTKVCache
from adapter_trainer.model.mot import MoTAdapterModel
from tests.trainer.model.test_mot_attention import VARIANTS, left_pad, make, make_batch

TOL = {"rtol": 1e-5, "atol": 1e-5}
pytestmark = pytest.mark.usefixtures("one_thread")


def reference_mask(attention_mask: torch.Tensor, n_new: int) -> torch.Tensor:
    """The earlier mask: always explicit."""
    return attention_mask_4d(attention_mask.bool(), n_new)  # [B, 1, n_new, S_k]


def reference_attend(q, k, v, allowed, scale, dropout_p=0.0) -> torch.Tensor:
    """The earlier call, verbatim: explicit bool mask, grouped k/v via enable_gqa."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True, dropout_p=dropout_p
    )  # [B, H, S, hd]


@pytest.fixture
def use_reference(monkeypatch: pytest.MonkeyPatch):
    """Context switch: inside `with use_reference():` the model runs the earlier attention."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(mot_module, "sdpa_mask", reference_mask)
            mp.setattr(layers_module, "attend", reference_attend)  # MoTLayer looks attend up in layers
            yield

    return ctx


def unpadded(batch: Batch) -> Batch:
    """Every row cut to the shortest row's length: no padding at all."""
    n = int(batch.attention_mask.sum(1).min())
    return Batch(
        batch.tokens[:, :n], batch.is_audio[:, :n], batch.labels[:, :n], batch.attention_mask[:, :n], batch.keys
    )


PADDINGS = {"right": lambda b: b, "left": left_pad, "none": unpadded}


def grads(mot: MoTAdapterModel, batch: Batch) -> tuple[float, dict[str, torch.Tensor]]:
    mot.zero_grad(set_to_none=True)
    loss = mot.compute_loss(batch).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in mot.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_loss_and_grads_equal_the_earlier_attention(
    model_dirs: dict[str, Path], variant: str, padding: str, use_reference
) -> None:
    mot = make(model_dirs, variant, "delay")
    batch = PADDINGS[padding](make_batch("delay"))
    assert bool(batch.attention_mask.all()) == (padding == "none")
    real = batch.attention_mask  # [B, S]
    with torch.no_grad():
        new = mot.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)[0]
        with use_reference():
            ref = mot.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)[0]
    torch.testing.assert_close(new[real], ref[real], **TOL)
    mot.train()
    loss_new, g_new = grads(mot, batch)
    with use_reference():
        loss_ref, g_ref = grads(mot, batch)
    assert loss_new == pytest.approx(loss_ref, rel=1e-5, abs=1e-5)
    assert g_new.keys() == g_ref.keys() and len(g_new) > 0
    for name in g_new:
        torch.testing.assert_close(g_new[name], g_ref[name], **TOL, msg=name)


@pytest.mark.parametrize("prompt_padding", ["left", "none"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kv_cache_decoding_equals_the_earlier_attention(
    model_dirs: dict[str, Path], variant: str, prompt_padding: str, use_reference
) -> None:
    """A prompt, then one position per call (then a 2-position call): every step's logits as before."""
    mot = make(model_dirs, variant, "flatten" if variant == "lora" else "delay")
    batch = PADDINGS[prompt_padding](make_batch(mot.pattern))
    S = batch.tokens.shape[1]
    cuts = [S - 5, S - 4, S - 3, S - 2, S]  # prompt, three single steps, then two positions at once

    def decode() -> list[torch.Tensor]:
        cache, out, start = None, [], 0
        for end in cuts:
            logits, cache = mot.forward_step(
                batch.tokens[:, start:end], batch.is_audio[:, start:end], batch.attention_mask[:, :end], cache
            )
            out.append(logits)
            start = end
        return out

    with torch.no_grad():
        new = decode()
        with use_reference():
            ref = decode()
    start = 0
    for end, a, b in zip(cuts, new, ref):
        real = batch.attention_mask[:, start:end]  # [B, n_new]
        torch.testing.assert_close(a[real], b[real], **TOL)
        start = end


class SdpaSpy:
    """Records the arguments of every F.scaled_dot_product_attention call (then runs it)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._real = F.scaled_dot_product_attention

    def __call__(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        self.calls.append(
            {
                "mask": attn_mask,
                "is_causal": is_causal,
                "enable_gqa": enable_gqa,
                "q_heads": q.shape[1],
                "kv_heads": k.shape[1],
            }
        )
        return self._real(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


def spy_calls(monkeypatch: pytest.MonkeyPatch, run) -> list[dict]:
    spy = SdpaSpy()
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        run()
    monkeypatch.undo()
    assert spy.calls, "no attention call recorded"
    for c in spy.calls:  # the rules the fused kernels impose, whatever the case
        if c["mask"] is not None:
            assert not c["enable_gqa"] and c["kv_heads"] == c["q_heads"]  # mem-efficient/cuDNN reject enable_gqa
            assert bool(c["mask"].any(-1).all())  # no fully masked query row (NaN)
    return spy.calls


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_attention_arguments_suit_the_fused_kernels(
    model_dirs: dict[str, Path], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mot = make(model_dirs, variant, "delay")
    right = make_batch("delay")
    cases = {"right": right, "left": left_pad(right), "none": unpadded(right)}
    n_layers = len(mot.layers)

    def full(b: Batch) -> list[dict]:
        return spy_calls(monkeypatch, lambda: mot.forward_step(b.tokens, b.is_audio, b.attention_mask))

    # whole sequences: no mask (causal) unless a pad comes before a real token
    for name, b in cases.items():
        calls = full(b)
        assert len(calls) == n_layers
        if name == "left":
            assert all(c["mask"] is not None for c in calls)
        else:
            assert all(c["mask"] is None and c["is_causal"] for c in calls), name

    # one new query against a cache: no mask when nothing is padded, a mask when the cache holds pads
    for name in ("none", "left"):
        b = cases[name]
        S = b.tokens.shape[1]
        with torch.no_grad():
            _, cache = mot.forward_step(b.tokens[:, : S - 2], b.is_audio[:, : S - 2], b.attention_mask[:, : S - 2])
        one = spy_calls(
            monkeypatch,
            lambda b=b, S=S, cache=cache: mot.forward_step(
                b.tokens[:, S - 2 : S - 1], b.is_audio[:, S - 2 : S - 1], b.attention_mask[:, : S - 1], cache
            ),
        )
        if name == "none":
            assert all(c["mask"] is None and not c["is_causal"] for c in one)
        else:
            assert all(c["mask"] is not None for c in one)

    # two new queries after a past: sdpa's is_causal would align the triangle wrongly, so a mask
    b = cases["none"]
    S = b.tokens.shape[1]
    with torch.no_grad():
        _, cache = mot.forward_step(b.tokens[:, : S - 2], b.is_audio[:, : S - 2], b.attention_mask[:, : S - 2])
    two = spy_calls(
        monkeypatch, lambda: mot.forward_step(b.tokens[:, S - 2 :], b.is_audio[:, S - 2 :], b.attention_mask, cache)
    )
    assert all(c["mask"] is not None for c in two)


def test_half_precision_without_mask_keeps_grouped_heads_for_flash(
    model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 autocast, no padding: flash's form (no mask, enable_gqa, k/v not expanded); fp32 expands k/v."""
    mot = make(model_dirs, "shared", "delay")
    b = unpadded(make_batch("delay"))

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mot.forward_step(b.tokens, b.is_audio, b.attention_mask)

    calls = spy_calls(monkeypatch, run)
    assert all(c["mask"] is None and c["enable_gqa"] and c["kv_heads"] < c["q_heads"] for c in calls)
    fp32 = spy_calls(monkeypatch, lambda: mot.forward_step(b.tokens, b.is_audio, b.attention_mask))
    assert all(not c["enable_gqa"] and c["kv_heads"] == c["q_heads"] for c in fp32)


def test_attend_refuses_no_mask_for_several_queries_after_a_past() -> None:
    q, kv = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="S == S_k"):
        attention.attend(q, kv, kv, None, 1.0)


@pytest.mark.parametrize("prompt_padding", ["left", "none"])
def test_a_decoding_step_reads_the_cache_without_copying_it(
    model_dirs: dict[str, Path], prompt_padding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One new query (fp32, with or without pads in the cache): sdpa gets the cache's own key/value buffers, not
    copies expanded to the query heads (an expansion per step copies the whole past, H/KV times what the torch.cat
    cache did). The logits equal the earlier attention's (test_kv_cache_decoding_equals_the_earlier_attention)."""
    mot = make(model_dirs, "shared", "delay")
    b = PADDINGS[prompt_padding](make_batch("delay"))
    S = b.tokens.shape[1]
    with torch.no_grad():
        _, cache = mot.forward_step(
            b.tokens[:, : S - 1],
            b.is_audio[:, : S - 1],
            b.attention_mask[:, : S - 1],
            MoTKVCache.allocate(S),
        )
    buffers = {k.untyped_storage().data_ptr() for k in cache._k} | {v.untyped_storage().data_ptr() for v in cache._v}
    seen: list[int] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.extend([k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()])
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        mot.forward_step(b.tokens[:, S - 1 :], b.is_audio[:, S - 1 :], b.attention_mask, cache)
    assert len(seen) == 2 * len(mot.layers)
    assert set(seen) <= buffers


def test_mha_with_a_mask_passes_the_cache_buffers_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """As many k/v heads as query heads (MHA): nothing to expand, so sdpa gets k/v themselves (repeat_interleave(1)
    copied the whole cache every layer every step)."""
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    allowed = attention_mask_4d(torch.ones(2, 5, dtype=torch.bool), 3)  # [2, 1, 3, 5]
    seen: list[int] = []
    real = F.scaled_dot_product_attention

    def spy(q_, k_, v_, *args, **kwargs):
        seen.extend([k_.data_ptr(), v_.data_ptr()])
        return real(q_, k_, v_, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = attention.attend(q, k, v, allowed, 0.5)
    assert seen == [k.data_ptr(), v.data_ptr()]
    torch.testing.assert_close(out, real(q, k, v, attn_mask=allowed, scale=0.5))

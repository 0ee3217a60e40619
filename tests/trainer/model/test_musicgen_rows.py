"""`model.mot.audio_tower=musicgen` (model/musicgen_rows.py): audio rows run MusicGen's own decoder layers.

At init the audio logits equal transformers' `MusicgenForCausalLM` on the same codes (its delay pattern and special
ids, unconditional), and the caption states are the Llama's own; the caption path is exactly zero until it is
trained; an empty caption is MusicGen's exact null however trained the path is; the projection learns from the first
step and `caption_scale` rises from 0; the trainable set; the refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from adapter_trainer.data.token_layout import collate
from adapter_trainer.model.builders import tiny_llama_config
from adapter_trainer.model.musicgen_rows import MusicgenRowsMoT, default_caption_layer_map
from tests.trainer.model.test_musicgen_transfer import (
    TEXT_V,
    VOCAB,
    C,
    K,
    codes_grid,
    distinct_musicgen,
    musicgen_pattern,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_llm(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    lc = tiny_llama_config()
    lc.vocab_size = TEXT_V
    return LlamaForCausalLM(lc).eval()


def rows_model(mg=None, **options) -> MusicgenRowsMoT:
    torch.manual_seed(0)
    mg = mg if mg is not None else distinct_musicgen()
    return MusicgenRowsMoT(tiny_llm(), mg, VOCAB, "delay", **options).eval()


def example(codes: np.ndarray, caption: list[int]):
    from adapter_trainer.data.token_layout import encode_example

    return encode_example(caption, codes, vocab=VOCAB, pattern="delay", bos_id=1, max_seq_len=64,
                          max_caption_tokens=12, crop="start", rng=np.random.default_rng(0))  # fmt: skip


def train_caption_path(model: MusicgenRowsMoT, seed: int = 1) -> None:
    """Stand-in for a trained caption path: every trainable tensor moved off its init (projections nonzero, gates
    open), so the caption changes the audio rows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def musicgen_logits(mg, codes: np.ndarray) -> torch.Tensor:
    """[T + K, K, C] MusicgenForCausalLM's unconditional logits over the delay pattern of `codes`."""
    with torch.no_grad():
        return mg(input_ids=musicgen_pattern(mg, codes)).logits.reshape(K, -1, C).transpose(0, 1)


def test_audio_logits_equal_musicgens_own_at_init() -> None:
    mg = distinct_musicgen()
    model = rows_model(mg)
    clips = [codes_grid(T=9), np.roll(codes_grid(T=6), 2, axis=0)]
    exs = [example(clips[0], [5, 6, 7]), example(clips[1], [9, 10, 11, 12, 13])]  # captions and clips of other lengths
    batch = collate(exs, pad_id=2)
    with torch.no_grad():
        logits = model(batch.tokens, batch.is_audio, batch.attention_mask)  # [B, S, K, C + 1]
    for b, (codes, ex) in enumerate(zip(clips, exs)):
        ours = logits[b, : ex.tokens.shape[0]][ex.is_audio][..., :C]  # [T + K, K, C] from AUDIO_START on
        torch.testing.assert_close(ours, musicgen_logits(mg, codes), rtol=1e-5, atol=1e-5)


def test_caption_states_are_the_llamas_and_the_caption_path_is_zero_until_trained() -> None:
    model = rows_model()
    ex = example(codes_grid(T=5), [5, 6, 7, 8])
    tokens, is_audio, mask = ex.tokens[None], ex.is_audio[None], torch.ones_like(ex.is_audio)[None]
    other = example(codes_grid(T=5), [40, 41, 42, 43])  # same audio, another caption
    with torch.no_grad():
        states, text_mask = model._text_states(tokens, is_audio, mask)
        n_text = int((~ex.is_audio).sum())
        ref = model.llm.model(input_ids=tokens[:, :n_text, 0], output_hidden_states=True).hidden_states
        for m, ell in enumerate(model.layer_map):
            torch.testing.assert_close(states[m][:, :n_text], ref[ell + 1], rtol=1e-5, atol=1e-6)
        assert torch.equal(model(tokens, is_audio), model(other.tokens[None], other.is_audio[None]))  # path closed
        assert model.caption_scale() == 0.0
        train_caption_path(model)
        assert not torch.allclose(model(tokens, is_audio), model(other.tokens[None], other.is_audio[None]))


def eager_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention as the kernels that give NaN on a fully masked row compute it (softmax over
    -inf alone); torch's CPU kernels return 0 there, CUDA and MPS kernels need not."""
    if enable_gqa:
        k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3) for t in (k, v))
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return torch.softmax(scores, dim=-1) @ v


def test_an_empty_caption_is_musicgens_exact_null_however_trained(monkeypatch) -> None:
    """Keys come from the caption rows after BOS: a BOS-only row (caption dropout's, CFG's unconditional rows) gets
    exactly MusicgenForCausalLM's unconditional logits from a trained path, and no NaN reaches any gradient, even from
    an attention kernel that gives NaN where a row has no key."""
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", eager_sdpa)
    mg = distinct_musicgen()
    model = rows_model(mg).train()
    train_caption_path(model)
    clips = [codes_grid(T=7), np.roll(codes_grid(T=9), 3, axis=0)]
    exs = [example(clips[0], []), example(clips[1], [5, 6, 7, 8])]  # empty caption, then a real one (longer rows)
    batch = collate(exs, pad_id=2)
    logits = model(batch.tokens, batch.is_audio, batch.attention_mask)
    ours = logits[0, : exs[0].tokens.shape[0]][exs[0].is_audio][..., :C]
    torch.testing.assert_close(ours.detach(), musicgen_logits(mg, clips[0]), rtol=1e-5, atol=1e-5)
    captioned = logits[1, : exs[1].tokens.shape[0]][exs[1].is_audio][..., :C]
    assert not torch.allclose(captioned.detach(), musicgen_logits(mg, clips[1]), atol=1e-3)  # the caption counts
    model.compute_loss(collate([exs[0]], pad_id=2)).loss.backward()  # a batch of empty captions alone
    model.compute_loss(batch).loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads.values()), [
        n for n, g in grads.items() if g is None or not bool(torch.isfinite(g).all())
    ]


def test_which_tensors_get_gradient_at_step_0() -> None:
    """Every layer's projection learns from the first step (its cross-attention reads zeros, so the gate and
    MusicGen's weights get none yet)."""
    model = rows_model().train()
    batch = collate([example(codes_grid(T=8), [5, 6, 7]), example(codes_grid(T=6), [8, 9])], pad_id=2)
    model.compute_loss(batch).loss.backward()
    proj = [float(c.proj.weight.grad.abs().sum()) for c in model.caption]
    gate = [float(c.gate.grad.abs()) for c in model.caption]
    assert all(g > 0.0 for g in proj), proj
    assert all(g == 0.0 for g in gate), gate


def test_caption_scale_is_its_definition_and_rises_from_zero_with_zero_proj() -> None:
    model = rows_model().train()
    batch = collate([example(codes_grid(T=8), [5, 6, 7]), example(codes_grid(T=6), [8, 9])], pad_id=2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    scales = [model.caption_scale()]
    for _ in range(3):
        opt.zero_grad()
        model.compute_loss(batch).loss.backward()
        opt.step()
        scales.append(model.caption_scale())
    assert scales[0] == 0.0 and all(b > a for a, b in zip(scales, scales[1:])), scales
    # the definition: mean over layers of |g_m| x the RMS of proj_m(norm_m(x)) for x of i.i.d. unit-variance parts
    train_caption_path(model)
    x = torch.randn(20_000, model.llm.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        rms = [float(c.gate.abs() * c.proj(c.norm(x)).pow(2).mean().sqrt()) for c in model.caption]
    assert model.caption_scale() == pytest.approx(float(np.mean(rms)), rel=0.02)


def test_the_trainable_set() -> None:
    model = rows_model().train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    in_musicgen = {n for n in trainable if n.startswith("decoder.")}  # its cross-attention, trained in place
    own = {f"caption.{m}.{t}" for m in range(len(model.caption)) for t in ("norm.weight", "proj.weight", "gate")}
    assert trainable - in_musicgen == own | {"end_head"}
    copies = {id(p) for p in model.pretrained_copy_parameters()}
    assert copies == {id(p) for n, p in model.named_parameters() if n in in_musicgen}
    want = {n for n, _ in model.named_parameters() if ".encoder_attn" in n}
    assert in_musicgen == want and len(want) == 6 * len(model.caption)  # q/k/v/o + norm weight and bias
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    batch = collate([example(codes_grid(T=8), [5, 6, 7]), example(codes_grid(T=6), [8, 9])], pad_id=2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # the second step moves what the first one's update opened
        opt.zero_grad()
        model.compute_loss(batch).loss.backward()
        opt.step()
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n


def test_state_dict_round_trip_and_refusals() -> None:
    model = rows_model()
    train_caption_path(model)
    state = model.trainable_state_dict()
    fresh = rows_model()
    fresh.load_trainable_state_dict(state)
    assert all(torch.equal(a.gate, b.gate) for a, b in zip(fresh.caption, model.caption))
    with pytest.raises(ValueError, match="missing"):
        fresh.load_trainable_state_dict({k: v for k, v in state.items() if k != "end_head"})
    assert default_caption_layer_map(24, 16)[:4] == [0, 1, 1, 2] and default_caption_layer_map(24, 16)[-1] == 15


def test_the_recipe_logs_caption_scale_for_this_tower_only() -> None:
    from adapter_trainer.training.model_figures import model_figures
    from tests.trainer.helpers import tiny_mot

    model = rows_model()
    train_caption_path(model)
    assert model_figures(model) == {"caption_scale": model.caption_scale()} and model.caption_scale() > 0
    assert model_figures(tiny_mot()[0]) == {}  # the llm tower has no such figure

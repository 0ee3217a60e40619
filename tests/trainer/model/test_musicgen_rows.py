"""`model.mot.audio_tower=musicgen` (model/musicgen_rows.py): audio rows run MusicGen's own decoder layers.

At init the audio logits equal transformers' `MusicgenForCausalLM` on the same codes (its delay pattern and special
ids, unconditional) and the caption states are the Llama's own; the caption path is exactly zero until its gates
move; generation (prompt, then one position per step) equals one full forward; only the caption path trains.
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


def rows_model(mg=None) -> MusicgenRowsMoT:
    torch.manual_seed(0)
    return MusicgenRowsMoT(tiny_llm(), mg if mg is not None else distinct_musicgen(), VOCAB, "delay").eval()


def example(codes: np.ndarray, caption: list[int]):
    from adapter_trainer.data.token_layout import encode_example

    return encode_example(caption, codes, vocab=VOCAB, pattern="delay", bos_id=1, max_seq_len=64,
                          max_caption_tokens=12, crop="start", rng=np.random.default_rng(0))  # fmt: skip


def open_gates(model: MusicgenRowsMoT, value: float = 0.7) -> None:
    with torch.no_grad():
        for c in model.caption:
            c.gate.fill_(value)


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
            pattern = musicgen_pattern(mg, codes)  # [K, T + K]: BOS, codes delayed, pad
            theirs = mg(input_ids=pattern).logits.reshape(K, -1, C).transpose(0, 1)  # [T + K, K, C]
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_caption_states_are_the_llamas_and_the_caption_path_is_zero_until_the_gates_open() -> None:
    model = rows_model()
    ex = example(codes_grid(T=5), [5, 6, 7, 8])
    tokens, is_audio, mask = ex.tokens[None], ex.is_audio[None], torch.ones_like(ex.is_audio)[None]
    with torch.no_grad():
        states, text_mask = model._text_states(tokens, is_audio, mask)
        n_text = int((~ex.is_audio).sum())
        ref = model.llm.model(input_ids=tokens[:, :n_text, 0], output_hidden_states=True).hidden_states
        for m, ell in enumerate(model.layer_map):
            torch.testing.assert_close(states[m][:, :n_text], ref[ell + 1], rtol=1e-5, atol=1e-6)
        other = example(codes_grid(T=5), [40, 41, 42, 43])  # same audio, another caption
        a = model(tokens, is_audio)
        b = model(other.tokens[None], other.is_audio[None])
        assert torch.equal(a, b)  # gates at 0: the caption does not reach the audio rows at all
        open_gates(model)
        assert not torch.allclose(model(tokens, is_audio), model(other.tokens[None], other.is_audio[None]))


def test_generation_steps_equal_one_full_forward() -> None:
    """Left-padded prompts of two caption lengths, then audio positions one at a time: each step's logits equal the
    full forward's at that position (gates open, so the caption path counts too)."""
    model = rows_model()
    open_gates(model)
    rng = np.random.default_rng(3)
    caps = [[5, 6, 7], [8, 9, 10, 11, 12]]
    P = 1 + max(len(c) for c in caps) + 1  # BOS, caption, AUDIO_START
    prompt = torch.zeros(2, P, K, dtype=torch.long)
    mask = torch.zeros(2, P, dtype=torch.bool)
    for b, cap in enumerate(caps):
        row = [1, *cap]
        prompt[b, P - 1 - len(row) : P - 1] = torch.tensor(row)[:, None]
        mask[b, P - 1 - len(row) :] = True
    prompt[:, P - 1] = VOCAB.audio_start
    is_audio = torch.zeros(2, P, dtype=torch.bool)
    is_audio[:, P - 1] = True
    steps = [torch.tensor(rng.integers(0, C, (2, K))) + VOCAB.text_vocab_size + torch.arange(K) * C for _ in range(4)]
    with torch.no_grad():
        logits, cache = model.forward_step(prompt, is_audio, mask, None)
        got = [logits[:, -1]]
        for s, step in enumerate(steps):
            full_mask = torch.cat([mask, torch.ones(2, s + 1, dtype=torch.bool)], dim=1)
            logits, cache = model.forward_step(step[:, None], torch.ones(2, 1, dtype=torch.bool), full_mask, cache)
            got.append(logits[:, -1])
        tokens = torch.cat([prompt, torch.stack(steps, dim=1)], dim=1)
        all_audio = torch.cat([is_audio, torch.ones(2, len(steps), dtype=torch.bool)], dim=1)
        full = model(tokens, all_audio, torch.cat([mask, torch.ones(2, len(steps), dtype=torch.bool)], dim=1))
    for i, g in enumerate(got):
        torch.testing.assert_close(g, full[:, P - 1 + i], rtol=1e-5, atol=1e-5)


def test_only_the_caption_path_trains_and_the_gate_moves_first() -> None:
    model = rows_model().train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    in_musicgen = {n for n in trainable if n.startswith("decoder.")}  # its cross-attention, trained in place
    assert in_musicgen and all(".encoder_attn" in n for n in in_musicgen), sorted(in_musicgen)[:5]
    assert all(n.startswith(("caption.", "end_head")) for n in trainable - in_musicgen)
    assert "caption.0.gate" in trainable and "caption.0.proj.weight" in trainable
    copies = {id(p) for p in model.pretrained_copy_parameters()}
    assert copies == {id(p) for n, p in model.named_parameters() if n in in_musicgen}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    batch = collate([example(codes_grid(T=8), [5, 6, 7]), example(codes_grid(T=6), [8, 9])], pad_id=2)
    loss = model.compute_loss(batch).loss
    loss.backward()
    gate_grads = [float(c.gate.grad) for c in model.caption]
    assert any(g != 0.0 for g in gate_grads)
    assert all(float(c.proj.weight.grad.abs().sum()) == 0.0 for c in model.caption)  # behind a closed gate
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    opt.step()
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n


def test_state_dict_round_trip_and_refusals() -> None:
    model = rows_model()
    open_gates(model, 0.3)
    state = model.trainable_state_dict()
    fresh = rows_model()
    fresh.load_trainable_state_dict(state)
    assert all(float(c.gate.detach()) == pytest.approx(0.3) for c in fresh.caption)
    with pytest.raises(ValueError, match="missing"):
        fresh.load_trainable_state_dict({k: v for k, v in state.items() if k != "end_head"})
    with pytest.raises(ValueError, match="data.pattern=delay"):
        MusicgenRowsMoT(tiny_llm(), distinct_musicgen(), VOCAB, "flatten")
    with pytest.raises(ValueError, match="one entry per MusicGen layer"):
        MusicgenRowsMoT(tiny_llm(), distinct_musicgen(), VOCAB, "delay", layer_map=[0, 1])
    assert default_caption_layer_map(24, 16)[:4] == [0, 1, 1, 2] and default_caption_layer_map(24, 16)[-1] == 15

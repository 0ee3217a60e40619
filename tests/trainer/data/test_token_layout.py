"""Token layout: round trips, delay pattern vs a loop reference and vs transformers' MusicGen, loss mask, crops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adapter_trainer.data.token_layout import (
    IGNORE_INDEX,
    AudioVocab,
    DelayPattern,
    collate,
    decode_audio_tokens,
    encode_example,
)

V, K, C = 1000, 4, 2048
VOCAB = AudioVocab(text_vocab_size=V, n_codebooks=K, codebook_size=C)
BOS = 1


def _codes(T: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, C, size=(T, K)).astype(np.int16)  # [T, K]


def _audio_part(ex, pattern: str) -> torch.Tensor:
    """tokens after AUDIO_START (with the clip's AUDIO_END where the crop reaches it)."""
    col = ex.tokens[:, 0]
    start = int((col == VOCAB.audio_start).nonzero()[0]) + 1
    return ex.tokens[start:]


def ref_delay(codes: np.ndarray, pad: int) -> np.ndarray:
    """Slow loop reference: step s slot k = codes[s - k, k] if 0 <= s - k < T else pad."""
    T, n_q = codes.shape
    out = np.full((T + n_q - 1, n_q), pad, dtype=np.int64)
    for s in range(T + n_q - 1):
        for k in range(n_q):
            if 0 <= s - k < T:
                out[s, k] = codes[s - k, k]
    return out


def test_vocab_layout_offsets_distinct() -> None:
    ids = {VOCAB.code_id(k, c) for k in range(K) for c in (0, 1, C - 1)}
    assert len(ids) == K * 3
    assert VOCAB.code_id(0, 0) == V and VOCAB.code_id(3, C - 1) == V + K * C - 1
    assert (VOCAB.audio_start, VOCAB.audio_end, VOCAB.audio_pad) == (V + K * C, V + K * C + 1, V + K * C + 2)
    assert VOCAB.size == V + K * C + 3
    with pytest.raises(ValueError, match="out of range"):
        VOCAB.code_id(K, 0)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("n_q", [1, 2, 4])
def test_delay_pattern_matches_loop_and_round_trips(T: int, n_q: int) -> None:
    codes = torch.randint(0, C, (T, n_q))  # [T, K]
    dp = DelayPattern(n_q)
    built = dp.build(codes, pad_value=-7)  # [T+K-1, K]
    assert built.shape == (T + n_q - 1, n_q)
    np.testing.assert_array_equal(built.numpy(), ref_delay(codes.numpy(), -7))
    assert torch.equal(dp.revert(built), codes)


def test_delay_pattern_matches_transformers_musicgen() -> None:
    """Same code/pad positions as MusicgenForCausalLM.build_delay_pattern_mask, minus its BOS column."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    n_q, T, pad = 4, 5, 2048
    cfg = MusicgenDecoderConfig(
        vocab_size=2048, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32, num_codebooks=n_q
    )
    model = MusicgenForCausalLM(cfg).eval()
    codes = torch.randint(0, 2048, (T, n_q))  # [T, K]
    # MusicGen's input is (K, 1 + T): a BOS (= pad id) column, then the codes.
    prompt = torch.cat([torch.full((n_q, 1), pad), codes.T], dim=1)  # [K, 1+T]
    _, hf_full = model.build_delay_pattern_mask(prompt, pad_token_id=pad, max_length=T + n_q)  # [K, T+K]
    hf_full = hf_full[:, 1:]  # drop the BOS column -> [K, T+K-1]
    ours = DelayPattern(n_q).build(codes, pad_value=-1).T  # [T+K-1, K] -> [K, T+K-1]
    is_code_hf = hf_full != pad
    assert torch.equal(is_code_hf, ours != -1)
    assert torch.equal(hf_full[is_code_hf], ours[ours != -1])
    # Generation from BOS only: its -1 cells (to be predicted) are exactly our code cells, P our pad cells.
    _, hf_gen = model.build_delay_pattern_mask(prompt[:, :1], pad_token_id=pad, max_length=T + n_q)  # [K, T+K]
    hf_gen = hf_gen[:, 1:]  # [K, T+K-1]
    assert set(hf_gen.unique().tolist()) == {-1, pad}
    assert torch.equal(hf_gen == -1, ours != -1)


@pytest.mark.parametrize("pattern", ["flatten", "delay"])
@pytest.mark.parametrize("T", [1, 4, 33])
def test_round_trip_without_crop(pattern: str, T: int) -> None:
    codes = _codes(T, seed=T)
    ex = encode_example(
        [5, 6, 7],
        codes,
        vocab=VOCAB,
        pattern=pattern,
        bos_id=BOS,
        max_seq_len=10_000,
        max_caption_tokens=64,
        crop="start",
        rng=np.random.default_rng(0),
    )
    J = 1 if pattern == "flatten" else K
    assert ex.tokens.shape[1] == J
    audio = _audio_part(ex, pattern)
    # whole clip -> one AUDIO_END, where frame T's first code would be: flatten position T*K, delay slot 0 of step T
    assert int((ex.tokens == VOCAB.audio_end).sum()) == 1
    assert int(audio[T * K if pattern == "flatten" else T, 0]) == VOCAB.audio_end
    np.testing.assert_array_equal(decode_audio_tokens(audio, vocab=VOCAB, pattern=pattern), codes)
    if pattern == "flatten":  # = the shard's row-major flattening, with offsets, then END
        offs = V + C * np.arange(K)
        np.testing.assert_array_equal(audio[:-1, 0].numpy(), (codes + offs).reshape(-1))
    else:  # the delay pattern with END in slot 0 of step T; the tail steps keep the delayed codebooks
        want = ref_delay(codes.astype(np.int64) + V + C * np.arange(K), VOCAB.audio_pad)
        want[T, 0] = VOCAB.audio_end
        np.testing.assert_array_equal(audio.numpy(), want)


@pytest.mark.parametrize("pattern", ["flatten", "delay"])
def test_random_crop_is_contiguous_window_and_fits(pattern: str) -> None:
    T = 120
    codes = _codes(T, seed=3)
    rng = np.random.default_rng(1)
    seen_starts, saw_end, saw_no_end = set(), False, False
    for max_len in (20, 41, 64, 131, 200):
        for _ in range(20):
            ex = encode_example(
                list(range(10, 40)),
                codes,
                vocab=VOCAB,
                pattern=pattern,
                bos_id=BOS,
                max_seq_len=max_len,
                max_caption_tokens=8,
                crop="random",
                rng=rng,
            )
            assert ex.tokens.shape[0] <= max_len
            got = decode_audio_tokens(_audio_part(ex, pattern), vocab=VOCAB, pattern=pattern)  # [T', K]
            n = got.shape[0]
            assert n >= 1
            starts = [s for s in range(T - n + 1) if np.array_equal(codes[s : s + n], got)]
            assert starts, "crop is not a frame-aligned window of the clip"
            seen_starts.add(starts[0])
            has_end = bool((ex.tokens[:, 0] == VOCAB.audio_end).any())
            assert has_end == (starts[0] + n == T)
            saw_end |= has_end
            saw_no_end |= not has_end
    assert len(seen_starts) > 5 and saw_no_end


def test_start_crop_is_deterministic_and_begins_at_frame_zero() -> None:
    codes = _codes(100)
    kw = dict(vocab=VOCAB, pattern="delay", bos_id=BOS, max_seq_len=40, max_caption_tokens=4, crop="start")
    a = encode_example([9] * 10, codes, rng=np.random.default_rng(0), **kw)
    b = encode_example([9] * 10, codes, rng=np.random.default_rng(123), **kw)
    assert torch.equal(a.tokens, b.tokens) and a.tokens.shape[0] <= 40
    got = decode_audio_tokens(_audio_part(a, "delay"), vocab=VOCAB, pattern="delay")
    np.testing.assert_array_equal(got, codes[: got.shape[0]])
    # caption truncated to 4
    assert a.tokens[:6, 0].eq(torch.tensor([BOS, 9, 9, 9, 9, VOCAB.audio_start])).sum() == 6 * 1


@pytest.mark.parametrize("pattern", ["flatten", "delay"])
def test_labels_and_is_audio(pattern: str) -> None:
    caption = [11, 12, 13]
    codes = _codes(6)
    ex = encode_example(
        caption,
        codes,
        vocab=VOCAB,
        pattern=pattern,
        bos_id=BOS,
        max_seq_len=1000,
        max_caption_tokens=64,
        crop="start",
        rng=np.random.default_rng(0),
    )
    S, J = ex.tokens.shape
    n_prefix = 1 + len(caption) + 1
    # Text positions (BOS, caption) carry no label, and neither does AUDIO_START as a target.
    assert (ex.labels[: n_prefix - 1] == IGNORE_INDEX).all()
    assert not ex.is_audio[: n_prefix - 1].any() and ex.is_audio[n_prefix - 1 :].all()
    assert (ex.tokens[:n_prefix] == ex.tokens[:n_prefix, :1]).all()  # text repeats in every slot
    assert (ex.labels[-1] == IGNORE_INDEX).all()
    # Every label is tokens[p+1] where it is set; the rest is exactly the PAD/special targets.
    set_ = ex.labels != IGNORE_INDEX
    assert torch.equal(ex.labels[:-1][set_[:-1]], ex.tokens[1:][set_[:-1]])
    nxt = ex.tokens[1:]
    expect = ((nxt >= V) & (nxt < VOCAB.audio_start)) | (nxt == VOCAB.audio_end)
    assert torch.equal(set_[:-1], expect)
    assert not (ex.labels == VOCAB.audio_pad).any() and not (ex.labels == VOCAB.audio_start).any()
    n_code_labels = int(((ex.labels >= V) & (ex.labels < VOCAB.audio_start)).sum())
    assert n_code_labels == codes.size  # every code is a target exactly once
    assert int((ex.labels == VOCAB.audio_end).sum()) == 1  # head 0 only (delay), at the last frame's step
    end_at = (ex.labels == VOCAB.audio_end).nonzero()[0].tolist()
    assert end_at == ([n_prefix + 6 * K - 1, 0] if pattern == "flatten" else [n_prefix + 6 - 1, 0])
    if pattern == "delay":  # codebook k's labels live in slot k, in codebook k's id range
        for k in range(K):
            lab = ex.labels[:, k]
            lab = lab[(lab >= V) & (lab < VOCAB.audio_start)]
            assert ((lab - V) // C == k).all()


def test_too_short_max_seq_len_names_the_fix() -> None:
    with pytest.raises(ValueError, match="raise max_seq_len"):
        encode_example(
            [1] * 20,
            _codes(10),
            vocab=VOCAB,
            pattern="delay",
            bos_id=BOS,
            max_seq_len=24,
            max_caption_tokens=20,
            crop="start",
            rng=np.random.default_rng(0),
        )
    with pytest.raises(ValueError, match=r"\[T, 4\]"):
        encode_example(
            [1],
            _codes(10)[:, :3],
            vocab=VOCAB,
            pattern="delay",
            bos_id=BOS,
            max_seq_len=100,
            max_caption_tokens=20,
            crop="start",
            rng=np.random.default_rng(0),
        )


def test_collate_right_pads() -> None:
    rng = np.random.default_rng(0)
    kw = dict(vocab=VOCAB, pattern="delay", bos_id=BOS, max_seq_len=500, max_caption_tokens=8, crop="start", rng=rng)
    a = encode_example([3, 4], _codes(5), key="a", **kw)
    b = encode_example([3, 4, 5, 6], _codes(20), key="b", **kw)
    batch = collate([a, b], pad_id=0)
    S = max(a.tokens.shape[0], b.tokens.shape[0])
    assert batch.tokens.shape == (2, S, K) and batch.labels.shape == (2, S, K) and batch.is_audio.shape == (2, S)
    n = a.tokens.shape[0]
    assert torch.equal(batch.tokens[0, :n], a.tokens) and (batch.tokens[0, n:] == 0).all()
    assert (batch.labels[0, n:] == IGNORE_INDEX).all() and not batch.is_audio[0, n:].any()
    assert batch.attention_mask[0, :n].all() and not batch.attention_mask[0, n:].any()
    assert batch.attention_mask[1].all() and batch.keys == ["a", "b"]

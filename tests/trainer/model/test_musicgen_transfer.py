"""`audio_embed_init/audio_head_init: musicgen` is wired as transformers' MusicGen reads its tables.

Every check compares against MusicGen's own modules or functions (`embed_tokens`, `lm_heads`, its final layer norm,
`build_delay_pattern_mask`, its loss), never against a copy of our indexing. Each tower tensor first gets a distinct
random perturbation (`distinct_musicgen`), so a row taken one code, one codebook or one position off cannot match.
The mutation tests at the end shift one index and show the checks fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab, collate, encode_example
from adapter_trainer.evaluation.music_lm_baseline import music_lm_ce_per_target, music_lm_view
from adapter_trainer.model.builders import tiny_llama_config, tiny_musicgen_decoder_config
from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig

TEXT_V, K, C = 1000, 4, 2048
VOCAB = AudioVocab(TEXT_V, K, C)
BOS_TEXT, PAD_TEXT = 1, 2

pytestmark = pytest.mark.usefixtures("one_thread")


def distinct_musicgen(seed: int = 0) -> MusicgenForCausalLM:
    """A tiny MusicGen whose every weight got its own noise: no two rows of any table are alike."""
    torch.manual_seed(seed)
    mg = MusicgenForCausalLM(tiny_musicgen_decoder_config()).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in mg.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return mg


def musicgen_mot(mg: MusicgenForCausalLM, pattern: str = "delay") -> MoTAdapterModel:
    torch.manual_seed(0)
    lc = tiny_llama_config()
    lc.vocab_size = TEXT_V
    return MoTAdapterModel(LlamaForCausalLM(lc), mg, VOCAB, pattern, MoTConfig(audio_tower="llm")).eval()


def codes_grid(T: int = 6) -> np.ndarray:
    """[T, K] codes covering both ends of every codebook (0, 1, C - 2, C - 1) and values in between."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, C, (T, K))
    codes[0], codes[1], codes[2], codes[3] = 0, C - 1, 1, C - 2
    return codes.astype(np.int16)


def delay_example(codes: np.ndarray, pattern: str = "delay"):
    return encode_example(
        [5, 6, 7],
        codes,
        vocab=VOCAB,
        pattern=pattern,
        bos_id=BOS_TEXT,
        max_seq_len=64,
        max_caption_tokens=8,
        crop="start",
        rng=np.random.default_rng(0),
    )


def musicgen_pattern(mg: MusicgenForCausalLM, codes: np.ndarray) -> torch.Tensor:
    """[K, T + K] what transformers' MusicGen reads for these codes: build_delay_pattern_mask over BOS + codes."""
    T = codes.shape[0]
    prompt = torch.cat(
        [torch.full((K, 1), mg.config.bos_token_id), torch.from_numpy(codes.T.astype(np.int64))], dim=1
    )  # [K, 1 + T]
    # the second output is the whole pattern; the first stops where the prompt's codebook 0 does (generation's prompt)
    _, pattern = mg.build_delay_pattern_mask(prompt, pad_token_id=mg.config.pad_token_id, max_length=T + K)
    return pattern  # [K, T + K]


def test_code_rows_are_musicgen_embed_tokens_rows() -> None:
    mg = distinct_musicgen()
    mot = musicgen_mot(mg)
    table = mot.code_embed.detach().reshape(K, C, -1)  # row k*C + c
    for k in range(K):
        assert torch.equal(table[k], mg.model.decoder.embed_tokens[k].weight.detach()[:C]), k
    # and through the embedding path, for single codes at both ends of every codebook
    for k in range(K):
        for c in (0, 1, C - 2, C - 1):
            local = torch.full((1, K), VOCAB.n_codes + 2)  # PAD in every slot...
            local[0, k] = k * C + c  # ...but slot k holds code (k, c)
            pad_rows = sum(mg.model.decoder.embed_tokens[j].weight[mg.config.pad_token_id] for j in range(K) if j != k)
            want = mot.embed_adapter(mg.model.decoder.embed_tokens[k].weight[c] + pad_rows)
            torch.testing.assert_close(mot._embed_audio(local)[0], want, rtol=1e-5, atol=1e-6)


def check_audio_positions_embed_as_musicgen(mot: MoTAdapterModel, mg: MusicgenForCausalLM) -> None:
    """Our delay layout's audio positions, embedded, equal the adapter applied to MusicGen's own input embedding
    (the sum of its K tables over build_delay_pattern_mask's ids): codes, the BOS at AUDIO_START, the pad cells, and
    AUDIO_END, which MusicGen reads as pad (the clip fits the window, so its END is in the block)."""
    codes = codes_grid()
    ex = delay_example(codes)
    assert (ex.tokens[:, 0] == VOCAB.audio_end).any() and (ex.tokens == VOCAB.audio_pad).any()
    ours = mot.embed(ex.tokens[None], ex.is_audio[None])[0, ex.is_audio]  # [A, D] AUDIO_START onwards
    pattern = musicgen_pattern(mg, codes)  # [K, T + K]
    with torch.no_grad():
        mg_embeds = sum(mg.model.decoder.embed_tokens[k](pattern[k]) for k in range(K))  # [T + K, d_audio]
        want = mot.embed_adapter(mg_embeds)  # [T + K, D]
    assert ours.shape == want.shape
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)


def test_audio_positions_embed_what_musicgen_reads() -> None:
    mg = distinct_musicgen()
    check_audio_positions_embed_as_musicgen(musicgen_mot(mg), mg)


def test_delay_offsets_and_special_ids_match_build_delay_pattern_mask() -> None:
    """Our audio block, read as MusicGen ids (music_lm_view), IS MusicGen's pattern, and our labels are its next
    position: the same targets, the triangles never scored."""
    mg = distinct_musicgen()
    codes = codes_grid(T=7)
    batch = collate([delay_example(codes)], pad_id=PAD_TEXT)
    ids, labels, _ = music_lm_view(batch, VOCAB, bos_id=mg.config.bos_token_id, pad_id=mg.config.pad_token_id)
    pattern = musicgen_pattern(mg, codes)  # [K, T + K]
    assert torch.equal(ids, pattern)  # [B*K, A] with B = 1: position 0 is BOS, codebook k delayed by k + 1
    pad = mg.config.pad_token_id
    want = pattern[:, 1:].T.masked_fill(pad == pattern[:, 1:].T, IGNORE_INDEX)  # [T + K - 1, K]
    assert torch.equal(labels[0, :-1], want)
    assert (labels[0, -1] == IGNORE_INDEX).all()  # the last position has no next one
    assert int((labels != IGNORE_INDEX).sum()) == codes.size  # every code is a target exactly once


def test_head_logits_come_from_musicgen_lm_heads() -> None:
    mg = distinct_musicgen()
    mot = musicgen_mot(mg)
    h = torch.randn(5, mot.d_llm)
    with torch.no_grad():
        logits = mot.audio_logits(h)  # [5, K, C + 1]
        a = mg.model.decoder.layer_norm(mot.out_adapter(h))  # MusicGen's final norm, then its heads
        for k in range(K):
            torch.testing.assert_close(logits[:, k, :C], mg.lm_heads[k](a), rtol=1e-5, atol=1e-6)


def test_flatten_heads_and_start_read_musicgen_too() -> None:
    mg = distinct_musicgen()
    mot = musicgen_mot(mg, pattern="flatten")
    h = torch.randn(3, mot.d_llm)
    with torch.no_grad():
        logits = mot.audio_logits(h)[:, 0]  # [3, K*C + 1]: code (k, c) at k*C + c
        a = mg.model.decoder.layer_norm(mot.out_adapter(h))
        for k in range(K):
            torch.testing.assert_close(logits[:, k * C : (k + 1) * C], mg.lm_heads[k](a), rtol=1e-5, atol=1e-6)
        start = mot._embed_audio(torch.tensor([[VOCAB.n_codes]]))[0]  # flatten's AUDIO_START: MusicGen's position 0
        bos = sum(mg.model.decoder.embed_tokens[k].weight[mg.config.bos_token_id] for k in range(K))
        torch.testing.assert_close(start, mot.embed_adapter(bos), rtol=1e-5, atol=1e-6)


def test_music_lm_baseline_equals_musicgens_own_loss() -> None:
    """The learning check's "music LM alone" on a batch is transformers' own MusicGen loss on the same codes."""
    mg = distinct_musicgen()
    clip_codes = [codes_grid(T=9), np.roll(codes_grid(T=9), 3, axis=0)]
    batch = collate([delay_example(c) for c in clip_codes], pad_id=PAD_TEXT)
    ce = music_lm_ce_per_target(mg, batch, VOCAB)  # [B, S, K]
    for b, codes in enumerate(clip_codes):
        pattern = musicgen_pattern(mg, codes)  # [K, T + K]
        with torch.no_grad():
            loss = mg(input_ids=pattern[:, :-1], labels=pattern[:, 1:].T[None]).loss  # mean over codebooks
        # every codebook has T targets, so MusicGen's mean of per-codebook means is the mean over all targets
        torch.testing.assert_close(ce[b].sum() / codes.size, loss, rtol=1e-5, atol=1e-6)


# ---- mutation checks: shift one index, the checks above must notice


@pytest.mark.parametrize("shift", ["code", "codebook"])
def test_a_shifted_code_row_is_caught(shift: str) -> None:
    mg = distinct_musicgen()
    mot = musicgen_mot(mg)
    with torch.no_grad():
        table = mot.code_embed.reshape(K, C, -1)
        table.copy_(table.roll(1, dims=1 if shift == "code" else 0))
    with pytest.raises(AssertionError):
        check_audio_positions_embed_as_musicgen(mot, mg)


def test_a_shifted_special_row_is_caught() -> None:
    mg = distinct_musicgen()
    mot = musicgen_mot(mg)
    with torch.no_grad():
        mot.special_code_embed.copy_(mot.special_code_embed.roll(1, dims=1))  # codebook k reads k-1's BOS row
    with pytest.raises(AssertionError):
        check_audio_positions_embed_as_musicgen(mot, mg)


def test_a_shifted_head_is_caught() -> None:
    mg = distinct_musicgen()
    mot = musicgen_mot(mg)
    with torch.no_grad():
        w0 = mot.lm_heads[0].weight.clone()
        mot.lm_heads[0].weight.copy_(mot.lm_heads[1].weight)
        mot.lm_heads[1].weight.copy_(w0)
    h = torch.randn(2, mot.d_llm)
    with torch.no_grad():
        a = mg.model.decoder.layer_norm(mot.out_adapter(h))
        assert not torch.allclose(mot.audio_logits(h)[:, 0, :C], mg.lm_heads[0](a), atol=1e-4)


def test_a_delay_off_by_one_is_caught() -> None:
    mg = distinct_musicgen()
    codes = codes_grid(T=7)
    batch = collate([delay_example(codes)], pad_id=PAD_TEXT)
    ids, _, _ = music_lm_view(batch, VOCAB, bos_id=mg.config.bos_token_id, pad_id=mg.config.pad_token_id)
    shifted = musicgen_pattern(mg, np.concatenate([codes[:1], codes[:-1]]))  # every codebook one frame late
    assert not torch.equal(ids, shifted)

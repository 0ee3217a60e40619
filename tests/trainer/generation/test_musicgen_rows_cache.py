"""Generation with `audio_tower=musicgen` (model/musicgen_rows.py): the audio rows' self-attention keys/values are
cached, so each step runs one new position, and its logits equal one full forward over the same sequence: left-padded
prompts of different caption lengths and classifier-free guidance's empty-caption rows, through `forward_step` and
the sync-free `decode_step`, and through the sampler itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adapter_trainer.generation.sampling import SamplingConfig, generate_codes
from tests.trainer.generation.test_decode_step import HostReads
from tests.trainer.model.test_musicgen_rows import rows_model, train_caption_path
from tests.trainer.model.test_musicgen_transfer import VOCAB, C, K

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32: the same ops over fewer positions (a reduction order may differ)
CAPTIONS = [[5, 6, 7], [8, 9, 10, 11, 12], [], []]  # two captions, then CFG's two empty-caption rows


def trained():
    model = rows_model()
    train_caption_path(model)
    return model


def prompt(captions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[BOS, caption..., AUDIO_START] per row, left-padded as the sampler builds them -> tokens [R, P, K], is_audio
    [R, P], mask [R, P]."""
    R, P = len(captions), 2 + max(len(c) for c in captions)
    tokens = torch.full((R, P, K), 2, dtype=torch.long)
    mask = torch.zeros(R, P, dtype=torch.bool)
    for b, cap in enumerate(captions):
        row = [1, *cap, VOCAB.audio_start]
        tokens[b, P - len(row) :] = torch.tensor(row)[:, None]
        mask[b, P - len(row) :] = True
    return tokens, tokens[..., 0] == VOCAB.audio_start, mask


def test_prompt_then_single_steps_equal_one_full_forward() -> None:
    model = trained()
    tokens, is_audio, mask = prompt(CAPTIONS)
    R, P = is_audio.shape
    rng = np.random.default_rng(3)
    steps = [torch.tensor(rng.integers(0, C, (R, K))) + VOCAB.text_vocab_size + torch.arange(K) * C for _ in range(5)]
    one = torch.ones(R, 1, dtype=torch.bool)
    with torch.no_grad():
        got = {}
        for path in ("forward_step", "decode_step"):
            logits, cache = model.forward_step(tokens, is_audio, mask, model.new_generation_cache(P + len(steps)))
            got[path] = [logits[:, -1]]
            for s, step in enumerate(steps):
                full_mask = torch.cat([mask, torch.ones(R, s + 1, dtype=torch.bool)], dim=1)
                if path == "forward_step":
                    logits, cache = model.forward_step(step[:, None], one, full_mask, cache)
                else:
                    with HostReads() as reads:
                        logits, cache = model.decode_step(step[:, None], full_mask, cache)
                    assert reads.ops == [], reads.ops  # no host read: a CUDA step never waits for the GPU
                got[path].append(logits[:, -1])
            assert cache.audio.seq_len == 1 + len(steps) and cache.seq_len == P + len(steps)
        all_tokens = torch.cat([tokens, torch.stack(steps, dim=1)], dim=1)
        all_audio = torch.cat([is_audio, torch.ones(R, len(steps), dtype=torch.bool)], dim=1)
        full = model(all_tokens, all_audio, torch.cat([mask, torch.ones(R, len(steps), dtype=torch.bool)], dim=1))
    for path, logits in got.items():
        for i, g in enumerate(logits):
            torch.testing.assert_close(g, full[:, P - 1 + i], **TOL, msg=lambda m, i=i, p=path: f"{p} step {i}: {m}")
    assert not torch.allclose(full[0, P:], full[2, P:], atol=1e-3)  # the caption reaches the audio rows


class MatmulRows(TorchDispatchMode):
    """The rows of every matrix product's left operand (how many positions a projection or FFN ran on)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("mm", "addmm", "matmul", "linear"):
            x = args[1] if func.overloadpacket.__name__ == "addmm" else args[0]
            self.rows.append(int(np.prod(x.shape[:-1])))
        return func(*args, **(kwargs or {}))


def test_a_decoding_step_runs_only_the_new_position() -> None:
    """Every projection and FFN of a step runs on one position per row, however long the clip is so far."""
    model = trained()
    tokens, is_audio, mask = prompt(CAPTIONS)
    R = len(CAPTIONS)
    step = torch.full((R, 1, K), VOCAB.text_vocab_size) + torch.arange(K) * C
    with torch.no_grad():
        _, cache = model.forward_step(tokens, is_audio, mask, None)
        for _ in range(6):
            with MatmulRows() as seen:
                _, cache = model.decode_step(step, mask, cache)
            assert seen.rows and max(seen.rows) == R, seen.rows  # not R x the positions so far
    assert cache.audio.seq_len == 7


class FullRecompute:
    """A StepModel that reruns the whole sequence through the model's full forward at every step (no cache)."""

    def __init__(self, model) -> None:
        self.model = model

    def forward_step(self, tokens, is_audio, attention_mask, cache):
        hist_t = tokens if cache is None else torch.cat([cache[0], tokens], 1)
        hist_a = is_audio if cache is None else torch.cat([cache[1], is_audio], 1)
        logits = self.model(hist_t, hist_a, attention_mask)
        return logits[:, -tokens.shape[1] :], (hist_t, hist_a)


def test_the_sampler_with_the_cache_equals_full_recompute() -> None:
    model = trained()
    with torch.no_grad():
        model.end_head.zero_()  # AUDIO_END's logit 0, under the best code's: every clip runs to max_frames
    kw = dict(
        vocab=VOCAB, pattern="delay", bos_id=1, pad_id=2, max_frames=6, row_seeds=[1, 2],
        sampling=SamplingConfig(temperature=0.0, top_k=0, cfg_scale=3.0),
    )  # fmt: skip
    captions = CAPTIONS[:2]  # the sampler adds the two empty-caption rows
    fast = generate_codes(model, captions, new_cache=model.new_generation_cache, **kw)
    slow = generate_codes(FullRecompute(model), captions, **kw)
    assert fast.steps == slow.steps == 6 + K - 1
    for a, b in zip(fast.codes, slow.codes):
        np.testing.assert_array_equal(a, b)

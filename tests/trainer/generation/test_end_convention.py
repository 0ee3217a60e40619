"""One AUDIO_END convention for training and generation, derived from the training layout (not the sampler): a tiny
MoT model overfit to one short clip (token_layout.encode_example + compute_loss) and decoded greedily gives back
exactly the clip's frames and stops on AUDIO_END, for both patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adapter_trainer.data.token_layout import collate, encode_example
from adapter_trainer.generation.sampling import SamplingConfig, generate_codes
from tests.trainer.helpers import tiny_mot

N_FRAMES = 3  # a short clip: with the old delay layout the sampler returned 3 + K - 1 = 6 frames
LOSS_TARGET = 1e-3


@pytest.mark.parametrize("pattern", ["delay", "flatten"])
def test_overfit_one_clip_then_greedy_generation_returns_exactly_its_frames(pattern: str) -> None:
    model, vocab = tiny_mot(pattern, seed=0)
    rng = np.random.default_rng(0)
    caption = [11, 12, 13]
    codes = rng.integers(0, vocab.codebook_size, size=(N_FRAMES, vocab.n_codebooks)).astype(np.int16)  # [T, K]
    ex = encode_example(
        caption,
        codes,
        vocab=vocab,
        pattern=pattern,
        bos_id=1,
        max_seq_len=64,
        max_caption_tokens=8,
        crop="start",
        rng=rng,
    )
    batch = collate([ex], pad_id=0)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    model.train()
    torch.manual_seed(0)
    loss = float("inf")
    for _ in range(400):
        opt.zero_grad()
        out = model.compute_loss(batch)
        out.loss.backward()
        opt.step()
        loss = float(out.loss.detach())
        if loss < LOSS_TARGET:
            break
    assert loss < LOSS_TARGET, f"the tiny model did not overfit the clip (loss {loss:.2e})"
    assert int(out.end_count) == 1  # the clip's end is a training target

    model.eval()
    res = generate_codes(
        model,
        [caption],
        vocab=vocab,
        pattern=pattern,
        bos_id=1,
        pad_id=0,
        max_frames=4 * N_FRAMES,
        sampling=SamplingConfig(temperature=0.0, top_k=0, top_p=0.0, cfg_scale=1.0),
        row_seeds=[0],
    )
    np.testing.assert_array_equal(res.codes[0], codes)
    assert res.ended == [True]

"""The vectorised sampler on a real (tiny, random) MoT model: a clip's codes depend only on its caption and seed,
not on the batch size or its row, with CFG and top-k sampling; the preallocated KV cache gives the same clips as
forward_step's own cache."""

from __future__ import annotations

import numpy as np
import pytest

from adapter_trainer.generation.sampling import SamplingConfig, generate_codes
from adapter_trainer.model.kv_cache import MoTKVCache
from tests.trainer.helpers import tiny_mot

SAMPLING = SamplingConfig(temperature=1.0, top_k=50, top_p=0.0, cfg_scale=3.0)


def _run(model, vocab, pattern, captions, seeds, **kw):
    return generate_codes(
        model,
        captions,
        vocab=vocab,
        pattern=pattern,
        bos_id=1,
        pad_id=0,
        max_frames=5,
        sampling=SAMPLING,
        row_seeds=seeds,
        **kw,
    )


@pytest.mark.parametrize("pattern", ["delay", "flatten"])
def test_clip_depends_only_on_its_seed_not_on_batch_size_or_row(pattern: str) -> None:
    model, vocab = tiny_mot(pattern, seed=1)
    model.eval()
    caps = [[11, 12, 13], [14], [15, 16, 17, 18, 19]]
    batched = _run(model, vocab, pattern, caps, [7, 8, 9], new_cache=MoTKVCache.allocate, stop_check_every=3)
    alone = _run(model, vocab, pattern, [caps[2]], [9], new_cache=MoTKVCache.allocate)
    moved = _run(model, vocab, pattern, [caps[2], caps[0]], [9, 7])  # other row, forward_step's own cache
    np.testing.assert_array_equal(batched.codes[2], alone.codes[0])
    np.testing.assert_array_equal(batched.codes[2], moved.codes[0])
    np.testing.assert_array_equal(batched.codes[0], moved.codes[1])
    assert batched.ended[2] == alone.ended[0] == moved.ended[0]
    assert not np.array_equal(batched.codes[0], batched.codes[1])  # different seeds, different clips

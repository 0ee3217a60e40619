"""Captions -> codes from a generation source, batch by batch: the one sampling loop of `python -m
adapter_trainer.generate` and `MoTAdapter.generate`.

Caption i is tokenized as training reads it (no special tokens, cut to max_caption_tokens) and drawn from its own
generator seeded by (seed, i), so its codes depend neither on its batch nor on which of the two calls sampled it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adapter_trainer.generation import sampling as sampler  # sampler.generate_codes: one seam for tests to spy on
from adapter_trainer.generation.model_source import GenerationSource

SEED_STRIDE = 1_000_003  # caption i of seed s draws from seed s * SEED_STRIDE + i


@dataclass
class SampledCodes:
    codes: list[np.ndarray]  # per caption: int16 [T_b, K] raw codes (1 <= T_b <= max_frames)
    ended: list[bool]  # True where the model sampled AUDIO_END, False where max_frames stopped it
    max_frames: int  # round(seconds * frame_rate), at least 1
    positions: int  # audio positions decoded, summed over captions
    seconds: float  # wall time of prefill + decoding


def sample_texts(
    source: GenerationSource,
    texts: list[str],
    *,
    sampling: sampler.SamplingConfig,
    seconds: float,
    seed: int,
    batch_size: int,
    log: Callable[[str], None] | None = print,
) -> SampledCodes:
    """Sample codes for every caption of `texts` (in batches of batch_size) under the source's precision."""
    from adapter_trainer.model.kv_cache import MoTKVCache
    from adapter_trainer.training.device import autocast

    model, device = source.model, source.device
    captions = [
        list(source.tokenizer(t, add_special_tokens=False)["input_ids"])[: source.max_caption_tokens] for t in texts
    ]
    max_frames = max(1, int(round(seconds * source.frame_rate)))
    out = SampledCodes(codes=[], ended=[], max_frames=max_frames, positions=0, seconds=0.0)
    for start in range(0, len(texts), batch_size):
        idx = list(range(start, min(start + batch_size, len(texts))))
        with autocast(source.precision, device):
            res = sampler.generate_codes(
                model,
                [captions[i] for i in idx],
                vocab=source.vocab,
                pattern=source.pattern,
                bos_id=source.bos_id,
                pad_id=source.pad_id,
                max_frames=max_frames,
                sampling=sampling,
                row_seeds=[seed * SEED_STRIDE + i for i in idx],
                device=device,
                new_cache=getattr(model, "new_generation_cache", MoTKVCache.allocate),  # audio_tower=musicgen: its own
            )
        out.codes += res.codes
        out.ended += res.ended
        out.positions += res.steps * len(idx)
        out.seconds += res.seconds
        if log is not None:
            log(
                f"generate: clips {idx[0]}..{idx[-1]}: {res.steps} steps in {res.seconds:.2f} s "
                f"({res.positions_per_s:.1f} positions/s)"
            )
    return out

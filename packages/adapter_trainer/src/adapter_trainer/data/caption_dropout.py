"""Caption dropout (MusicGen's condition dropout): some training captions become the empty caption, so that
classifier-free guidance (`sampling.apply_cfg`) has learnt what an empty caption (BOS, AUDIO_START, audio) means.
"""

from __future__ import annotations

import numpy as np


def drop_caption(caption_ids: list[int], p: float, rng: np.random.Generator) -> list[int]:
    """[] with probability p (one draw from `rng`), else caption_ids unchanged. p = 0 draws nothing."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"caption dropout p={p} must be in [0, 1); set data.caption_dropout")
    if p == 0.0:
        return caption_ids
    return [] if rng.random() < p else caption_ids

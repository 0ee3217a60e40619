"""Caption dropout (MusicGen's condition dropout): some training captions become the empty caption; and caption
word dropout: some words of a training caption are left out.

Classifier-free guidance at sampling time mixes the logits of a caption with those of the empty caption
(`sampling.apply_cfg`); the model only knows what to do with an empty caption if training showed it one.
An empty caption lays out as BOS, AUDIO_START, audio (token_layout.encode_example with no caption ids),
exactly the unconditioned prompt `sampling.generate_codes` builds.

Word dropout is augmentation against memorisation: with few training clips, one clip-identifying word of a caption
can stand for the whole clip; leaving out random words makes the model read several attribute words instead.
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


def drop_words(text: str, p: float, rng: np.random.Generator) -> str:
    """`text` with each whitespace-separated word left out with probability p (one draw per word from `rng`).
    p = 0 draws nothing and returns text unchanged; if every word is drawn out, text is returned unchanged (an empty
    caption is caption dropout's job)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"caption word dropout p={p} must be in [0, 1); set data.caption_word_dropout")
    if p == 0.0:
        return text
    words = text.split()
    kept = [w for w, u in zip(words, rng.random(len(words)), strict=True) if u >= p]
    return " ".join(kept) if kept else text

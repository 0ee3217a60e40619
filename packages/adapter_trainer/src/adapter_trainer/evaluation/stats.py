"""Learning-check statistics on per-clip values (numpy): the add-one unigram baseline, caption derangements,
percentile-bootstrap intervals and the caption-gain verdict."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

MIN_GAIN_CLIPS = 30  # fewer eval clips: the caption-gain bootstrap interval is not trusted, the verdict is INSUFFICIENT


def caption_gain_verdict(n_clips: int, lo: float) -> str:
    """PASS when the interval's lower end is above 0 over >= MIN_GAIN_CLIPS clips, else FAIL; INSUFFICIENT below."""
    if n_clips < MIN_GAIN_CLIPS:
        return "INSUFFICIENT"
    return "PASS" if lo > 0.0 else "FAIL"


def unigram_log_probs(codes: Iterable[np.ndarray], n_codebooks: int, codebook_size: int) -> np.ndarray:
    """Codes [T, K] of the train split -> [K, C] float64 per-codebook add-one unigram log-probabilities."""
    counts = np.ones((n_codebooks, codebook_size), dtype=np.float64)  # add-one: no code gets probability 0
    for c in codes:  # c: [T, K]
        for k in range(n_codebooks):
            counts[k] += np.bincount(c[:, k].astype(np.int64), minlength=codebook_size)
    return np.log(counts / counts.sum(axis=1, keepdims=True))  # [K, C]


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation p of range(n) with p[i] != i for all i (rejection sampling; ~e tries)."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 items, got {n}; the caption-gain check needs >= 2 eval clips")
    while True:
        p = rng.permutation(n)
        if not np.any(p == np.arange(n)):
            return p


def bootstrap_mean_ci(
    values: np.ndarray, n_resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of `values` and a percentile-bootstrap interval over them (resampling the items with replacement)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("bootstrap over an empty set of values")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_resamples, v.size))  # [R, N]
    means = v[idx].mean(axis=1)  # [R]
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [a, 1.0 - a])
    return float(v.mean()), float(lo), float(hi)


def bootstrap_ratio_ci(
    num: np.ndarray, den: np.ndarray, n_resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float, float]:
    """sum(num) / sum(den) and a percentile-bootstrap interval over the items; nan when den sums to 0."""
    n, d = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if n.size == 0:
        raise ValueError("bootstrap over an empty set of values")
    if d.sum() <= 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n.size, size=(n_resamples, n.size))  # [R, N]
    dens = d[idx].sum(axis=1)  # [R]
    ratios = n[idx].sum(axis=1) / np.where(dens > 0, dens, np.nan)  # [R]; a resample without codes is left out
    a = (1.0 - level) / 2.0
    lo, hi = np.nanquantile(ratios, [a, 1.0 - a])
    return float(n.sum() / d.sum()), float(lo), float(hi)


def safe_div(a: float, b: float) -> float:
    """a / b; nan when b is 0 (nothing was scored)."""
    return a / b if b else float("nan")

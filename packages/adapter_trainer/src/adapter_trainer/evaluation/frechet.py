"""Fréchet distance between Gaussians fitted to two sets of embeddings (the "FAD" of audio generation papers).

    FD = ||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2))

Tr (S1 S2)^(1/2) comes from symmetric eigen-decompositions, not `scipy.linalg.sqrtm`: it stays real when the
covariances are singular (fewer clips than dimensions, always the case here) and keeps scipy out of the dependencies.
FD is biased upwards at small n: compare values only at equal n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gaussian:
    """Mean and covariance of a set of embeddings."""

    mu: np.ndarray  # [D] float64
    sigma: np.ndarray  # [D, D] float64, symmetric PSD
    n: int  # embeddings it was fitted to

    @classmethod
    def fit(cls, emb: np.ndarray) -> Gaussian:
        """emb [N, D] (N >= 2) -> its mean and unbiased covariance."""
        x = np.asarray(emb, dtype=np.float64)  # [N, D]
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"a Gaussian fit needs embeddings [N >= 2, D], got shape {x.shape}")
        return cls(mu=x.mean(axis=0), sigma=np.cov(x, rowvar=False, ddof=1).reshape(x.shape[1], x.shape[1]), n=len(x))


def trace_sqrt_product(s1: np.ndarray, s2: np.ndarray) -> float:
    """Tr (S1 S2)^(1/2) for symmetric PSD S1, S2 [D, D]: with B = V_r diag(sqrt(w_r)) over S1's numerical range,
    B^T S2 B [r, r] has the nonzero eigenvalues of S1^(1/2) S2 S1^(1/2) (the null space, adding 0, is left out)."""
    w, v = np.linalg.eigh((s1 + s1.T) / 2.0)  # w [D], v [D, D]
    keep = w > w.max(initial=0.0) * len(w) * np.finfo(np.float64).eps  # [D] numerical range of S1
    b = v[:, keep] * np.sqrt(w[keep])  # [D, r]
    m = b.T @ ((s2 + s2.T) / 2.0) @ b  # [r, r] symmetric PSD
    ev = np.linalg.eigvalsh((m + m.T) / 2.0)  # [r]
    return float(np.sqrt(np.clip(ev, 0.0, None)).sum())


def frechet_distance(g1: Gaussian, g2: Gaussian) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)); >= 0 up to round-off (clipped at 0)."""
    if g1.mu.shape != g2.mu.shape:
        raise ValueError(f"embedding sizes differ: {g1.mu.shape[0]} vs {g2.mu.shape[0]}")
    diff = g1.mu - g2.mu  # [D]
    fd = float(diff @ diff + np.trace(g1.sigma) + np.trace(g2.sigma) - 2.0 * trace_sqrt_product(g1.sigma, g2.sigma))
    return max(fd, 0.0)


def frechet_distance_of(emb1: np.ndarray, emb2: np.ndarray) -> float:
    """FD between Gaussians fitted to emb1 [N1, D] and emb2 [N2, D]."""
    return frechet_distance(Gaussian.fit(emb1), Gaussian.fit(emb2))

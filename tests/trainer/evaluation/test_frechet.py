"""The Fréchet distance against closed forms: diagonal Gaussians, rotation invariance, scipy's sqrtm on a
full-rank case, and the singular covariances of few clips in many dimensions."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from adapter_trainer.evaluation.frechet import Gaussian, frechet_distance, frechet_distance_of, trace_sqrt_product

TOL = 1e-9


def test_diagonal_gaussians_match_the_closed_form() -> None:
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=5), rng.normal(size=5)
    v1, v2 = rng.uniform(0.1, 3.0, 5), rng.uniform(0.1, 3.0, 5)
    want = float(((mu1 - mu2) ** 2).sum() + ((np.sqrt(v1) - np.sqrt(v2)) ** 2).sum())
    got = frechet_distance(Gaussian(mu1, np.diag(v1), 10), Gaussian(mu2, np.diag(v2), 10))
    assert got == pytest.approx(want, abs=TOL)


def test_a_common_rotation_changes_nothing_and_sqrtm_agrees() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    s1, s2 = a @ a.T + 0.1 * np.eye(6), b @ b.T + 0.1 * np.eye(6)  # full rank
    mu1, mu2 = rng.normal(size=6), rng.normal(size=6)
    scipy_trace = float(np.real(np.trace(scipy.linalg.sqrtm(s1 @ s2))))
    assert trace_sqrt_product(s1, s2) == pytest.approx(scipy_trace, rel=1e-8)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))  # orthogonal
    fd = frechet_distance(Gaussian(mu1, s1, 9), Gaussian(mu2, s2, 9))
    rotated = frechet_distance(Gaussian(q @ mu1, q @ s1 @ q.T, 9), Gaussian(q @ mu2, q @ s2 @ q.T, 9))
    assert rotated == pytest.approx(fd, rel=1e-8)
    want = float((mu1 - mu2) @ (mu1 - mu2) + np.trace(s1) + np.trace(s2) - 2 * scipy_trace)
    assert fd == pytest.approx(want, rel=1e-8)


def test_few_clips_in_many_dimensions_identical_sets_give_zero_and_a_shift_adds_its_square() -> None:
    rng = np.random.default_rng(2)
    emb = rng.normal(size=(16, 64))  # n < D: singular covariance (rank 15)
    assert frechet_distance_of(emb, emb) == pytest.approx(0.0, abs=1e-8)
    shift = np.zeros(64)
    shift[3] = 2.0
    # same covariance, means 2 apart: FD = ||shift||^2 = 4
    assert frechet_distance_of(emb, emb + shift) == pytest.approx(4.0, abs=1e-7)
    assert frechet_distance_of(emb, rng.normal(size=(16, 64))) > 1.0


def test_fit_uses_the_unbiased_covariance_and_refuses_a_single_embedding() -> None:
    emb = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]])
    g = Gaussian.fit(emb)
    np.testing.assert_allclose(g.mu, emb.mean(0))
    np.testing.assert_allclose(g.sigma, np.cov(emb.T, ddof=1))
    with pytest.raises(ValueError, match="N >= 2"):
        Gaussian.fit(emb[:1])

"""The demand model's estimator (demand/fitting.py runs it on a history; the derivation and why it is consistent:
docs/fitting.md, "The estimator").

Under the model (docs/model.md, "Several factors and overdispersion") the normalised moments M^l_ij =
log(1 + C^l_ij / (m_i m_j)) of the sample means m and lag-l covariances C^l equal rho^l beta_i . beta_j for every pair
at lags l = 1..LAGS and for i != j at lag 0, and the lag-0 diagonal is log(1 + phi_i) + |beta_i|^2. `estimate` takes
lam_i = m_i and fits (B [n, k], rho) by weighted least squares over every pair and lag but the lag-0 diagonal (weights
w_i = m_i / sd_i, so each pair is on the scale of a correlation), alternating the top-k eigenvectors of
A(rho) = sum_l rho^l N^l (`_low_rank`, the lag-0 diagonal imputed by the model: an EM step) with rho given B, at most
ALTERNATIONS times (`Estimate.converged`); then phi_i from each item's variance, clipped at 0. B is identified up to a
rotation of the factors. At k = 1 the loadings are kept non-negative, as the paper's model has them. What the model
cannot represent is said in `Estimate.notes` (an underdispersed item gets beta_i = 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar

from envs.instance import FIELD_RANGES, OVERDISPERSION_MAX, loading_norms

LAGS = 4
"""Lags l = 0..LAGS of the moment equations: lag 0 fixes the loadings' cross products, lags >= 1 their norms and rho."""
RHO_MAX = 0.99
"""The fitted rho lies in [0, RHO_MAX]: the instance needs rho < 1 (a unit root has no stationary factor)."""
ALTERNATIONS = 50
"""Most alternations of the estimator's two steps (beta's direction for rho, rho for that direction)."""


BETA_MAX = FIELD_RANGES["beta"][2]


@dataclass(frozen=True)
class Estimate:
    """lam [n], the signed loadings [n, k], rho, the overdispersion phi [n] (>= 0), `notes` (item -> what the model could not
    represent, what was done and why), `poisson_items` (phi clipped at 0) and `converged` (if not, the loadings are still the
    best for the rho returned). The loadings are identified up to a rotation of the factors (`beta`, their norms, is not)."""

    lam: np.ndarray
    loadings: np.ndarray
    rho: float
    overdispersion: np.ndarray
    notes: dict[int, str] = field(default_factory=dict)
    converged: bool = True
    poisson_items: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def beta(self) -> np.ndarray:
        """|beta_i| [n], the norms of the items' loadings (the loading itself at one non-negative factor)."""
        return loading_norms(self.loadings)

    @property
    def factors(self) -> int:
        return int(self.loadings.shape[1])


def lagged_covariances(demand: np.ndarray, lags: int = LAGS, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(m [n], C [lags + 1, n, n]): sample means and C^l_ij = (1/T) sum_t (D_i,t - m_i)(D_j,t+l - m_j)."""
    periods = demand.shape[0]
    mean = demand.mean(axis=0)
    centred = (demand - mean).astype(dtype)
    cov = np.stack([centred[: periods - k].T @ centred[k:] for k in range(lags + 1)]) / dtype(periods)
    return mean, cov


def normalised_moments(mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """M [L + 1, n, n] = log(1 + (C^l_ij - 1{i = j, l = 0} m_i) / (m_i m_j)), lags >= 1 symmetrised: rho^l beta_i . beta_j
    under the model, but at lag 0 on the diagonal, which is log(1 + phi_i) + |beta_i|^2 (module docstring). A new array."""
    normalised = cov / np.outer(mean, mean).astype(cov.dtype)
    normalised[0].flat[:: mean.size + 1] -= (1.0 / mean).astype(cov.dtype)  # the Poisson part of Var D_i
    np.maximum(normalised, -0.9, out=normalised)  # log(1 + x) needs x > -1: a covariance that negative is noise
    np.log1p(normalised, out=normalised)
    normalised[1:] = 0.5 * (normalised[1:] + normalised[1:].transpose(0, 2, 1))
    return normalised


def estimate(mean: np.ndarray, cov: np.ndarray, factors: int = 1) -> Estimate:
    """The least-squares moment estimator of the module docstring with `factors` = k, from m [n] and C [L + 1, n, n]."""
    n = mean.size
    var = np.diagonal(cov[0]).copy()
    notes = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in np.flatnonzero(~(var > mean)):
            notes[int(i)] = f"beta = 0: variance {var[i]:.3g} <= mean {mean[i]:.3g} (underdispersed; a factor can only add variance)"
    active = np.flatnonzero(var > mean)
    loadings, phi, rho, converged = np.zeros((n, factors)), np.zeros(n), 0.0, True
    poisson_items = np.zeros(0, dtype=np.int64)
    if active.size:
        m = mean[active]
        normalised = normalised_moments(m, cov[:, active][:, :, active] if active.size < n else cov)
        excess = np.diagonal(normalised[0]).copy()  # log(1 + phi_i) + |beta_i|^2
        weight = m / np.sqrt(var[active])
        normalised *= np.outer(weight, weight).astype(normalised.dtype)
        scaled, rho, converged = _low_rank(normalised, factors)
        fitted = np.zeros((active.size, factors))
        fitted[:, : scaled.shape[1]] = scaled / weight[:, None]  # k above the active items: zero columns
        if factors == 1:  # one factor: the paper's non-negative loadings (signed loadings come with k >= 2)
            for j, i in enumerate(active):
                if fitted[j, 0] <= 0:
                    others = active[active != i]
                    correlation = cov[0][i, others] / np.sqrt(var[i] * var[others]) if others.size else np.zeros(1)
                    notes[int(i)] = (
                        f"beta = 0: its loading came out {fitted[j, 0]:.3g} <= 0 (its average correlation with the other items is "
                        f"{correlation.mean():+.2f}): a move against them, which one factor with non-negative loadings cannot "
                        "represent (a model of k >= 2 factors has signed loadings)"
                    )
            fitted = np.maximum(fitted, 0.0)
        norms = loading_norms(fitted)
        for j in np.flatnonzero(norms > BETA_MAX):
            notes[int(active[j])] = f"|beta| = {BETA_MAX:g}: its loadings' norm {norms[j]:.3g} is above the instance's upper bound"
        fitted *= np.minimum(1.0, BETA_MAX / np.maximum(norms, 1e-300))[:, None]
        loadings[active] = fitted
        raw_phi = np.expm1(excess - (fitted**2).sum(axis=1))  # Var D_i = lam + lam^2 ((1 + phi) exp(|beta|^2) - 1)
        poisson_items = active[raw_phi <= 0]
        phi[active] = np.clip(raw_phi, 0.0, OVERDISPERSION_MAX)
        if not (loadings != 0).any():
            rho = 0.0
    return Estimate(mean.copy(), loadings, float(rho), phi, notes, converged, poisson_items)


def _low_rank(normalised: np.ndarray, factors: int) -> tuple[np.ndarray, float, bool]:
    """(B [n, k], rho, converged) minimising sum_l sum_ij (N^l_ij - rho^l (B B^T)_ij)^2 over every entry but the lag-0 diagonal,
    N [L + 1, n, n] symmetric per lag; overwrites `normalised`'s lag-0 diagonal with the imputed (B B^T)_ii. For a given rho
    the best B is V diag(lambda / c)^(1/2), (lambda, V) the top k eigenpairs of A(rho) = sum_l rho^l N^l (a negative lambda
    giving a zero column) and c = sum_l rho^2l, so rho maximises |V^T A(rho) V|^2 / c (`_profile_loss`); at most ALTERNATIONS
    alternations, the eigenpairs returned always those at the rho returned. At k = 1 without the imputation: the paper's fit."""
    lags = np.arange(normalised.shape[0])
    size = normalised.shape[1]
    lag0 = normalised[0]  # a view: its diagonal holds the imputed values from here on

    def top(rho: float, block: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = lag0.copy()
        for k in lags[1:]:
            a += normalised.dtype.type(rho**k) * normalised[k]
        return _top_eigen(a, factors, block)

    def loadings_at(rho: float, values: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        return vectors * np.sqrt(np.maximum(values, 0.0) / float(np.sum(rho ** (2 * lags))))

    rho = 0.0
    values, vectors, block = top(rho, None)
    converged = False
    settled = 1e-9 if normalised.dtype == np.float64 else 1e-5  # what the precision allows
    for _ in range(ALTERNATIONS):
        loadings = loadings_at(rho, values, vectors)
        imputed = (loadings**2).sum(axis=1)
        moved = float(np.max(np.abs(imputed - np.diagonal(lag0))))
        lag0.flat[:: size + 1] = imputed
        quad = np.stack([vectors.T @ (nk @ vectors) for nk in normalised])  # [L + 1, k, k] V^T N^l V
        new = rho
        if lags.size > 1:
            new = float(
                minimize_scalar(_profile_loss, args=(lags, quad), bounds=(0.0, RHO_MAX), method="bounded", options={"xatol": 1e-7}).x
            )
        converged = abs(new - rho) < 1e-6 and moved <= settled * max(float(imputed.max(initial=0.0)), 1e-12)
        if converged:
            break
        rho = new
        values, vectors, block = top(rho, block)
    loadings = loadings_at(rho, values, vectors)
    return loadings * np.where(loadings.sum(axis=0) >= 0, 1.0, -1.0), rho, converged


def _profile_loss(r: float, lags: np.ndarray, quad: np.ndarray) -> float:
    """-|V^T A(r) V|^2 / c(r) for a fixed orthonormal V, from quad_l = V^T N^l V: the sum of the squared non-negative
    eigenvalues of V^T A(r) V (at k = 1, (v^T A(r) v)^2 where positive)."""
    projected = np.tensordot(r**lags, quad, axes=1)
    eigenvalues = np.linalg.eigvalsh(projected) if projected.shape[0] > 1 else projected.ravel()
    return -float(np.sum(np.maximum(eigenvalues, 0.0) ** 2)) / float(np.sum(r ** (2 * lags)))


OVERSAMPLE = 8
"""Extra vectors of the subspace iteration above n = 64: it converges at the ratio of the (k + OVERSAMPLE + 1)-th
largest eigenvalue in magnitude to the k-th largest."""


def _top_eigen(a: np.ndarray, factors: int, block: np.ndarray | None, iterations: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the `factors` largest eigenvalues of the symmetric `a` in decreasing order, their unit eigenvectors [n, k], the
    subspace-iteration block to start the next call from): LAPACK for n <= 64, else subspace iteration with
    Rayleigh-Ritz on k + OVERSAMPLE vectors, warm-started at `block` (the profile over rho moves it little); the Ritz
    values are ordered by value, so an eigenvalue of large magnitude but negative is never taken."""
    size = a.shape[0]
    if size <= 64:
        values, vectors = np.linalg.eigh(a)
        return values[::-1][:factors], vectors[:, ::-1][:, :factors], None
    width = min(factors + OVERSAMPLE, size)
    if block is None:
        block = np.random.default_rng(0x46414354).standard_normal((size, width)).astype(a.dtype)
    tol = 1e-12 if a.dtype == np.float64 else 1e-6  # what the precision allows
    previous = None
    for _ in range(iterations):
        basis, _ = np.linalg.qr(a @ block)
        values, rotation = np.linalg.eigh(basis.T @ a @ basis)
        order = np.argsort(values)[::-1]
        values, block = values[order], basis @ rotation[:, order]
        scale = max(float(np.abs(values[:factors]).max()), 1e-300)
        if previous is not None and float(np.max(np.abs(values[:factors] - previous))) <= tol * scale:
            break
        previous = values[:factors]
    return values[:factors].astype(np.float64), block[:, :factors], block


def fit_moments(demand: np.ndarray, dtype=np.float64, factors: int = 1) -> Estimate:
    return estimate(*lagged_covariances(demand, dtype=dtype), factors)


def model_loadings(fitted: Estimate) -> np.ndarray:
    """The loadings as the model's functions take them: [n] for one factor (the paper's, non-negative), else [n, k]."""
    return fitted.loadings[:, 0] if fitted.factors == 1 else fitted.loadings


def varimax(loadings: np.ndarray, iterations: int = 100) -> np.ndarray:
    """The loadings [n, k] rotated to the varimax criterion (Kaiser 1958: most variance of the squared loadings per
    factor, so each item loads mostly on one factor), each column oriented to a non-negative sum. The model is the same
    under any rotation (F ~ N(0, I) is rotation-invariant); the rotation only makes the factors readable. Each row keeps its
    norm, held to at most BETA_MAX (a rotation's round-off would put a norm at the cap a few ulps above it)."""
    factors = loadings.shape[1]
    rotation = np.eye(factors)
    if factors > 1 and np.any(loadings):
        for _ in range(iterations):
            rotated = loadings @ rotation
            u, _, vt = np.linalg.svd(loadings.T @ (rotated**3 - rotated @ np.diag((rotated**2).mean(axis=0))))
            new = u @ vt
            done = np.abs(new - rotation).max() < 1e-10
            rotation = new
            if done:
                break
    rotated = loadings @ rotation
    norms = np.sqrt((rotated**2).sum(axis=1))
    rotated *= np.minimum(1.0, BETA_MAX / np.maximum(norms, 1e-300))[:, None]
    return rotated * np.where(rotated.sum(axis=0) >= 0, 1.0, -1.0)

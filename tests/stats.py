"""Statistics shared by the distribution tests: a chi-square fit and a TV bound, in numpy only.

Every distribution check in the suite uses the same pair of criteria: Pearson chi-square p-value
> ALPHA (cells with expected count < 5 pooled) and TV(p_hat, p) <= 1.5 * sqrt(K / N) (`assert_fits`).
Every negative control must be detected by a p-value below DETECTED (`assert_detected`).
"""

import math

import numpy as np

ALPHA = 1e-4  # chi-square p-value threshold
# A negative control must miss by far more than a lossless sampler ever does by chance, so that it
# fails for its defect: its p-value must fall below DETECTED.
DETECTED = 1e-6


def chi2_sf(stat: float, dof: int) -> float:
    """Survival function of the chi-square distribution, closed form for integer dof."""
    x = stat / 2.0
    if dof % 2 == 0:
        term = total = math.exp(-x)
        for i in range(1, dof // 2):
            term *= x / i
            total += term
        return total
    total = math.erfc(math.sqrt(x))
    term = math.exp(-x) * 2.0 * math.sqrt(x / math.pi)  # x^(1/2) e^-x / Gamma(3/2)
    for i in range(1, (dof + 1) // 2):
        total += term
        term *= x / (i + 0.5)
    return total


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson goodness of fit; cells with expected count < 5 are pooled into one cell."""
    n = counts.sum()
    if counts[probs <= 0].sum() > 0:
        return 0.0  # a zero-probability token was emitted
    obs, exp = counts[probs > 0].astype(float), n * probs[probs > 0]
    small = exp < 5
    cells_o, cells_e = list(obs[~small]), list(exp[~small])
    if small.any():
        pool_o, pool_e = obs[small].sum(), exp[small].sum()
        if pool_e < 5 and cells_e:  # still too small: fold into the smallest regular cell
            j = int(np.argmin(cells_e))
            cells_o[j] += pool_o
            cells_e[j] += pool_e
        else:
            cells_o.append(pool_o)
            cells_e.append(pool_e)
    o, e = np.array(cells_o), np.array(cells_e)
    if len(o) < 2:
        return 1.0
    return chi2_sf(float(((o - e) ** 2 / e).sum()), len(o) - 1)


def fit(tokens, probs: np.ndarray) -> tuple[float, float, float]:
    """(chi-square p-value, TV(p_hat, p), TV bound 1.5*sqrt(K/N)) for token samples vs probs."""
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    counts = np.bincount(np.asarray(tokens), minlength=len(probs))
    n = counts.sum()
    tv = 0.5 * np.abs(counts / n - probs).sum()
    return chi_square_pvalue(counts, probs), tv, 1.5 * math.sqrt(len(probs) / n)


def assert_fits(samples, probs) -> None:
    """Samples fit `probs`: chi-square p-value above ALPHA and TV within its bound."""
    pvalue, tv, bound = fit(samples, probs)
    assert pvalue > ALPHA and tv <= bound, f"p-value {pvalue:.3g}, TV {tv:.4f} (bound {bound:.4f})"


def assert_detected(samples, probs) -> None:
    """A negative control: the samples are far from `probs` (p-value below DETECTED)."""
    pvalue, tv, bound = fit(samples, probs)
    assert pvalue < DETECTED, f"control not detected: p-value {pvalue:.3g}, TV {tv:.4f} (bound {bound:.4f})"

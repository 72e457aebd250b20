"""Sequential temperature scaling (STS) of the confidence head (docs/method.md §3.3).

Input: held-out speculative rounds, each with the confidence logits z_1..z_L of the drafts it
verified and the number n of drafts accepted. For position k the prediction is the prefix
survival a_k = prod_{i<=k} sigmoid(z_i / t_i) and the observation is "drafts 1..k all accepted"
(n >= k), over the rounds that verified k. For k = 1, 2, ... in order, t_k is the grid value
(logspace(-1, 1, 81)) minimising the 20-bin ECE of a_k, with the earlier t fixed. Temperature
scaling keeps the ranking of each z; it only fixes over- or under-confidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = np.logspace(-1.0, 1.0, 81)
NUM_BINS = 20
# Fewer observations than this at a position: keep t = 1 (a grid search on a handful of rounds
# just memorises them, e.g. t = 0.1 where no draft happened to be accepted).
MIN_SAMPLES = 30


@dataclass
class Rounds:
    """Recorded rounds: z [N, K] (NaN where not verified), accepted [N], group [N] (prompt index)."""

    z: np.ndarray
    accepted: np.ndarray
    group: np.ndarray

    @classmethod
    def from_lists(cls, rounds: list[tuple[list[float], int, int]], max_drafts: int) -> Rounds:
        """From (confidence logits, accepted count, prompt index) per round."""
        z = np.full((len(rounds), max_drafts), np.nan)
        for r, (logits, _, _) in enumerate(rounds):
            z[r, : len(logits)] = logits[:max_drafts]
        accepted = np.array([n for _, n, _ in rounds], dtype=np.int64)
        group = np.array([g for _, _, g in rounds], dtype=np.int64)
        return cls(z, accepted, group)

    def subset(self, keep: np.ndarray) -> Rounds:
        """The rounds where ``keep`` is True."""
        return Rounds(self.z[keep], self.accepted[keep], self.group[keep])


def ece(pred: np.ndarray, obs: np.ndarray, num_bins: int = NUM_BINS) -> float:
    """Expected calibration error with equal-width bins on [0, 1] (1.0 falls in the last bin)."""
    if pred.size == 0:
        return 0.0
    bins = np.minimum((pred * num_bins).astype(np.int64), num_bins - 1)
    total = 0.0
    for b in np.unique(bins):
        sel = bins == b
        total += sel.sum() * abs(pred[sel].mean() - obs[sel].mean())
    return float(total / pred.size)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic


def survival(rounds: Rounds, temps: list[float] | np.ndarray) -> np.ndarray:
    """a_k = prod_{i<=k} sigmoid(z_i / t_i): [N, K], NaN where k was not verified."""
    t = np.asarray(temps, dtype=np.float64)[None, : rounds.z.shape[1]]
    return np.cumprod(_sigmoid(rounds.z / t), axis=1)


def ece_by_position(rounds: Rounds, temps: list[float] | np.ndarray) -> list[float]:
    """ECE of a_k against the prefix-accepted indicator, per position k (NaN with no samples)."""
    a = survival(rounds, temps)
    out = []
    for k in range(rounds.z.shape[1]):
        seen = ~np.isnan(a[:, k])
        obs = (rounds.accepted[seen] >= k + 1).astype(np.float64)
        out.append(ece(a[seen, k], obs) if seen.any() else float("nan"))
    return out


def fit_sts(rounds: Rounds, grid: np.ndarray = GRID) -> list[float]:
    """Per-position temperatures, fitted in order with the earlier ones fixed (1.0 below MIN_SAMPLES)."""
    num = rounds.z.shape[1]
    temps = [1.0] * num
    prefix = np.ones(rounds.z.shape[0])  # prod_{i<k} sigmoid(z_i / t_i)
    order = np.argsort(np.abs(np.log(grid)), kind="stable")  # on equal ECE prefer t closest to 1
    for k in range(num):
        seen = ~np.isnan(rounds.z[:, k])
        if seen.sum() >= MIN_SAMPLES:
            obs = (rounds.accepted[seen] >= k + 1).astype(np.float64)
            errors = [ece(prefix[seen] * _sigmoid(rounds.z[seen, k] / grid[i]), obs) for i in order]
            temps[k] = float(grid[order[int(np.argmin(errors))]])
        prefix = prefix * np.where(seen, _sigmoid(np.nan_to_num(rounds.z[:, k]) / temps[k]), 1.0)
    return temps


def calibrate(rounds: Rounds) -> dict:
    """Fit on all rounds; report ECE per position before / after, in-sample and cross-fitted.

    The cross-fitted figure fits on the rounds of even-numbered prompts and scores the odd ones,
    and the reverse, then averages: an honest estimate when there are at least two prompts.
    """
    num = rounds.z.shape[1]
    temps = fit_sts(rounds)
    report = {"temperatures": temps, "num_rounds": int(rounds.z.shape[0]),
              "samples_by_position": [int((~np.isnan(rounds.z[:, k])).sum()) for k in range(num)],
              "ece_before": ece_by_position(rounds, [1.0] * num), "ece_after": ece_by_position(rounds, temps)}
    folds = [rounds.group % 2 == 0, rounds.group % 2 == 1]
    if all(f.any() for f in folds):
        scores = [ece_by_position(rounds.subset(b), fit_sts(rounds.subset(a))) for a, b in (folds, folds[::-1])]
        report["ece_after_crossfit"] = [float(np.nanmean(pair)) if not np.all(np.isnan(pair)) else float("nan")
                                        for pair in zip(*scores)]
    return report

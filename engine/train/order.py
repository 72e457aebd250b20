"""The data order of a training run: which samples each step trains on.

Determinism is what makes resume exact: every order here is a pure function of (seed, step), so a
run resumed from step s sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import numpy as np

from engine.train.config import TrainConfig


def epoch_order(num: int, chunk: int, seed: int, epoch: int) -> np.ndarray:
    """Sample order of one epoch: chunks shuffled, then samples shuffled within each chunk.

    Chunk-local order keeps consecutive steps inside one feature-cache file.
    """
    rng = np.random.default_rng([seed, 5, epoch])
    parts = []
    for c in rng.permutation((num + chunk - 1) // chunk):
        size = min(chunk, num - c * chunk)
        parts.append(c * chunk + rng.permutation(size))
    return np.concatenate(parts)


class DataOrder:
    """Sample indices of any step, as a pure function of (seed, step)."""

    def __init__(self, num: int, chunk: int, batch: int, seed: int):
        self.num, self.chunk, self.batch, self.seed = num, chunk, batch, seed
        self._orders: dict[int, np.ndarray] = {}

    def indices(self, step: int) -> list[int]:
        """The ``batch`` samples of ``step``."""
        out = []
        for pos in range(step * self.batch, (step + 1) * self.batch):
            epoch, i = divmod(pos, self.num)
            if epoch not in self._orders:
                self._orders = {epoch: epoch_order(self.num, self.chunk, self.seed, epoch)}
            out.append(int(self._orders[epoch][i]))
        return out


class GrowingOrder:
    """Sample indices of any step while the feature cache is still being filled (``grow_every`` > 0).

    Step s may use the first ``window(s) = start + s // grow_every`` chunks (capped at all of them):
    it picks one of them uniformly, then ``batch`` distinct samples of that chunk. Like `DataOrder`
    it is a pure function of (seed, step), so a resumed run replays the same batches; a chunk that
    is not on disk yet when a step needs it is computed by the trainer itself (`FeatureSource`).
    """

    def __init__(self, num: int, chunk: int, batch: int, seed: int, start: int, grow_every: int):
        self.num, self.chunk, self.batch, self.seed = num, chunk, batch, seed
        self.start, self.grow_every = max(1, start), grow_every
        self.num_chunks = (num + chunk - 1) // chunk

    def window(self, step: int) -> int:
        """Chunks step ``step`` may draw from."""
        return min(self.num_chunks, self.start + step // self.grow_every)

    def indices(self, step: int) -> list[int]:
        """The ``batch`` samples of ``step`` (fewer distinct ones only if the chunk is smaller)."""
        rng = np.random.default_rng([self.seed, 5, step])
        c = int(rng.integers(self.window(step)))
        size = min(self.chunk, self.num - c * self.chunk)
        picks = rng.choice(size, self.batch, replace=size < self.batch)
        return [c * self.chunk + int(i) for i in picks]


def make_order(cfg: TrainConfig, num: int, chunk: int) -> DataOrder | GrowingOrder:
    """The data order of a run: epochs over every sample, or a window that grows with the cache."""
    if cfg.grow_every > 0:
        return GrowingOrder(num, chunk, cfg.batch, cfg.seed, cfg.train_chunks or 1, cfg.grow_every)
    return DataOrder(num, chunk, cfg.batch, cfg.seed)

"""Target features per training sample: tapped layer outputs and the final hidden state.

Per sample of length S (spec §1.9 "target cache"): ``taps`` [S, m*d] (raw outputs of the tapped
decoder layers, concatenated in ``target_layer_ids`` order) and ``hidden`` [S, d] (post final
norm). The target's lm_head maps ``hidden`` to its logits, so the TV / confidence labels never
need a [S, V] logit table on disk.

Two sources with one interface, `FeatureSource.batch(indices)`:
  * on the fly (``cache_dir=None``): one batched target forward per training step;
  * a chunked disk cache: ``chunk_NNNNN.safetensors`` files of ``chunk`` samples each, written
    atomically; `prepare` computes only the chunks that are missing, so an interrupted run
    resumes. ``manifest.json`` fingerprints the data and taps, so a stale cache is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from engine.models.target import Target
from engine.train.data import Sample

ProgressFn = Callable[[str], None]
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
FORWARD_BATCH = 4  # samples per target forward while filling the cache
_LRU_CHUNKS = 2


class FeatureCacheError(ValueError):
    """The feature cache on disk does not belong to this data / target."""


def fingerprint(samples: list[Sample], taps: tuple[int, ...], extra: str = "") -> str:
    """Hash of every sample's ids and mask, the taps and ``extra`` (e.g. the target path)."""
    h = hashlib.sha256(f"{taps}|{extra}|{len(samples)}".encode())
    for s in samples:
        h.update(s.ids.tobytes())
        h.update(s.loss_mask.tobytes())
    return h.hexdigest()[:32]


def compute_features(target: Target, samples: list[Sample]) -> list[tuple[mx.array, mx.array]]:
    """(taps [S, m*d], hidden [S, d]) float32 per sample; right padding keeps causal rows exact."""
    out = []
    for start in range(0, len(samples), FORWARD_BATCH):
        group = samples[start : start + FORWARD_BATCH]
        width = max(len(s) for s in group)
        ids = np.zeros((len(group), width), dtype=np.int32)
        for row, s in enumerate(group):
            ids[row, : len(s)] = s.ids
        hidden, taps = target.forward_hidden(mx.array(ids))  # [b, W, d], [b, W, m*d]
        mx.eval(hidden, taps)
        out.extend((taps[row, : len(s)], hidden[row, : len(s)]) for row, s in enumerate(group))
    return out


class FeatureSource:
    """Features for batches of samples, padded to the batch's longest sample."""

    def __init__(self, target: Target, samples: list[Sample], cache_dir: Path | None = None, *,
                 chunk: int = 16, dtype: str = "float32", fingerprint_extra: str = "",
                 progress: ProgressFn | None = None):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown feature dtype {dtype!r}; choose one of {tuple(_DTYPES)}")
        self.target, self.samples, self.cache_dir = target, samples, cache_dir
        self.chunk = chunk  # also the unit of the data order, cached or not (same batches either way)
        self.dtype, self.progress = dtype, progress
        self.extra = fingerprint_extra
        self._lru: OrderedDict[int, dict[str, mx.array]] = OrderedDict()

    @property
    def num_chunks(self) -> int:
        """Chunks the samples are grouped in (also the unit of the data order)."""
        return (len(self.samples) + self.chunk - 1) // self.chunk

    def prepare(self) -> int:
        """Write every missing cache chunk; returns how many were computed (0 on the fly)."""
        if self.cache_dir is None:
            return 0
        self._check_manifest()
        missing = [c for c in range(self.num_chunks) if not self._chunk_path(c).exists()]
        for done, c in enumerate(missing, 1):
            if self._chunk_path(c).exists():  # written meanwhile by another process sharing the cache
                continue
            self._write_chunk(c)
            if self.progress:
                self.progress(f"target features: chunk {c + 1}/{self.num_chunks} ({done}/{len(missing)} new)")
        return len(missing)

    def batch(self, indices: list[int]) -> tuple[mx.array, mx.array]:
        """taps [b, W, m*d] and hidden [b, W, d] float32 for ``indices``, zero-padded to width W."""
        if self.cache_dir is None:
            pairs = compute_features(self.target, [self.samples[i] for i in indices])
        else:
            pairs = [self._cached(i) for i in indices]
        width = max(t.shape[0] for t, _ in pairs)
        taps = mx.stack([_pad_rows(t, width) for t, _ in pairs])
        hidden = mx.stack([_pad_rows(h, width) for _, h in pairs])
        return taps.astype(mx.float32), hidden.astype(mx.float32)

    # ------------------------------------------------------------ cache

    def _chunk_path(self, c: int) -> Path:
        return self.cache_dir / f"chunk_{c:05d}.safetensors"

    def _check_manifest(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        manifest = {"fingerprint": fingerprint(self.samples, self.target.tap_layer_ids, self.extra),
                    "chunk": self.chunk, "dtype": self.dtype, "num_samples": len(self.samples)}
        path = self.cache_dir / "manifest.json"
        if path.exists():
            old = json.loads(path.read_text())
            if old != manifest:
                raise FeatureCacheError(
                    f"the feature cache {self.cache_dir} was built for other data, taps or settings "
                    f"({old.get('fingerprint')} != {manifest['fingerprint']}); delete it or choose another directory")
            return
        path.write_text(json.dumps(manifest, indent=2) + "\n")

    def _write_chunk(self, c: int) -> None:
        members = self.samples[c * self.chunk : (c + 1) * self.chunk]
        arrays = {}
        for j, (taps, hidden) in enumerate(compute_features(self.target, members)):
            arrays[f"taps.{j}"] = taps.astype(_DTYPES[self.dtype])
            arrays[f"hidden.{j}"] = hidden.astype(_DTYPES[self.dtype])
        tmp = self.cache_dir / f"chunk_{c:05d}.tmp.safetensors"
        mx.save_safetensors(str(tmp), arrays)
        os.replace(tmp, self._chunk_path(c))  # atomic: a chunk file is either complete or absent

    def _cached(self, i: int) -> tuple[mx.array, mx.array]:
        c, j = divmod(i, self.chunk)
        if c not in self._lru:
            self._lru[c] = mx.load(str(self._chunk_path(c)))
            if len(self._lru) > _LRU_CHUNKS:
                self._lru.popitem(last=False)
        self._lru.move_to_end(c)
        arrays = self._lru[c]
        return arrays[f"taps.{j}"], arrays[f"hidden.{j}"]


def _pad_rows(x: mx.array, width: int) -> mx.array:
    # [S, D] -> [width, D] with zero rows after the sample (never attended: they sit after every anchor)
    if x.shape[0] == width:
        return x
    return mx.concatenate([x, mx.zeros((width - x.shape[0], x.shape[1]), dtype=x.dtype)], axis=0)

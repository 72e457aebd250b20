"""Target features per training sample: tapped layer outputs and the final hidden state.

Per sample of length S (docs/method.md §8): ``taps`` [S, m*d] (raw outputs of the tapped
decoder layers, concatenated in ``target_layer_ids`` order) and ``hidden`` [S, d] (post final
norm). The target's lm_head maps ``hidden`` to its logits, so the TV / confidence labels never
need a [S, V] logit table on disk. With ``topk`` > 0 the cache also keeps, per row, the target's k
likeliest tokens ``topk_ids`` [S, k] int32 with their log-probabilities ``topk_logprobs`` [S, k]
(sorted, likeliest first) and its log-probability of the actual next token ``next_logprob`` [S],
so a distillation loss never runs the target's vocabulary-wide head during training.

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
import time
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
TOPK_ROWS = 512  # rows per vocabulary-wide head product in `target_topk` (bounds a [r, V] buffer)
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


def target_topk(target: Target, hidden: mx.array, k: int, ids: np.ndarray) -> tuple[mx.array, mx.array, mx.array]:
    """The target's view of each row t of hidden [S, d] for sample ``ids`` [S]:

    * topk_ids [S, k] int32 and topk_logprobs [S, k] float32: its k likeliest next tokens and
      their log-probabilities, sorted likeliest first (topk_ids[:, 0] is its greedy token);
    * next_logprob [S] float32: its log-probability of the token that follows, ids[t + 1]
      (0 on the last row, which has no next token).

    Log-probabilities, not logits, so a loss over {top-k ∪ label} can also put the rest of the
    target's mass in one bucket without the vocabulary-wide head.
    """
    nxt = mx.array(np.append(ids[1:], 0).astype(np.int32))  # [S]
    out: list[list[mx.array]] = [[], [], []]
    for start in range(0, hidden.shape[0], TOPK_ROWS):
        full = target.lm_head(hidden[start : start + TOPK_ROWS]).astype(mx.float32)  # [r, V]
        logp = full - mx.logsumexp(full, axis=-1, keepdims=True)
        part = mx.argpartition(-logp, k - 1, axis=-1)[:, :k]  # [r, k] unordered
        vals = mx.take_along_axis(logp, part, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        out[0].append(mx.take_along_axis(part, order, axis=-1).astype(mx.int32))
        out[1].append(mx.take_along_axis(vals, order, axis=-1))
        out[2].append(mx.take_along_axis(logp, nxt[start : start + TOPK_ROWS, None], axis=-1)[:, 0])
        mx.eval(out[0][-1], out[1][-1], out[2][-1])
    last = mx.concatenate(out[2])
    last[-1] = 0.0
    return mx.concatenate(out[0]), mx.concatenate(out[1]), last


class FeatureSource:
    """Features for batches of samples, padded to the batch's longest sample."""

    def __init__(self, target: Target, samples: list[Sample], cache_dir: Path | None = None, *,
                 chunk: int = 16, dtype: str = "float32", fingerprint_extra: str = "",
                 progress: ProgressFn | None = None, topk: int = 0):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown feature dtype {dtype!r}; choose one of {tuple(_DTYPES)}")
        self.target, self.samples, self.cache_dir = target, samples, cache_dir
        self.chunk = chunk  # also the unit of the data order, cached or not (same batches either way)
        self.dtype, self.progress = dtype, progress
        self.extra, self.topk = fingerprint_extra, topk
        self._lru: OrderedDict[int, dict[str, mx.array]] = OrderedDict()

    @property
    def num_chunks(self) -> int:
        """Chunks the samples are grouped in (also the unit of the data order)."""
        return (len(self.samples) + self.chunk - 1) // self.chunk

    def prepare(self, limit: int | None = None) -> int:
        """Write every missing cache chunk among the first ``limit`` (default all); returns how many
        were computed (0 on the fly). Progress lines report the target's tokens per second."""
        if self.cache_dir is None:
            return 0
        self._check_manifest()
        todo = range(self.num_chunks if limit is None else min(limit, self.num_chunks))
        missing = [c for c in todo if not self._chunk_path(c).exists()]
        t0, tokens = time.perf_counter(), 0
        for done, c in enumerate(missing, 1):
            if self._chunk_path(c).exists():  # written meanwhile by another process sharing the cache
                continue
            tokens += self._write_chunk(c)
            if self.progress:
                rate = tokens / max(time.perf_counter() - t0, 1e-9)
                self.progress(f"target features: chunk {c + 1}/{self.num_chunks} ({done}/{len(missing)} new, "
                              f"{tokens} tokens, {rate:.0f} tok/s)")
        return len(missing)

    def complete_chunks(self) -> int:
        """How many chunks from chunk 0 on are already on disk (a run may train on just these)."""
        if self.cache_dir is None:
            return self.num_chunks
        done = 0
        while done < self.num_chunks and self._chunk_path(done).exists():
            done += 1
        return done

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

    def teacher(self, indices: list[int]) -> tuple[mx.array, mx.array, mx.array]:
        """The target's top-k for ``indices`` (see `target_topk`), zero-padded to the batch width W:
        ids [b, W, k] int32, log-probs [b, W, k] and next-token log-prob [b, W] float32."""
        if self.topk <= 0:
            raise ValueError("this feature source keeps no target top-k (topk=0)")
        if self.cache_dir is None:
            samples = [self.samples[i] for i in indices]
            triples = [target_topk(self.target, h, self.topk, s.ids)
                       for (_, h), s in zip(compute_features(self.target, samples), samples)]
        else:
            triples = [self._cached_topk(i) for i in indices]
        width = max(t[0].shape[0] for t in triples)
        ids = mx.stack([_pad_rows(t[0], width) for t in triples])
        logp = mx.stack([_pad_rows(t[1], width) for t in triples])
        nxt = mx.stack([_pad_rows(t[2][:, None], width)[:, 0] for t in triples])
        return ids.astype(mx.int32), logp.astype(mx.float32), nxt.astype(mx.float32)

    # ------------------------------------------------------------ cache

    def _chunk_path(self, c: int) -> Path:
        return self.cache_dir / f"chunk_{c:05d}.safetensors"

    def _check_manifest(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        manifest = {"fingerprint": fingerprint(self.samples, self.target.tap_layer_ids, self.extra),
                    "chunk": self.chunk, "dtype": self.dtype, "num_samples": len(self.samples)}
        if self.topk > 0:  # only then: caches written before top-k existed keep their manifest
            manifest["topk"] = self.topk
        path = self.cache_dir / "manifest.json"
        if path.exists():
            old = json.loads(path.read_text())
            if old != manifest:
                raise FeatureCacheError(
                    f"the feature cache {self.cache_dir} was built for other data, taps or settings "
                    f"({old.get('fingerprint')} != {manifest['fingerprint']}); delete it or choose another directory")
            return
        path.write_text(json.dumps(manifest, indent=2) + "\n")

    def _write_chunk(self, c: int) -> int:
        # Returns the tokens written.
        members = self.samples[c * self.chunk : (c + 1) * self.chunk]
        arrays = {}
        for j, (taps, hidden) in enumerate(compute_features(self.target, members)):
            arrays[f"taps.{j}"] = taps.astype(_DTYPES[self.dtype])
            arrays[f"hidden.{j}"] = hidden.astype(_DTYPES[self.dtype])
            if self.topk > 0:
                ids, logp, nxt = target_topk(self.target, hidden, self.topk, members[j].ids)
                arrays[f"topk_ids.{j}"] = ids
                arrays[f"topk_logprobs.{j}"] = logp.astype(_DTYPES[self.dtype])
                arrays[f"next_logprob.{j}"] = nxt  # float32: one value a row
        tmp = self.cache_dir / f"chunk_{c:05d}.tmp.safetensors"
        mx.save_safetensors(str(tmp), arrays)
        os.replace(tmp, self._chunk_path(c))  # atomic: a chunk file is either complete or absent
        return sum(len(s) for s in members)

    def _chunk_arrays(self, i: int) -> tuple[dict[str, mx.array], int]:
        c, j = divmod(i, self.chunk)
        if c not in self._lru:
            if not self._chunk_path(c).exists():  # a cache still being filled (or never prepared)
                self._check_manifest()
                self._write_chunk(c)
            self._lru[c] = mx.load(str(self._chunk_path(c)))
            if len(self._lru) > _LRU_CHUNKS:
                self._lru.popitem(last=False)
        self._lru.move_to_end(c)
        return self._lru[c], j

    def _cached(self, i: int) -> tuple[mx.array, mx.array]:
        arrays, j = self._chunk_arrays(i)
        return arrays[f"taps.{j}"], arrays[f"hidden.{j}"]

    def _cached_topk(self, i: int) -> tuple[mx.array, mx.array, mx.array]:
        arrays, j = self._chunk_arrays(i)
        return arrays[f"topk_ids.{j}"], arrays[f"topk_logprobs.{j}"], arrays[f"next_logprob.{j}"]


def _pad_rows(x: mx.array, width: int) -> mx.array:
    # [S, D] -> [width, D] with zero rows after the sample (never attended: they sit after every anchor)
    if x.shape[0] == width:
        return x
    return mx.concatenate([x, mx.zeros((width - x.shape[0], x.shape[1]), dtype=x.dtype)], axis=0)


def mean_hidden(source: FeatureSource, num_samples: int) -> mx.array:
    """Mean target final state [d] over the first ``num_samples`` samples, position 0 (the
    attention sink) and padding left out (deterministic: the same samples on every resume)."""
    total, rows = None, 0
    for start in range(0, num_samples, FORWARD_BATCH):
        _, hidden = source.batch(list(range(start, min(start + FORWARD_BATCH, num_samples))))
        hidden = hidden[:, 1:].reshape(-1, hidden.shape[-1])  # [b*(W-1), d]
        live = mx.any(hidden != 0, axis=-1)  # [b*(W-1)] real rows
        part = mx.where(live[:, None], hidden, 0.0).sum(axis=0)
        total = part if total is None else total + part
        rows += int(live.sum().item())
    return total / max(rows, 1)

"""One `train-drafter` run: data -> target features -> training loop -> save -> held-out eval -> STS.

Everything a run writes lives under ``cfg.out``:
    config.json, model.safetensors   the drafter (what `load_drafter` reads; copy these to ship it)
    training.json                    data, settings, loss history, held-out metrics, wall times
    samples.jsonl (+ .meta.json)     the tokenized training samples (reused on --resume)
    continuations-<hash>.jsonl       target-generated answers, appended as they finish (resumable)
    features/                        the chunked target-feature cache (resumable)
    checkpoints/                     resumable training state
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import mlx.core as mx
import numpy as np

from engine.loading.drafter import load_drafter, write_shortlist
from engine.models.target import Target
from engine.train import data as D
from engine.train import precondition
from engine.train.batch import valid_anchors
from engine.train.checkpoint import latest_checkpoint
from engine.train.config import TrainConfig, default_mask_token_id, make_drafter_config
from engine.train.evaluate import heldout_estimate, speculative_rounds, zeroed_context
from engine.train.features import FeatureSource, fingerprint
from engine.train.generate import generate_continuations
from engine.train.instruments import GateFailed, Monitor
from engine.train.loop import LoopResult, Trainer
from engine.train.model import init_drafter, num_trainable, save_trained
from engine.train.progress import ProgressBar
from engine.train.shortlist import label_coverage
from engine.train.sts import Rounds, calibrate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataConfig:
    """Where the training and held-out data come from."""

    text: tuple[str, ...] = ()  # text files or directories (every token is trained on)
    exclude: tuple[str, ...] = ()  # globs for path parts to skip under text directories
    chat_prompts: tuple[str, ...] = ()  # JSONL prompt files (answer tokens are trained on)
    continuations: int = 0  # > 0: the target writes answers of up to this many tokens
    gen_temperature: float = 0.0
    gen_batch: int = 16
    max_samples: int | None = None  # seeded random subset of the samples
    heldout: int = 8  # samples held out of training (estimate, and eval prompts if none given)
    eval_prompts: str | None = None  # JSONL prompts for the real-rounds evaluation
    num_eval_prompts: int = 8
    max_eval_prompt: int = 256  # longest held-out prompt, in tokens
    heldout_prompts: tuple[str, ...] = ()  # JSONL prompts whose files (and text) never enter training
    heldout_text: int = 0  # > 0: held-out samples are the passages of this many records of each of those files


class OutputDirError(ValueError):
    """The output directory holds a previous run and --resume was not given."""


def run(cfg: TrainConfig, data: DataConfig, model_spec: str | None, *, resume: bool = False,
        stop_after: int | None = None, stream: TextIO | None = None, extract_only: bool = False) -> dict:
    """The whole run on a target loaded by `load_target`; returns the training.json report.

    With ``stop_after`` the loop checkpoints and raises `TrainingStopped` after that many steps
    (continue later with ``resume=True``); evaluation only runs once all steps are done.
    """
    from engine.loading.target import load_target

    bar = ProgressBar(cfg.steps, stream)
    # Float32, whatever `serve` picks: the feature caches, recipes and gates so far were made on it,
    # and the frozen embedding and head copied into the drafter need the table as floats.
    model, tokenizer, path = load_target(model_spec, bar.message, precision="float32")
    return run_with_model(cfg, data, model, tokenizer, str(path), resume=resume, stop_after=stop_after, bar=bar,
                          extract_only=extract_only)


def run_with_model(cfg: TrainConfig, data: DataConfig, model, tokenizer, path: str, *, resume: bool = False,
                   stop_after: int | None = None, bar: ProgressBar | None = None,
                   extract_only: bool = False) -> dict:
    """The whole run for an already loaded mlx-lm ``model`` (float32) and ``tokenizer``.

    ``extract_only`` stops after the feature cache is complete and returns a short report.
    """
    _check_out(cfg.out, resume)
    bar, clock = bar or ProgressBar(cfg.steps), _Clock()
    mask_id = cfg.mask_token_id
    if mask_id is None:
        mask_id = default_mask_token_id(tokenizer, model.args.vocab_size)
    dcfg = make_drafter_config(cfg, model, mask_id)
    samples = _samples(cfg, data, model, tokenizer, resume, bar)
    train, held = D.split_heldout(samples, min(data.heldout, len(samples) - 1), cfg.seed)
    held = held + _heldout_text(cfg, data, tokenizer)
    bar.message(f"{len(train)} training samples ({sum(map(len, train))} tokens), {len(held)} held out")
    clock.lap("data_s")
    target = Target(model, dcfg.target_layer_ids)  # after generation: taps would record every decode step
    target.check_taps()
    features = FeatureSource(target, train, _features_dir(cfg), chunk=cfg.chunk_sequences, dtype=cfg.feature_dtype,
                             fingerprint_extra=path, progress=bar.message, topk=cfg.topk)
    features.prepare(None if extract_only else cfg.train_chunks)
    clock.lap("features_s")
    if extract_only:
        return _extract_report(cfg, features, train, clock.total())
    if cfg.train_chunks and cfg.grow_every <= 0:  # a growing run keeps every sample: its window widens
        train = train[: cfg.train_chunks * cfg.chunk_sequences]
    monitor = _monitor(cfg, target, held, path, bar)
    try:
        trainer, result = _train(cfg, dcfg, model, target, features, train, resume, stop_after, bar, monitor)
    except GateFailed as exc:
        return _stopped_at_gate(cfg, data, dcfg, path, samples, train, held, exc, clock)
    clock.lap("train_s")
    heldout = _evaluate(cfg, trainer, target, model, held, _eval_prompts(data, held, tokenizer),
                        _eos_ids(tokenizer), bar)
    clock.lap("eval_s")
    report = _report(cfg, data, dcfg, path, samples, train, held, result, heldout, clock.total(), trainer.drafter)
    (cfg.out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    bar.message(f"done: {cfg.out} (held-out greedy tau {heldout.get('greedy', {}).get('tau', float('nan')):.3f})")
    return report


def _train(cfg: TrainConfig, dcfg, model, target: Target, features: FeatureSource, train: list[D.Sample],
           resume: bool, stop_after: int | None, bar: ProgressBar, monitor: Monitor | None = None):
    """Initialise (or resume) and train the drafter, then save it in its layout.

    A failed gate (`GateFailed`) still saves the drafter as it stands, then propagates.
    """
    drafter = init_drafter(dcfg, model, cfg.seed)
    precondition.apply(drafter, cfg.tap_scale, features.batch, min(precondition.STAT_SAMPLES, len(train)))
    trainer = Trainer(cfg, drafter, target.lm_head, features, train, bar)
    trainer.monitor = monitor
    if trainer.shortlist is not None:
        _save_shortlist(cfg, trainer.shortlist, train, bar)
    bar.message(f"training a {cfg.variant} drafter ({num_trainable(drafter) / 1e6:.2f} M trainable parameters)")
    try:
        result = trainer.run(resume=resume, stop_after=stop_after, save_on_stop=True)
    except GateFailed:
        _save(cfg, dcfg, drafter)
        raise
    _save(cfg, dcfg, drafter)
    return trainer, result


def _save_shortlist(cfg: TrainConfig, shortlist: np.ndarray, train: list[D.Sample], bar: ProgressBar) -> None:
    """shortlist.json beside the drafter's weights (``cfg.out``): the KD's frequent-token columns, which
    serving then drafts from (the draft vocabulary, docs/method.md §3.6), and their label coverage."""
    coverage = label_coverage(shortlist, train)
    bar.message(f"draft shortlist: {shortlist.size} tokens, {coverage:.4f} of the training labels")
    write_shortlist(cfg.out, shortlist.tolist(), coverage)


def _save(cfg: TrainConfig, dcfg, drafter) -> None:
    with precondition.folded(drafter):
        save_trained(drafter, dcfg, cfg.out, cfg.save_dtype, extra={"num_anchors": cfg.anchors})


def _monitor(cfg: TrainConfig, target: Target, held: list[D.Sample], path: str, bar: ProgressBar) -> Monitor | None:
    """Instruments and gate on the held-out samples (their features cached once, top-k included)."""
    if not held or (cfg.instrument_every <= 0 and cfg.gate_core_hours <= 0):
        return None
    root = _features_dir(cfg)
    cache = root / f"heldout-{fingerprint(held, target.tap_layer_ids, path)[:12]}" if root else None
    features = FeatureSource(target, held, cache, chunk=cfg.chunk_sequences, dtype=cfg.feature_dtype,
                             fingerprint_extra=path, progress=bar.message, topk=cfg.topk)
    features.prepare()
    return Monitor(held, features, cfg.instrument_every, cfg.seed)


def _heldout_text(cfg: TrainConfig, data: DataConfig, tokenizer) -> list[D.Sample]:
    if data.heldout_text <= 0:
        return []
    min_len = max(cfg.block_size + 2, 16)
    return [s for f in data.heldout_prompts for s in
            D.passage_samples(D.read_prompt_records(f), tokenizer, data.heldout_text, cfg.seq_len, min_len)]


def _stopped_at_gate(cfg, data, dcfg, path, samples, train, held, exc: GateFailed, clock) -> dict:
    """training.json of a run the gate stopped: the verdict and its numbers, no evaluation."""
    state = json.loads((latest_checkpoint(cfg.out) / "state.json").read_text())
    result = LoopResult(step=state["step"], history=state.get("history", []), train_s=state.get("train_s", 0.0),
                        anchor_tokens=state.get("anchor_tokens", 0), cpu_s=state.get("cpu_s", 0.0),
                        early_cpu_s=state.get("early_cpu_s", 0.0), instruments=state.get("instruments", []),
                        gate=exc.verdict)
    report = _report(cfg, data, dcfg, path, samples, train, held, result, {}, clock.total(), None)
    report["stopped"] = exc.verdict["reason"]
    (cfg.out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


class _Clock:
    """Wall time of each phase of the run."""

    def __init__(self):
        self.t0 = self.last = time.perf_counter()
        self.times: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name], self.last = now - self.last, now

    def total(self) -> dict[str, float]:
        return {**self.times, "total_s": time.perf_counter() - self.t0}


# ---------------------------------------------------------------- data


def _features_dir(cfg: TrainConfig) -> Path | None:
    if not cfg.feature_cache:
        return None
    return Path(cfg.features_dir) if cfg.features_dir else cfg.out / "features"


def _extract_report(cfg: TrainConfig, features: FeatureSource, train: list[D.Sample], times: dict) -> dict:
    report = {"features_dir": str(features.cache_dir), "chunks": features.num_chunks, "samples": len(train),
              "tokens": sum(map(len, train)), "topk": cfg.topk, "wall_s": {k: round(v, 2) for k, v in times.items()}}
    (cfg.out / "extract.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _check_out(out: Path, resume: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if not resume and (latest_checkpoint(out) is not None or (out / "samples.jsonl").exists()):
        raise OutputDirError(f"{out} already holds a training run: pass --resume to continue it, "
                             "or choose an empty --out directory")


def _samples(cfg: TrainConfig, data: DataConfig, model, tokenizer, resume: bool, bar: ProgressBar) -> list[D.Sample]:
    path, meta_path = cfg.out / "samples.jsonl", cfg.out / "samples.meta.json"
    # What decides the samples and the train / held-out split (eval settings may change on resume).
    keys = ("text", "exclude", "chat_prompts", "continuations", "gen_temperature", "max_samples", "heldout")
    meta = {"data": {k: getattr(data, k) for k in keys}, "seq_len": cfg.seq_len, "seed": cfg.seed}
    if data.heldout_prompts:  # only then, so older runs' meta files still match on resume
        meta["data"]["heldout_prompts"] = data.heldout_prompts
    if resume and path.exists():
        if meta_path.exists() and json.loads(meta_path.read_text()) != json.loads(json.dumps(meta)):
            raise OutputDirError(f"{cfg.out} was prepared with other data settings; use a new --out")
        return D.load_samples(path)
    samples = _build_samples(cfg, data, model, tokenizer, bar)
    if len(samples) < 2:
        raise ValueError("need at least 2 usable training samples; give more --data or --chat-prompts")
    D.save_samples(samples, path)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return samples


def _build_samples(cfg: TrainConfig, data: DataConfig, model, tokenizer, bar: ProgressBar) -> list[D.Sample]:
    min_len = max(cfg.block_size + 2, 16)
    files = D.list_text_files(list(data.text), data.exclude) if data.text else []
    if data.heldout_prompts:
        passages = D.heldout_passages([r for f in data.heldout_prompts for r in D.read_prompt_records(f)])
        files, dropped = D.drop_heldout_files(files, passages)
        bar.message(f"{dropped} text files left out: held-out path split or a held-out passage inside")
    samples = D.text_samples(files, tokenizer, cfg.seq_len, min_len)
    records = [r for f in data.chat_prompts for r in D.read_prompt_records(f)]
    prompts = [D.record_prompt(r, tokenizer) for r in records]
    if prompts and data.continuations > 0:
        answers = _continuations(cfg, data, model, tokenizer, [p.ids for p in prompts], bar)
        prompts = [D.Prompt(p.ids, a) for p, a in zip(prompts, answers)]
    chat = [D.answer_sample(p.ids, p.answer or [], cfg.seq_len) for p in prompts]
    samples += [s for s in chat if s is not None]
    samples = [s for s in samples if valid_anchors(s).size]
    bar.message(f"{len(samples)} samples ({len(files)} text files, {len(records)} prompt records)")
    # Stored shuffled: feature-cache chunks (the unit of the data order) then mix documents.
    samples = D.subsample(samples, data.max_samples, cfg.seed)
    order = np.random.default_rng([cfg.seed, 13]).permutation(len(samples))
    return [samples[i] for i in order]


def _continuations(cfg: TrainConfig, data: DataConfig, model, tokenizer, prompts: list[list[int]],
                   bar: ProgressBar) -> list[list[int]]:
    key = hashlib.sha256(json.dumps([prompts, data.continuations, data.gen_temperature, cfg.seed]).encode())
    cache = cfg.out / f"continuations-{key.hexdigest()[:12]}.jsonl"
    bar.message(f"generating target continuations for {len(prompts)} prompts (cache {cache.name})")
    return generate_continuations(model, prompts, data.continuations, cache, temperature=data.gen_temperature,
                                  stop_ids=_eos_ids(tokenizer), batch=data.gen_batch, seed=cfg.seed,
                                  progress=bar.message)


def _eval_prompts(data: DataConfig, held: list[D.Sample], tokenizer) -> list[list[int]]:
    if data.eval_prompts:
        records = D.read_prompt_records(data.eval_prompts)
        prompts = [D.record_prompt(r, tokenizer).ids for r in records]
    else:
        prompts = [D.heldout_prompt(s, data.max_eval_prompt) for s in held]
    return [p[-data.max_eval_prompt:] for p in prompts[: data.num_eval_prompts] if p]


def _eos_ids(tokenizer) -> frozenset[int]:
    ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(int(i) for i in ids)


# ---------------------------------------------------------------- evaluation


def evaluate_saved(out: Path, target: Target, model, prompts: list[list[int]], max_tokens: int, *,
                   temperature: float = 0.0, stop_ids: frozenset[int] = frozenset(), seed: int = 0):
    """Load ``out`` through the engine's loader (as serving does) and run real rounds on prompts."""
    drafter, _ = load_drafter(str(out), target_vocab_size=target.vocab_size, target_num_layers=target.num_layers)
    if drafter.needs_target_binding:
        drafter.bind_target_model(model)
    return speculative_rounds(target, drafter, prompts, max_tokens, temperature=temperature,
                              stop_ids=stop_ids, seed=seed)


def _evaluate(cfg: TrainConfig, trainer: Trainer, target: Target, model, held: list[D.Sample],
              prompts: list[list[int]], stop_ids: frozenset[int], bar: ProgressBar) -> dict:
    out: dict = {}
    if held:
        bar.message(f"held-out estimate on {len(held)} samples")
        features = FeatureSource(target, held)
        out["estimate"] = heldout_estimate(trainer, held, features, cfg.anchors, cfg.seed)
        if out["estimate"]:
            out["estimate"].update(_zero_context_estimate(cfg, trainer, held, features))
            bar.message("held-out greedy tau estimate {greedy_tau_estimate:.3f}, context zeroed "
                        "{greedy_tau_estimate_zero_context:.3f}".format(**out["estimate"]))
    if not prompts:
        return out
    bar.message(f"held-out greedy rounds on {len(prompts)} prompts x {cfg.eval_max_tokens} tokens")
    stats, rounds = evaluate_saved(cfg.out, target, model, prompts, cfg.eval_max_tokens, stop_ids=stop_ids,
                                   seed=cfg.seed)
    out["greedy"] = {"tau": stats.mean_accepted_length, "acceptance_by_position": stats.acceptance_by_position,
                     "rounds": stats.rounds, "generated_tokens": stats.generated_tokens, "prompts": len(prompts),
                     "cap": stats.cap}
    if trainer.drafter.has_confidence:
        out["sts"] = _calibrate(cfg, target, model, prompts, rounds, stop_ids, bar)
    return out


def _zero_context_estimate(cfg: TrainConfig, trainer: Trainer, held: list[D.Sample], features: FeatureSource) -> dict:
    # The same anchors with the context zeroed: how much of the estimate the target's taps carry.
    with zeroed_context(trainer.drafter):
        blind = heldout_estimate(trainer, held, features, cfg.anchors, cfg.seed)
    return {"greedy_tau_estimate_zero_context": blind["greedy_tau_estimate"],
            "greedy_acceptance_by_position_zero_context": blind["greedy_acceptance_by_position"]}


def _calibrate(cfg: TrainConfig, target: Target, model, prompts: list[list[int]], rounds: list,
               stop_ids: frozenset[int], bar: ProgressBar) -> dict:
    if cfg.sts_temperature > 0:
        bar.message(f"STS rounds at temperature {cfg.sts_temperature}")
        _, rounds = evaluate_saved(cfg.out, target, model, prompts, cfg.eval_max_tokens,
                                   temperature=cfg.sts_temperature, stop_ids=stop_ids, seed=cfg.seed + 1)
    if not rounds:
        return {"error": "no rounds recorded"}
    report = calibrate(Rounds.from_lists(rounds, cfg.block_size))
    report["sampling_temperature"] = cfg.sts_temperature
    config_path = cfg.out / "config.json"
    raw = json.loads(config_path.read_text())
    raw["sts_temperatures"] = report["temperatures"]
    config_path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    for key in ("temperatures", "ece_before", "ece_after"):
        bar.message(f"STS {key}: " + " ".join(f"{v:.3g}" for v in report[key]))
    return report


# ---------------------------------------------------------------- report


def _recipe(cfg: TrainConfig) -> dict:
    keys = ("objective", "topk", "beta2", "weight_decay", "warmup_frac", "min_lr_frac", "hidden_weight",
            "hidden_center", "regress_steps", "early_steps", "early_positions", "final_steps", "markov_lr_mult",
            "train_chunks", "grow_every", "gate_core_hours", "gate_min_match", "instrument_every", "shortlist")
    return {k: getattr(cfg, k) for k in keys}


def _report(cfg, data, dcfg, path, samples, train, held, result, heldout, times, drafter) -> dict:
    tok_s = result.anchor_tokens / result.train_s if result.train_s else 0.0
    return {
        "variant": cfg.variant, "layout": cfg.resolved_layout, "target": str(path),
        "drafter": {"architecture": dcfg.architecture, "block_size": dcfg.block_size, "drafts": dcfg.max_drafts,
                    "layers": dcfg.num_hidden_layers, "markov_rank": dcfg.markov_rank,
                    "confidence_head": dcfg.enable_confidence_head, "taps": list(dcfg.target_layer_ids),
                    "mask_token_id": dcfg.mask_token_id,
                    "trainable_parameters": num_trainable(drafter) if drafter is not None else None,
                    "save_dtype": cfg.save_dtype},
        "data": {**asdict(data), "samples": len(samples), "train_samples": len(train), "heldout_samples": len(held),
                 "train_tokens": sum(map(len, train)), "train_loss_tokens": sum(s.num_loss_tokens for s in train)},
        "train": {"steps": result.step, "batch": cfg.batch, "anchors": cfg.anchors, "lr": cfg.lr,
                  "warmup_steps": cfg.warmup_steps, "seq_len": cfg.seq_len, "loss_weights": cfg.loss_weights,
                  "loss_decay": cfg.loss_decay, "seed": cfg.seed, "resumed_from": result.resumed_from,
                  "train_wall_s": round(result.train_s, 2), "anchor_tokens": result.anchor_tokens,
                  "anchor_tokens_per_s": round(tok_s, 1), "feature_cache": cfg.feature_cache,
                  "tap_scale": cfg.tap_scale, "cpu_s": round(result.cpu_s, 2),
                  "core_hours": round(result.cpu_s / 3600, 3),
                  "recipe": _recipe(cfg)},
        "instruments": result.instruments,
        "gate": result.gate,
        "history": result.history,
        "heldout": heldout,
        "wall_s": {k: round(v, 2) for k, v in times.items()},
        "versions": {"mlx": mx.__version__},
        **({"notes": cfg.extra} if cfg.extra else {}),
    }

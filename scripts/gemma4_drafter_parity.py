"""Parity of our MLX Gemma-4 DSpark drafter with DeepSpec's own PyTorch `Gemma4DSparkModel`.

Two steps, in two Python environments (torch and MLX never share one):

  1. ``reference`` (a venv with torch, transformers and safetensors; DeepSpec pins transformers
     5.10.2): builds DeepSpec's target config and drafter config with its own
     `build_draft_config`, a tiny random `Gemma4DSparkModel`, writes it with ``save_pretrained``
     (config.json + model.safetensors, as published), runs DeepSpec's inference path
     (`forward_dspark_draft_block` with a DynamicCache over two rounds of new context, then
     `compute_logits`, the Markov head and `predict_confidence_step`) and saves inputs and outputs.
  2. ``compare`` (this repo's venv): loads that directory with `engine.loading.drafter.load_drafter`,
     runs the same rounds through `Drafter.backbone` / `base_logits` / `draft_logits` /
     `confidence_logits`, and reports the max abs differences (and the greedy draft chains).

    /tmp/parity-venv/bin/python scripts/gemma4_drafter_parity.py reference \\
        --deepspec /tmp/deepspec-src --out /tmp/gemma4-parity
    python scripts/gemma4_drafter_parity.py compare --out /tmp/gemma4-parity --report report.md

``--deepspec`` is a directory holding DeepSpec's ``deepspec`` package (a checkout or an export);
nothing of it is copied into this repository. Variants cover K = V with a vanilla Markov head and
a Markov-fed confidence head, and a v_proj drafter with a gated Markov head; layer_scalar is set
away from 1.0 so that its use is checked.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

TOLERANCE = 1e-4
TEXT = dict(  # the tiny "target" Gemma-4 text config (sliding keys included: DeepSpec copies them)
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, max_position_embeddings=4096,
    final_logit_softcapping=30.0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=256,
    num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False, sliding_window=128,
    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1000000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
)
DSPARK = dict(num_draft_layers=2, target_layer_ids=[1, 3, 4], block_size=4, mask_token_id=4, num_anchors=16,
              confidence_head_alpha=1.0, markov_rank=8)
VARIANTS = {
    "k_eq_v-vanilla-conf_markov": dict(text={"attention_k_eq_v": True},
                                       dspark={"markov_head_type": "vanilla", "confidence_head_with_markov": True}),
    "v_proj-gated-conf_plain": dict(text={"attention_k_eq_v": False},
                                    dspark={"markov_head_type": "gated", "confidence_head_with_markov": False}),
}
CONTEXT_ROWS = (7, 12)  # context rows cached after round 1 and after round 2
ANCHORS = (17, 201)
PREV_TAIL = (33, 90, 5)  # teacher-forced x_1..x_{B-1}: prev ids are [anchor, *PREV_TAIL]


# ---------------------------------------------------------------- step 1: DeepSpec (torch)


class _Args(dict):
    """DeepSpec's model_args: a dict read both with ``in`` and by attribute."""

    __getattr__ = dict.__getitem__


def _reference(deepspec: Path, out: Path, seed: int) -> None:
    sys.path.insert(0, str(deepspec))
    import numpy as np
    import torch
    import transformers
    from transformers import DynamicCache
    from transformers.models.gemma4.configuration_gemma4 import Gemma4Config

    from deepspec.eval.dspark.draft_ops import forward_dspark_draft_block
    from deepspec.modeling.dspark.gemma4 import Gemma4DSparkModel, build_draft_config

    torch.manual_seed(seed)
    for name, spec in VARIANTS.items():
        target = Gemma4Config(text_config=TEXT | spec["text"])
        config = build_draft_config(target, _Args(DSPARK | spec["dspark"]))
        config._attn_implementation = "sdpa"  # inference path: no flex mask, as DeepSpec's evaluator
        model = Gemma4DSparkModel(config).eval()
        _randomise(model, torch)
        vdir = out / name
        model.save_pretrained(vdir / "drafter", safe_serialization=True)
        arrays = _run_deepspec(model, config, torch, DynamicCache, forward_dspark_draft_block)
        np.savez(vdir / "reference.npz", **{k: v.numpy() for k, v in arrays.items()})
    meta = dict(command=" ".join([Path(sys.executable).name] + sys.argv), torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                seed=seed, variants=list(VARIANTS), text_config=TEXT, dspark=DSPARK)
    (out / "reference_meta.json").write_text(json.dumps(meta, indent=2))
    print(f"wrote DeepSpec reference outputs for {len(VARIANTS)} variants under {out}")


def _randomise(model, torch) -> None:
    """Random weights everywhere (norm scales near 1), and layer_scalar away from 1 to test its use."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif param.ndim == 1:
                param.copy_(0.1 * noise)
            else:
                param.copy_(noise * param.shape[-1] ** -0.5)
        for i, layer in enumerate(model.layers):
            layer.layer_scalar.fill_(0.75 + 0.5 * i)
        model.lm_head.weight.mul_(8.0)  # logits of a few tens: the soft cap (30) bites


def _run_deepspec(model, config, torch, DynamicCache, forward_block) -> dict:
    """Two rounds of DeepSpec's own inference path; returns inputs and outputs by name."""
    block = int(config.block_size)
    width = len(config.target_layer_ids) * int(config.hidden_size)
    ctx = torch.randn(1, CONTEXT_ROWS[-1], width)
    cache, done, out = DynamicCache(), 0, {"ctx": ctx}
    with torch.no_grad():
        for r, (rows, anchor) in enumerate(zip(CONTEXT_ROWS, ANCHORS)):
            ids = torch.tensor([[anchor] + [int(config.mask_token_id)] * (block - 1)])
            positions = torch.arange(rows + block).unsqueeze(0)
            hidden = forward_block(model, draft_input_ids=ids, position_ids=positions, past_key_values_draft=cache,
                                   target_hidden_states=ctx[:, done:rows], start=rows, block_size=block)[0]
            done = rows
            out |= _heads(model, hidden, ids, torch, prefix=f"r{r}_")
    return out


def _heads(model, hidden, ids, torch, prefix: str) -> dict:
    """Base logits, teacher-forced Markov logits, confidence, and DeepSpec's greedy draft chain."""
    prev = torch.tensor([int(ids[0, 0])] + list(PREV_TAIL))  # [B]
    base = model.compute_logits(hidden)  # [B, V]
    markov = model.markov_head.apply_step_logits(base, token_ids=prev, hidden_states=hidden)
    conf = model.predict_confidence_step(hidden, prev_token_ids=prev)
    tokens, chain = model.sample_draft_tokens(base[None], first_prev_token_ids=ids[:, 0], temperature=0.0,
                                              hidden_states=hidden[None])
    chain_prev = torch.cat([ids[:, 0], tokens[0, :-1]])
    chain_conf = model.predict_confidence_step(hidden, prev_token_ids=chain_prev)
    return {prefix + k: v for k, v in dict(block_ids=ids, prev=prev, hidden=hidden, base=base, markov=markov,
                                           conf=conf, greedy=tokens[0], greedy_logits=chain[0],
                                           greedy_conf=chain_conf).items()}


# ---------------------------------------------------------------- step 2: ours (MLX)


def _compare(out: Path) -> dict:
    import numpy as np

    results = {}
    for vdir in sorted(p for p in out.iterdir() if (p / "reference.npz").exists()):
        ref = dict(np.load(vdir / "reference.npz"))
        results[vdir.name] = _compare_variant(vdir / "drafter", ref)
    return results


def _compare_variant(drafter_dir: Path, ref: dict) -> dict:
    import mlx.core as mx

    from engine.loading.drafter import load_drafter

    raw = json.loads((drafter_dir / "config.json").read_text())
    drafter, cfg = load_drafter(str(drafter_dir), target_vocab_size=raw["vocab_size"],
                                target_num_layers=raw["num_target_layers"], target_hidden_size=raw["hidden_size"])
    cache, done, diffs = drafter.make_cache(), 0, {}
    ctx = mx.array(ref["ctx"])
    for r, rows in enumerate(CONTEXT_ROWS):
        h = drafter.backbone(ctx[:, done:rows], mx.array(ref[f"r{r}_block_ids"]), cache)
        done = rows
        for key, value in _our_heads(drafter, drafter.draft_hidden(h)[0], ref, f"r{r}_").items():
            diffs[f"round{r + 1}.{key}"] = value
    return dict(config=dict(family=cfg.family, attn_head_dim=cfg.attn_head_dim, attn_kv_heads=cfg.attn_kv_heads,
                            k_eq_v=cfg.attention_k_eq_v, softcap=cfg.final_logit_softcapping,
                            markov=cfg.markov_head_type, conf_with_markov=cfg.confidence_head_with_markov,
                            rope=cfg.rope_scaling), diffs=diffs)


def _our_heads(drafter, rows, ref: dict, prefix: str) -> dict:
    """Max abs differences of our outputs against DeepSpec's for one round (plus the greedy chain)."""
    import mlx.core as mx

    from engine.models.drafter import draft_logits

    prev = mx.array(ref[prefix + "prev"])
    ours = dict(hidden=rows, base=drafter.base_logits(rows), markov=draft_logits(drafter, rows, prev),
                conf=drafter.confidence_logits(rows, prev))
    out = {k: _max_diff(v, ref[prefix + k]) for k, v in ours.items()}
    tokens, logits, chain_prev = _greedy_chain(drafter, rows, int(ref[prefix + "block_ids"][0, 0]))
    out["greedy_logits"] = _max_diff(logits, ref[prefix + "greedy_logits"])
    out["greedy_conf"] = _max_diff(drafter.confidence_logits(rows, chain_prev), ref[prefix + "greedy_conf"])
    out["greedy_tokens_equal"] = tokens == [int(t) for t in ref[prefix + "greedy"]]
    out["logit_scale"] = float(abs(ref[prefix + "markov"]).max())
    return out


def _greedy_chain(drafter, rows, anchor: int):
    """The served draft chain at temperature 0: each row's logits use the previous argmax as prev."""
    import mlx.core as mx

    from engine.models.drafter import draft_logits

    base, prev, tokens, logits = drafter.base_logits(rows), anchor, [], []
    for k in range(rows.shape[0]):
        row = draft_logits(drafter, rows[k:k + 1], mx.array([prev]), base[k:k + 1])[0]  # [V], as served
        logits.append(row)
        tokens.append(prev := int(mx.argmax(row).item()))
    return tokens, mx.stack(logits), mx.array([anchor] + tokens[:-1])


def _max_diff(ours, theirs) -> float:
    import numpy as np

    return float(np.abs(np.array(ours, dtype=np.float64) - theirs.astype(np.float64)).max())


def _report(out: Path, results: dict, command: str) -> str:
    """Markdown report: versions, per-variant max abs diffs, pass / fail at TOLERANCE."""
    import mlx.core as mx

    meta = json.loads((out / "reference_meta.json").read_text())
    worst = max(v for r in results.values() for k, v in r["diffs"].items()
                if isinstance(v, float) and not k.endswith("logit_scale"))
    chains = all(v for r in results.values() for k, v in r["diffs"].items() if k.endswith("tokens_equal"))
    lines = ["# Gemma-4 DSpark drafter parity: ours (MLX) vs DeepSpec `Gemma4DSparkModel` (PyTorch)", "",
             f"Result: **{'PASS' if worst <= TOLERANCE and chains else 'FAIL'}** (worst max abs diff "
             f"{worst:.3g}, tolerance {TOLERANCE:g}; greedy chains equal: {chains})", "",
             f"Commands: `{meta.get('command', '?')}` (torch venv), then `{command}` (this repo's venv).", "",
             f"Reference: torch {meta['torch']}, transformers {meta['transformers']}, Python {meta['python']}, "
             f"seed {meta['seed']}. Ours: MLX {mx.__version__}, Python {platform.python_version()}.", ""]
    for name, res in results.items():
        lines += [f"## {name}", "", f"Config as read by us: `{json.dumps(res['config'])}`", "",
                  "| output | max abs diff |", "| --- | --- |"]
        lines += [f"| {k} | {v:.3g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in res["diffs"].items()]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    ref = sub.add_parser("reference", help="torch venv: build DeepSpec's drafter, save it and its outputs")
    ref.add_argument("--deepspec", type=Path, required=True, help="directory holding DeepSpec's deepspec package")
    ref.add_argument("--out", type=Path, required=True)
    ref.add_argument("--seed", type=int, default=0)
    cmp = sub.add_parser("compare", help="this repo's venv: load with our MLX drafter and compare")
    cmp.add_argument("--out", type=Path, required=True)
    cmp.add_argument("--report", type=Path, help="write the markdown report (and results.json beside it) here")
    args = parser.parse_args()
    if args.step == "reference":
        _reference(args.deepspec, args.out, args.seed)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import engine  # noqa: F401  (fast BLAS before mlx.core)

    results = _compare(args.out)
    text = _report(args.out, results, " ".join(["python"] + sys.argv))
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
        (args.report.parent / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if "**PASS**" in text else 1


if __name__ == "__main__":
    sys.exit(main())

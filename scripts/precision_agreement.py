"""Greedy text of the default model at stored precision against the float32 path (issue 25,
"agreement with float32"): over the greedy-equivalence prompts (tests/engine/smollm2_cases.py),
128 tokens each, where the two first part and each model's top-2 logit margin there. The stored
model is decoded twice: with MLX's attention (the model called directly), and as the engine runs it,
with the native attention kernels and layers (engine/native/attention.py, layer.py).

Run from the repository root: `PYTHONPATH=. .venv/bin/python scripts/precision_agreement.py`
(both conversions are prepared on first use; the decodes are cached like the tests' references).
"""

from __future__ import annotations

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

from engine.loading.default_model import ensure_default_model
from engine.loading.target import load_target
from engine.native import attention
from engine.text import apply_chat_template
from tests.engine.references import cached_plain_greedy, plain_greedy
from tests.engine.smollm2_cases import QUESTIONS

TOKENS = 128


def top2_margin(model, ids: list[int]) -> float:
    """The gap between the two largest next-token logits after `ids`."""
    top = mx.sort(model(mx.array([ids]))[0, -1])[-2:].tolist()
    return top[1] - top[0]


def main() -> None:
    dirs = {p: ensure_default_model(precision=p) for p in ("float32", "stored")}
    loaded = {p: load_target(str(d))[:2] for p, d in dirs.items()}
    models, tok = {p: m for p, (m, _) in loaded.items()}, loaded["float32"][1]
    parted = {"MLX's attention": 0, "the native attention kernels and layers": 0}
    for i, question in enumerate(QUESTIONS):
        prompt = apply_chat_template(tok, [{"role": "user", "content": question}])
        a = cached_plain_greedy(dirs["float32"], models["float32"], prompt, TOKENS)
        with attention.active(models["stored"]):
            routed = plain_greedy(models["stored"], prompt, TOKENS)
        for kind, b in zip(parted, (cached_plain_greedy(dirs["stored"], models["stored"], prompt, TOKENS), routed)):
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if k is None:
                continue
            parted[kind] += 1
            ids = prompt + a[:k]
            print(f"prompt {i}, stored with {kind}: parts at token {k}; top-2 margin float32 "
                  f"{top2_margin(models['float32'], ids):.5f}, stored {top2_margin(models['stored'], ids):.5f}")
    for kind, n in parted.items():
        print(f"stored with {kind}: identical greedy text on {len(QUESTIONS) - n} of {len(QUESTIONS)} prompts "
              f"({TOKENS} tokens each)")


if __name__ == "__main__":
    main()

"""Drafter training (`dspark train-drafter`): distil a DSpark or DFlash drafter for an mlx-lm target.

The method: docs/method.md §8. The pieces, in pipeline order:

    data.py        text chunks / chat prompts -> token `Sample`s with a loss mask
    generate.py    batched target continuations of chat prompts (align the drafter with the target)
    features.py    target taps [S, m*d], final hidden [S, d] and (v2) the target's top-k per sample,
                   on the fly or chunk-cached
    batch.py       anchors, block inputs, labels, teacher-forced Markov ids, valid rows
    model.py       the drafter to train (frozen target embedding / lm_head) and its saving
    forward.py     batched masked backbone (many anchors per sequence), equal to `reference_forward`
    loss.py        CE + TV + confidence BCE with position decay; per-position acceptance c*_k;
                   the v2 distillation terms (KL over {top-k, label, rest}, hidden-state regression)
    recipe.py      the v2 phase schedule (regression warm-up, position curriculum, full, final TV)
    instruments.py residual norms, anchor swap, held-out greedy match, zero context; the go/no-go gate
    checkpoint.py  resumable checkpoints (trainable weights, optimizer state, step)
    order.py       the deterministic data order (epochs, or a window that grows with the cache)
    loop.py        AdamW, warm-up + cosine, clipping, checkpoints, per-phase Markov-head lr
    progress.py    the progress line (stderr)
    evaluate.py    held-out estimate and real greedy tau through `SpecDecoder`
    sts.py         sequential temperature scaling of the confidence head (docs/method.md §3.3)
    pipeline.py    the whole run behind the CLI: data -> features -> loop -> save -> eval -> STS

Everything runs in float32 on the CPU.
"""

"""Drafter training (`dspark train-drafter`): distil a DSpark or DFlash drafter for an mlx-lm target.

Spec §1.9 and §5. The pieces, in pipeline order:

    data.py        text chunks / chat prompts -> token `Sample`s with a loss mask
    generate.py    batched target continuations of chat prompts (align the drafter with the target)
    features.py    target taps [S, m*d] and final hidden [S, d] per sample, on the fly or chunk-cached
    batch.py       anchors, block inputs, labels, teacher-forced Markov ids, valid rows
    model.py       the drafter to train (frozen target embedding / lm_head) and its saving
    forward.py     batched masked backbone (many anchors per sequence), equal to `reference_forward`
    loss.py        CE + TV + confidence BCE with position decay; per-position acceptance c*_k
    checkpoint.py  resumable checkpoints (trainable weights, optimizer state, step)
    loop.py        AdamW, warm-up + cosine, clipping, checkpoints, deterministic data order
    progress.py    the progress line (stderr)
    evaluate.py    held-out estimate and real greedy tau through `SpecDecoder`
    sts.py         sequential temperature scaling of the confidence head (spec §1.5)
    pipeline.py    the whole run behind the CLI: data -> features -> loop -> save -> eval -> STS

Everything runs in float32 on the CPU.
"""

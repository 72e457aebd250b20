# Flags of the 2026-12-04 drafter-v2 runs (issue 18; see README.md here). Source this file, then run
# one of the commands at the bottom. M is the repository root, V2 the (untracked) data directory.
M=/work/main
V2=/work/train/v2
# One core, one BLAS thread: the other core stays free for interactive work and tests.
ONE_CORE=(env HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1 taskset -c 1)

# Training-side text for teacher-forced prefill: the Python 3.11 docs (Debian python3.11-doc) and
# the CPython stdlib that scripts/make_prompts.py read. Files in the held-out path split, or holding
# any held-out prompt's passage, are left out. 2300 of the 512-token chunks (~1.08 M tokens).
DATA=(--data /usr/share/doc/python3.11/html/_sources --data /root/.pyenv/versions/3.11.7/lib/python3.11
  --exclude test --exclude tests --exclude idlelib --exclude site-packages --exclude lib2to3 --exclude turtledemo
  --exclude tkinter --exclude __pycache__ --exclude ensurepip --exclude 'config-3.11-*'
  --heldout-prompts $M/data/prompts/heldout_docs.jsonl --heldout-prompts $M/data/prompts/heldout_code.jsonl
  --heldout-prompts $M/data/prompts/heldout_chat.jsonl --heldout 0 --max-samples 2300 --seq-len 512 --seed 0)
# The shared feature cache: taps, final hidden state, target top-32 log-probs (fp16) + next-token log-prob.
FEATURES=(--features-dir $V2/features --topk 32 --feature-dtype float16)

# 1. Target-feature extraction (resumable: rerun the same command; finished chunks are kept).
#    nohup "${ONE_CORE[@]}" $M/.venv/bin/dspark train-drafter "${DATA[@]}" "${FEATURES[@]}" \
#      --variant dspark --layout compact --out $V2/extract --extract-only >> $V2/extract.log 2>&1 &
#    (--resume is needed on a rerun, since $V2/extract then holds samples.jsonl.)

# 2. DSpark v2 training (recipe v2: see README.md), started while the extraction was at chunk 11:
#    it trains on the first 11 chunks and widens its window by one chunk every 25 steps (a chunk
#    still missing when a step needs it is computed by the trainer). Same core as the extraction.
RUN=$V2/dspark-v2a
TRAIN=(--recipe v2 --steps 4000 --train-chunks 11 --grow-every 25 --heldout-text 8
  --eval-prompts $M/data/prompts/heldout_docs.jsonl --num-eval-prompts 16 --eval-max-tokens 128
  --variant dspark --layout compact --layers 2 --block-size 7 --save-dtype float16
  --checkpoint-every 50 --log-every 10 --instrument-every 100)
#    mkdir -p $RUN && nohup "${ONE_CORE[@]}" $M/.venv/bin/dspark train-drafter "${DATA[@]}" "${FEATURES[@]}" \
#      "${TRAIN[@]}" --out $RUN >> $RUN/log.txt 2>&1 &
#    Resume (after a crash, a kill or a reboot): the same command plus --resume.
#    A run the gate stopped has its verdict in $RUN/training.json ("gate", "stopped"); --resume
#    would continue past the gate (the verdict is kept).

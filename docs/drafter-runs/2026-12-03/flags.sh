# Flags of the 2026-12-03 SmolLM2 drafter runs (see README.md here). M is the repository root.
# Shared flags of the two shipped-drafter runs (same data, steps, block and eval: a fair comparison).
M=/work/main
STEPS=${STEPS:-450}
COMMON=(--chat-prompts /work/train/conv_all.jsonl --heldout 16
  --eval-prompts $M/data/prompts/heldout_docs.jsonl --num-eval-prompts 16 --eval-max-tokens 128
  --steps $STEPS --batch 2 --anchors 64 --lr 8e-4 --checkpoint-every 25 --log-every 10
  --feature-dtype float16 --save-dtype float16 --layers 2 --block-size 7 --seed 0)
DSPARK=(--variant dspark --layout compact --out /work/train/runs/dspark)
DFLASH=(--variant dflash --layout zlab --out /work/train/runs/dflash)

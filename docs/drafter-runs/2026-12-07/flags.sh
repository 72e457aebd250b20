# Flags of the 2026-12-07 drafter-v2 run (issue 18; see README.md here). Source this file, then run
# the commented commands at the bottom. Data, feature cache and recipe are the 2026-12-04 ones. The
# docs half of the data is Debian's python3.11-doc package (apt-get install python3.11-doc).
. "$(dirname "${BASH_SOURCE[0]}")/../2026-12-05/flags.sh"  # M, V2, ONE_CORE, DATA, FEATURES, TRAIN, SHORTLIST

# Both earlier gates (v2b, v2c) were taken before any annealing (lr at 0.87 and 0.75 of the peak).
# dspark-v2d is dspark-v2c's command (the same seed and growing window, so the same batches step for
# step, the same 8,192-token shortlist) with a schedule that spends the gate's core-hour in the
# early phase and anneals inside it: 1,500 steps, all of them early (v2c reached its gate at step
# 1,496), so the cosine reaches its floor (0.1 x peak) at the last step. The only difference from
# v2c up to step 1,496 is the learning-rate schedule (its warm-up, 3% of the steps, is 45 steps
# instead of 120, and the cosine spans 1,500 steps instead of 4,000).
RUN=$V2/dspark-v2d
ANNEAL=(--steps 1500 --early-steps 1500 --final-steps 0)
# The machine is shared with interactive work: both processes run at the lowest priority, so they
# take core 1 when it is idle and yield it to tests and benchmarks.
LOW=(nice -n 19)
# 1. The feature cache (resumable), as 2026-12-04 command 1:
#    mkdir -p $V2 && nohup "${LOW[@]}" "${ONE_CORE[@]}" $M/.venv/bin/dspark train-drafter "${DATA[@]}" \
#      "${FEATURES[@]}" --variant dspark --layout compact --out $V2/extract --extract-only >> $V2/extract.log 2>&1 &
# 2. dspark-v2d:
#    mkdir -p $RUN && nohup "${LOW[@]}" "${ONE_CORE[@]}" $M/.venv/bin/dspark train-drafter "${DATA[@]}" \
#      "${FEATURES[@]}" "${TRAIN[@]}" "${SHORTLIST[@]}" "${ANNEAL[@]}" --out $RUN >> $RUN/log.txt 2>&1 &

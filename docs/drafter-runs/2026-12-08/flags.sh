# Flags of the 2026-12-08 drafter-v2 run (issue 18; see README.md here). Source this file, then run
# the commented command at the bottom. Data, feature cache, recipe and shortlist are v2d's
# (../2026-12-07/flags.sh), and so is the schedule (1,500 steps, all early, annealed inside the gate).
. "$(dirname "${BASH_SOURCE[0]}")/../2026-12-07/flags.sh"  # M, V2, ONE_CORE, LOW, DATA, FEATURES, TRAIN, SHORTLIST, ANNEAL

# dspark-v2e: v2d's command with the whole feature cache from step 0 (all 144 chunks, about 1.13 M
# tokens, epochs over shuffled samples) instead of a window that grew from 11 chunks by one every
# 25 steps (v2d had seen about half the cache by its gate). The later flags win over TRAIN's.
RUN=$V2/dspark-v2e
WHOLE=(--train-chunks 144 --grow-every 0)
#    mkdir -p $RUN && nohup "${LOW[@]}" "${ONE_CORE[@]}" $M/.venv/bin/dspark train-drafter "${DATA[@]}" \
#      "${FEATURES[@]}" "${TRAIN[@]}" "${SHORTLIST[@]}" "${ANNEAL[@]}" "${WHOLE[@]}" --out $RUN >> $RUN/log.txt 2>&1 &
#    It first computes the chunks the extraction had not finished (9 of 144 at the start).

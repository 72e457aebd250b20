# Flags of the 2026-12-05 drafter-v2 run (issue 18; see README.md here). Source this file, then run
# the commented command at the bottom. Data, feature cache and recipe are the 2026-12-04 ones.
. "$(dirname "${BASH_SOURCE[0]}")/../2026-12-04/flags.sh"  # M, V2, ONE_CORE, DATA, FEATURES, TRAIN

# dspark-v2c: dspark-v2b's command (2026-12-04 command 2, the same TRAIN flags, so the same seed,
# the same growing window and therefore the same batches step for step) plus one change: the KD
# runs over the draft shortlist (the 8,192 most frequent training labels, plus every row's target
# top-32 and label) instead of the whole 49,152-token vocabulary. Serving, the instruments and the
# gate still use the whole vocabulary.
RUN=$V2/dspark-v2c
SHORTLIST=(--shortlist 8192)
#    mkdir -p $RUN && nohup "${ONE_CORE[@]}" $M/.venv/bin/dspark train-drafter "${DATA[@]}" "${FEATURES[@]}" \
#      "${TRAIN[@]}" "${SHORTLIST[@]}" --out $RUN >> $RUN/log.txt 2>&1 &
#    Resume (after a crash, a kill or a reboot, or to continue past a failed gate): the same
#    command plus --resume.

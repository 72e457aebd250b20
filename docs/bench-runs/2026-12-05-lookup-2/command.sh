cd "$REPO"  # commit 33ff704 plus the lookup pipelining change (see README.md)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 BLIS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
taskset -c 0 .venv/bin/python -m dspark_cli.main bench --workloads --server --modes lookup --max-tokens 128 --repeats 1 --no-mlx-lm --out docs/bench-runs/2026-12-05-lookup-2

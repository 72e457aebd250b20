"""dspark-serve engine: lossless DSpark/DFlash speculative decoding on MLX.

Importing any engine module first loads the optimized BLAS (see `engine.backend`), because it must
happen before the first `import mlx.core` anywhere in the process.
"""

from engine.backend import ensure_fast_blas as _ensure_fast_blas

_ensure_fast_blas()

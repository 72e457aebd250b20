"""Hugging Face Hub access for targets and drafters, with one clear error when it is unreachable."""

from __future__ import annotations

from pathlib import Path


class HubUnavailableError(ValueError):
    """A repository could not be found locally or downloaded; the message says what to do."""


def looks_like_hf_id(spec: str) -> bool:
    """True for "org/name" strings (not local-looking paths)."""
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def snapshot_download(repo_id: str, allow_patterns: list[str]) -> str:
    """huggingface_hub.snapshot_download, imported lazily (slow import, only needed for Hub ids)."""
    import huggingface_hub

    return huggingface_hub.snapshot_download(repo_id, allow_patterns=allow_patterns)


def download(repo_id: str, allow_patterns: list[str], what: str = "model") -> Path:
    """Local snapshot of `repo_id`; HubUnavailableError with a readable reason otherwise."""
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns))
    except LocalEntryNotFoundError as exc:
        raise HubUnavailableError(
            f"{what} '{repo_id}' is not in the local Hugging Face cache and the Hub cannot be reached "
            "(offline, or HF_HUB_OFFLINE=1). Download it once with network access, or pass a local "
            "directory.") from exc
    except RepositoryNotFoundError as exc:
        raise HubUnavailableError(f"Hugging Face repository '{repo_id}' does not exist, is private or is gated") from exc
    except Exception as exc:  # noqa: BLE001 - network stacks raise many types; never surface a raw traceback
        raise HubUnavailableError(
            f"could not download {what} '{repo_id}' from the Hugging Face Hub: {type(exc).__name__}: {exc}") from exc

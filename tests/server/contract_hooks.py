"""Schemathesis hooks for the contract runs (`tests/server/test_contract.py`, `make contract`).

Generated bodies are sent as they are, except that a completion is kept short: when every token
limit a body sends is valid (a positive integer or null), all of them (`max_tokens`, and for chat
`max_completion_tokens`) are set to the smallest one sent, at most `MAX_TOKENS`. So a run measures the
contract, not the model's speed, and the two chat limits agree (the server refuses two different
ones, a rule JSON Schema cannot state). A body with an invalid limit is left as it is.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

MAX_TOKENS = int(os.environ.get("DSPARK_CONTRACT_MAX_TOKENS", "4"))
LIMITS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/completions": ("max_tokens",)}


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Cap the completion length of generation requests (see the module docstring)."""
    names = LIMITS.get(case.operation.path)
    if names is None or not isinstance(case.body, dict):
        return
    sent = [case.body.get(name) for name in names]
    if not all(value is None or _positive_integer(value) for value in sent):
        return
    limit = min([int(value) for value in sent if value is not None] + [MAX_TOKENS])
    for name in names:
        case.body[name] = limit


def _positive_integer(value: Any) -> bool:
    """What JSON Schema's `{"type": "integer", "minimum": 1}` takes: 3 and 3.0, not true or 3.5."""
    return type(value) in (int, float) and value >= 1 and float(value).is_integer()

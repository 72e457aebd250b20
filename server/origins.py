"""The `dspark.token_origins` extension: every generated token's id, text and origin.

A `TokenEvent` says how many of its first token ids were accepted drafts (`drafted`); the others
are the target's own tokens. A formatter collects them per round and hands them to the next chunk
it sends, so a round whose text the output parser holds back passes its tokens on to a later chunk,
and the chunks of a stream list every generated token exactly once (the finish chunk takes the rest).
Off (the default), no `TokenOrigins` exists and nothing is decoded.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.api import TokenEvent
from server.protocol import TokenOrigin


class TokenOrigins:
    """The origins of the tokens not yet sent; `decode` is the engine's (ids -> text, specials kept)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._pending: list[TokenOrigin] = []

    def add(self, event: TokenEvent) -> None:
        """Note the tokens of one round: the first `event.drafted` were accepted drafts."""
        for i, token_id in enumerate(event.token_ids):
            origin = "draft" if i < event.drafted else "target"
            self._pending.append(TokenOrigin(id=token_id, text=self._decode([token_id]), origin=origin))

    def take(self) -> list[TokenOrigin]:
        """The tokens noted since the last call (for the chunk about to be sent)."""
        out, self._pending = self._pending, []
        return out


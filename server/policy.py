"""The request policy: the fields of a body that the server does not model, and what to do with them.

Tolerant (the default): they are ignored. Each name is logged once per process, counted in
`dspark_ignored_fields_total{field}` and listed in the `X-Dspark-Ignored` response header.
Strict (`--strict-params`, for conformance tests): they are refused as OpenAI refuses them, except
the inert OpenAI fields at their no-op value (`user`, `store: false`, ...).
"""

from __future__ import annotations

import logging
import re
import types
import typing
from typing import Any

from pydantic import BaseModel

from server.errors import APIError

log = logging.getLogger(__name__)

HEADER = "X-Dspark-Ignored"
ANY = object()

# OpenAI fields that never change what is generated. Under --strict-params each is accepted only at
# its no-op value (ANY: any value); null always means unset.
INERT: dict[str, Any] = {
    "user": ANY, "store": False, "metadata": ANY, "prompt_cache_key": ANY, "safety_identifier": ANY,
    "service_tier": None, "verbosity": None, "prediction": None, "web_search_options": None,
    "prompt_cache_retention": None,
}
# Nested inert fields (list indices written `[]`), accepted with any value under --strict-params.
INERT_PATHS = frozenset({"messages[].content[].image_url.detail", "input[].content[].detail", "input[].output[].detail"})
_INDEX = re.compile(r"\[\d+\]")
_logged: set[str] = set()
# Client-chosen names end up in a response header, metric labels and the log: each is cut to
# MAX_NAME_CHARS and written in printable ASCII, and the header lists at most MAX_HEADER_NAMES.
MAX_NAME_CHARS = 80
MAX_HEADER_NAMES = 32
MAX_LOGGED_NAMES = 1000  # distinct names logged per process; later ones are counted, not logged


def unmodelled(model: type[BaseModel], data: Any, path: str = "") -> list[str]:
    """Paths of the keys in `data` that `model` (and the models nested in it) does not define.

    Example: `["metadata", "messages[1].cache_control"]`, in the order they appear. Where a field holds
    one of several models (chat content parts), the one whose `type` matches the item's reads it.
    """
    if not isinstance(data, dict):
        return []
    out: list[str] = []
    fields = model.model_fields
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        field = fields.get(key)
        if field is None:
            out.append(where)
            continue
        models, is_list = _nested_models(field.annotation)
        if not models:
            continue
        if is_list and isinstance(value, list):
            for i, item in enumerate(value):
                nested = _model_for(models, item)
                if _ignored_whole(nested, item):
                    out.append(f"{where}[{i}]")
                    continue
                out += unmodelled(nested, item, f"{where}[{i}]")
        elif not is_list:
            out += unmodelled(_model_for(models, value), value, where)
    return out


def _ignored_whole(model: type[BaseModel], item: Any) -> bool:
    """Whether a list item is ignored as a whole: a model may say so of items it does not model
    (`ignored_as_a_whole`, e.g. Responses tools of types the server does not run)."""
    hook = getattr(model, "ignored_as_a_whole", None)
    return bool(hook is not None and hook(item))


def _nested_models(annotation: Any) -> tuple[tuple[type[BaseModel], ...], bool]:
    """(models, is_list) when the annotation is a model, a union of models, or a list of them, possibly
    optional; no models otherwise."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,), False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and args:
        inner, _ = _nested_models(args[0])
        return inner, True
    if origin in (typing.Union, types.UnionType) or origin is typing.Annotated:
        models: tuple[type[BaseModel], ...] = ()
        is_list = False
        for arg in args:
            found, listed = _nested_models(arg)
            if found and not models:
                is_list = listed
            models += found if listed == is_list else ()
        return models, is_list
    return (), False


def _model_for(models: tuple[type[BaseModel], ...], item: Any) -> type[BaseModel]:
    """Of `models`, the one whose `type` field is a literal naming `item["type"]`; else the first."""
    kind = item.get("type") if isinstance(item, dict) else None
    for model in models:
        field = model.model_fields.get("type")
        if field is not None and kind in typing.get_args(field.annotation):
            return model
    return models[0]


def refuse_unmodelled(data: dict[str, Any], paths: list[str]) -> None:
    """Strict mode: a 400 for the first of `paths` (`unmodelled(model, data)`) that the server would
    ignore; inert fields at their no-op value pass."""
    for where in paths:
        if _INDEX.sub("[]", where) in INERT_PATHS:
            continue
        if where in INERT:  # top-level names only: nested paths never match
            value, noop = data[where], INERT[where]
            if value is None or noop is ANY or (type(value) is type(noop) and value == noop):  # 0 is not false
                continue
            raise APIError(400, f"'{where}' is not supported by this server.", param=where,
                           code="unsupported_parameter")
        raise APIError(400, f"Unrecognized request argument supplied: {where}", param=where,
                       code="unrecognized_argument")


def field_names(paths: list[str]) -> list[str]:
    """Paths without list indices, deduplicated, safe to print: `messages[3].x` -> `messages[].x`."""
    return list(dict.fromkeys(_printable(_INDEX.sub("[]", p)) for p in paths))


def _printable(name: str) -> str:
    """`name` as is when it is plain printable ASCII, else quoted with escapes as Python writes them
    (`''`, `' x'`, `'caf\\xe9'`); at most MAX_NAME_CHARS long.

    A header value must be Latin-1, without line breaks or whitespace at its ends, and a field name
    can hold anything, even nothing.
    """
    plain = name.isascii() and name.isprintable() and name == name.strip() and name != ""
    text = name if plain else ascii(name)
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS - 3] + "..."


def header_value(names: list[str]) -> str:
    """The `X-Dspark-Ignored` value: the names, at most MAX_HEADER_NAMES of them, then how many more."""
    shown = ", ".join(names[:MAX_HEADER_NAMES])
    more = len(names) - MAX_HEADER_NAMES
    return f"{shown}, ... ({more} more)" if more > 0 else shown


def log_once(names: list[str]) -> None:
    """Log each ignored field name the first time this process sees it."""
    for name in names:
        if name not in _logged and len(_logged) < MAX_LOGGED_NAMES:
            _logged.add(name)
            log.info("ignoring request field %r (not used by this server; --strict-params refuses it)", name)

"""Rebuild a Hugging Face fast tokenizer from GGUF tokenizer metadata (byte-level BPE).

Only the GPT-2 style BPE model is supported, with llama.cpp's pre-tokenizer names mapped to the
`tokenizers` pipeline they stand for. transformers' own GGUF path needs torch, so we build the
`tokenizer.json` with the `tokenizers` library directly.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

_CONTROL = 3  # llama.cpp token type: control (special) token


def _value(x):
    return x.item() if hasattr(x, "item") else x


def _pre_tokenizer(name: str):
    # "smollm": digits are split one per token, then GPT-2 byte-level splitting.
    if name == "smollm":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if name in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise ValueError(f"unsupported GGUF pre-tokenizer {name!r}")


def build_tokenizer(meta: dict) -> tuple[Tokenizer, list[str]]:
    """A `tokenizers.Tokenizer` and the list of special token strings, from GGUF metadata."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {meta.get('tokenizer.ggml.model')!r}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    types = [int(t) for t in meta["tokenizer.ggml.token_type"].tolist()]
    specials = [tokens[i] for i, t in enumerate(types) if t == _CONTROL]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok, specials


def tokenizer_config(meta: dict, specials: list[str]) -> dict:
    """tokenizer_config.json: special tokens, chat template, no automatic BOS."""
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        idx = meta.get(key)
        return None if idx is None else tokens[int(_value(idx))]

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "additional_special_tokens": specials,
        "add_bos_token": bool(_value(meta.get("tokenizer.ggml.add_bos_token", False))),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_value(meta.get("llama.context_length", 8192))),
        "chat_template": meta.get("tokenizer.chat_template"),
    }


def write_tokenizer(meta: dict, out_dir: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json into `out_dir`."""
    tok, specials = build_tokenizer(meta)
    tok.save(str(out_dir / "tokenizer.json"))
    config = tokenizer_config(meta, specials)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}, indent=2) + "\n"
    )

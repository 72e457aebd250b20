"""Structured output on the real default model (SmolLM2-135M, fp32): a corpus of JSON schemas,
answered greedy and seeded in baseline, dspark and dflash (random drafters: many rejections) and
lookup modes. Every output parses and validates against its schema, and greedy output is the same
in every mode up to measured near-ties."""

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from engine.api import GrammarSpec, SpecStats
from engine.grammar import CompiledGrammar, compile_grammar, grammar_tokenizer
from engine.lookup import LookupConfig, LookupDrafter
from engine.runtime import eos_ids
from engine.sampling import SamplerSettings
from engine.samplers import make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import apply_chat_template

VOCAB = 49152
MAX_TOKENS = 120
TIE_EPS = 1e-4
NAME = {"type": "string", "maxLength": 16}
# (question, schema): nested objects, arrays with minItems, enums, numbers, booleans, optional
# fields. Strings and arrays are bounded, so every answer fits MAX_TOKENS whatever the model does.
CORPUS = [
    ("Describe a cat called Tom who is 3 years old.",
     {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 40}},
      "required": ["name", "age"], "additionalProperties": False}),
    ("List three fruits.",
     {"type": "object", "properties": {"fruits": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 4}},
      "required": ["fruits"], "additionalProperties": False}),
    ("Is the sky blue? Say how sure you are.",
     {"type": "object", "properties": {"answer": {"type": "boolean"},
                                       "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                                       "colour": {"enum": ["blue", "grey", "black"]}},
      "required": ["answer", "colour"], "additionalProperties": False}),
    ("Give the capital of France and its country.",
     {"type": "object", "properties": {
         "city": {"type": "object", "properties": {"name": NAME, "population": {"type": "integer", "minimum": 0,
                                                                                "maximum": 99999999}},
                  "required": ["name"], "additionalProperties": False},
         "country": NAME},
      "required": ["city", "country"], "additionalProperties": False}),
]


@pytest.fixture(scope="module")
def setup(smollm2):
    target, tok, dspark, dflash = smollm2
    stops = eos_ids(tok)
    ll_tok = grammar_tokenizer(tok, VOCAB, stops)
    drafters = {"baseline": None, "dspark": dspark, "dflash": dflash,
                "lookup": LookupDrafter(LookupConfig(min_ngram=1, max_ngram=3, max_drafts=4))}
    return target, tok, stops, ll_tok, drafters


def run(setup, question, schema, mode, sampler_settings, seed=0):
    """(tokens, text, decoder) of one constrained generation, invariants checked every round."""
    target, tok, stops, ll_tok, drafters = setup
    grammar = CompiledGrammar(ll_tok, compile_grammar(GrammarSpec("json_schema", json.dumps(schema))), VOCAB)
    opts = DecodeOptions(make_sampler(sampler_settings, "rejection", seed), stops, grammar=grammar)
    drafter = drafters[mode]
    dec = SpecDecoder(target, drafter, None if drafter is None else Scheduler(4), opts,
                      SpecStats(mode=mode, cap=4))
    prompt = apply_chat_template(tok, [{"role": "user", "content": question + " Answer in JSON."}])
    out = dec.prefill(prompt)
    while len(out) < MAX_TOKENS and not dec.done:
        out += dec.step(MAX_TOKENS - len(out))
        dec.check_invariants()
    assert dec.done, f"{mode}: no end within {MAX_TOKENS} tokens"
    text = tok.decode([t for t in out if t not in stops])
    return out, text, dec, prompt


def masked_gap(target, prompt, out, k, schema, ll_tok) -> float:
    """The gap between the two best grammar-allowed logits at output position k (teacher forced)."""
    row = np.array(target.model(mx.array([prompt + out[:k]]))[0, -1])  # [V]
    matcher = CompiledGrammar(ll_tok, compile_grammar(GrammarSpec("json_schema", json.dumps(schema))), VOCAB).matcher()
    matcher.commit(out[:k])
    allowed = np.array(matcher.allowed())
    top = np.sort(row[allowed])[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_greedy_output_is_valid_and_the_same_in_every_mode(setup, index):
    """Greedy: a valid instance in each mode, token for token the same as baseline (or diverging
    first at a measured near-tie of the masked target)."""
    question, schema = CORPUS[index]
    base, text, _, prompt = run(setup, question, schema, "baseline", SamplerSettings())
    jsonschema.validate(json.loads(text), schema)
    for mode in ("dspark", "dflash", "lookup"):
        out, text, dec, _ = run(setup, question, schema, mode, SamplerSettings())
        jsonschema.validate(json.loads(text), schema)
        if out != base:
            k = next(j for j, (a, b) in enumerate(zip(base, out)) if a != b)
            assert masked_gap(setup[0], prompt, base, k, schema, setup[3]) <= TIE_EPS, (mode, k)
        assert dec.stats.drafted_tokens > 0, mode


@pytest.mark.parametrize("mode", ["baseline", "dspark", "dflash", "lookup"])
def test_seeded_output_is_valid(setup, mode):
    """T=0.8, top-p 0.95, rejection sampling: every answer of the corpus parses and validates."""
    settings = SamplerSettings(temperature=0.8, top_p=0.95)
    for question, schema in CORPUS:
        _, text, _, _ = run(setup, question, schema, mode, settings, seed=11)
        jsonschema.validate(json.loads(text), schema)

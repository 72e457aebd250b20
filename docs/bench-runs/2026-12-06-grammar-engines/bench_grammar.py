"""Benchmark llguidance vs xgrammar (JSON-schema constrained decoding) on CPU, one core.

Usage (from /tmp/gbench):
    OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 taskset -c 1 venv/bin/python bench_grammar.py
        -> runs each library in its own fresh subprocess, writes results.json, prints markdown.
    ... bench_grammar.py --lib llg|xgr     (one library, JSON to stdout)

Tokenizer: /tmp/gbench/tokenizer.json (SmolLM2-135M, 49152 tokens, rebuilt by the project's
engine/loading/gguf_tokenizer.build_tokenizer from the default GGUF). EOS ids [2, 0].
xgrammar is imported through xgr_shim (stub torch/transformers modules; see that file).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOK_PATH = os.path.join(HERE, "tokenizer.json")
N_VOCAB = 49152
EOS = [2, 0]
WARM_PASSES = 5
COMPILE_REPEATS = 5

NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string"},
                "country": {"type": "string"},
            },
            "required": ["street", "city"],
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer"},
                    "price": {"type": "number"},
                    "gift": {"type": "boolean"},
                },
                "required": ["sku", "qty", "price"],
            },
        },
        "note": {"type": "string"},
    },
    "required": ["id", "name", "active", "score", "status", "tags", "address", "items"],
}
NESTED_INST = {
    "id": 48213,
    "name": "Order for Jane Doe",
    "active": True,
    "score": 87.25,
    "status": "shipped",
    "tags": ["priority", "fragile", "international"],
    "address": {"street": "221B Baker Street", "city": "London", "country": "UK"},
    "items": [
        {"sku": "BK-0042", "qty": 2, "price": 19.99, "gift": False},
        {"sku": "MUG-7", "qty": 1, "price": 8.5},
        {"sku": "TEA-EARLGREY-100", "qty": 3, "price": 4.25, "gift": True},
    ],
}
FLAT = {
    "type": "object",
    "properties": {
        "first_name": {"type": "string"},
        "last_name": {"type": "string"},
        "email": {"type": "string"},
    },
    "required": ["first_name", "last_name", "email"],
}
FLAT_INST = {"first_name": "Ada", "last_name": "Lovelace", "email": "ada.lovelace@example.org"}
JSONMODE = {"type": "object"}
JSONMODE_INST = {
    "model": "smollm2",
    "ok": True,
    "n": [1, 2.5, -3e2, None],
    "meta": {"user": "bob", "scores": {"a": 0.1, "b": [True, False]}, "text": 'line\nbreak "quoted"'},
    "empty": {},
    "list": [],
}
WORKLOADS = [
    ("nested", NESTED, NESTED_INST),
    ("flat3", FLAT, FLAT_INST),
    ("json_object", JSONMODE, JSONMODE_INST),
]

# (feature, schema, valid instance, invalid instance)
COVERAGE = [
    ("minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [1, 2], [1]),
    ("enum", {"enum": ["red", "green", 1]}, "green", "blue"),
    ("const", {"const": "fixed"}, "fixed", "other"),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x", True),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, True, "s"),
    (
        "$ref/$defs recursion",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["v"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/node",
        },
        {"v": 1, "children": [{"v": 2, "children": [{"v": 3}]}]},
        {"v": 1, "children": [{"w": 2}]},
    ),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "ABC-12", "abc-12"),
    ("format: date-time", {"type": "string", "format": "date-time"}, "2024-05-01T12:30:00Z", "yesterday"),
    ("minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 10}, 7, 11),
    (
        "additionalProperties: false",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"a": 1},
        {"a": 1, "b": 2},
    ),
    ("minLength/maxLength", {"type": "string", "minLength": 3, "maxLength": 5}, "abcd", "ab"),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ("not", {"not": {"type": "string"}}, 1, "s"),
    (
        "if/then",
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "num"}}},
            "then": {"required": ["n"]},
        },
        {"kind": "num", "n": 1},
        {"kind": "num"},
    ),
]


def stats_us(ns: list[int]) -> dict:
    a = np.array(ns, dtype=np.float64) / 1000.0
    return {
        "n": len(a),
        "median_us": float(np.median(a)),
        "p90_us": float(np.percentile(a, 90)),
        "max_us": float(a.max()),
        "total_ms": float(a.sum() / 1000.0),
    }


def allowed(mask: np.ndarray, t: int) -> bool:
    return bool((int(mask[0, t >> 5]) >> (t & 31)) & 1)


def popcount(mask: np.ndarray) -> int:
    return int(np.unpackbits(mask.view(np.uint8)).sum())


# ----------------------------------------------------------------------------- adapters
class LLG:
    name = "llguidance"

    def __init__(self, tok_json: str):
        import llguidance
        import llguidance.numpy as lnp

        self.llg, self.lnp = llguidance, lnp
        self.version = _dist_version("llguidance")
        t0 = time.perf_counter_ns()
        self.tok = llguidance.LLTokenizer(tok_json, n_vocab=N_VOCAB, eos_token=EOS)
        self.tok_init_ns = time.perf_counter_ns() - t0
        self.compiler_init_ns = 0

    def compile(self, schema, fresh=False):
        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return g  # LLMatcher construction above is the compile; matchers are built per walk

    def matcher(self, g):
        return self.llg.LLMatcher(self.tok, g, log_level=0)

    def alloc(self):
        return self.lnp.allocate_token_bitmask(1, N_VOCAB)

    def fill(self, m, bm):
        self.lnp.fill_next_token_bitmask(m, bm, 0)

    def consume(self, m, t):
        return m.consume_token(t)

    def rollback(self, m, n):
        return m.rollback(n)

    def accepts(self, g, tokens) -> bool:
        m = self.matcher(g)
        n = m.try_consume_tokens(tokens)
        return n == len(tokens) and not m.is_error() and m.is_accepting()

    def coverage_compile(self, schema):
        try:
            g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        except Exception as e:  # noqa: BLE001
            return None, f"{type(e).__name__}: {e}"
        is_err, msgs = self.llg.LLMatcher.validate_grammar_with_warnings(g, self.tok)
        if is_err:
            return None, " | ".join(msgs)
        return g, (" | ".join(msgs) if msgs else "")


class XGR:
    name = "xgrammar"

    def __init__(self, tok_json: str):
        sys.path.insert(0, HERE)
        import xgr_shim  # noqa: F401  (stub torch/transformers)
        import xgrammar as xgr
        from tokenizers import Tokenizer

        self.xgr = xgr
        self.version = _dist_version("xgrammar")
        t0 = time.perf_counter_ns()
        hf = Tokenizer.from_str(tok_json)
        enc = [hf.id_to_token(i) for i in range(N_VOCAB)]  # byte-level encoded ("Ġ" = space)
        self.info = xgr.TokenizerInfo(enc, xgr.VocabType.BYTE_LEVEL, vocab_size=N_VOCAB, stop_token_ids=EOS)
        self.tok_init_ns = time.perf_counter_ns() - t0
        t0 = time.perf_counter_ns()
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.compiler_init_ns = time.perf_counter_ns() - t0

    def compile(self, schema, fresh=False):
        return self.compiler.compile_json_schema(json.dumps(schema))

    def matcher(self, g):
        return self.xgr.GrammarMatcher(g, max_rollback_tokens=16)

    def alloc(self):
        return self.xgr.allocate_token_bitmask(1, N_VOCAB)  # numpy int32 via the shim

    def fill(self, m, bm):
        m.fill_next_token_bitmask(bm, 0)

    def consume(self, m, t):
        return m.accept_token(t)

    def rollback(self, m, n):
        return m.rollback(n)

    def accepts(self, g, tokens) -> bool:
        m = self.matcher(g)
        for t in tokens:
            if not m.accept_token(t):
                return False
        return m.accept_token(EOS[0])  # stop token accepted <=> grammar complete

    def coverage_compile(self, schema):
        import warnings

        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                g = self.compiler.compile_json_schema(json.dumps(schema))
            except Exception as e:  # noqa: BLE001
                return None, f"{type(e).__name__}: {e}"
        return g, " | ".join(str(x.message) for x in w)


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# ----------------------------------------------------------------------------- benchmark
def walk(lib, g, tokens, specials):
    """Fresh matcher; at each position fill mask (timed), check next token allowed, consume."""
    m = lib.matcher(g)
    bm = lib.alloc()
    times, bad, special_allowed, n_allowed = [], 0, 0, []
    for t in tokens + [None]:
        t0 = time.perf_counter_ns()
        lib.fill(m, bm)
        times.append(time.perf_counter_ns() - t0)
        n_allowed.append(popcount(bm))
        special_allowed = max(special_allowed, sum(allowed(bm, s) for s in specials))
        if t is None:
            eos_ok = allowed(bm, EOS[0])
            break
        if not allowed(bm, t):
            bad += 1
        if not lib.consume(m, t):
            raise RuntimeError(f"{lib.name}: token {t} rejected")
    return times, bad, eos_ok, special_allowed, n_allowed


def rollback_check(lib, g, tokens, k=5, step=3):
    m = lib.matcher(g)
    bm_a, bm_b = lib.alloc(), lib.alloc()
    checks = mism = 0
    rb_ns = []
    for p in range(len(tokens)):
        if p % step == 0 and p + k <= len(tokens):
            lib.fill(m, bm_a)
            for t in tokens[p : p + k]:
                assert lib.consume(m, t)
            t0 = time.perf_counter_ns()
            lib.rollback(m, k)
            rb_ns.append(time.perf_counter_ns() - t0)
            lib.fill(m, bm_b)
            checks += 1
            mism += int(not np.array_equal(bm_a, bm_b))
        assert lib.consume(m, tokens[p])
    return {"checks": checks, "mismatches": mism, "rollback5_median_us": statistics.median(rb_ns) / 1000}


def run_lib(which: str) -> dict:
    from tokenizers import Tokenizer

    tok_json = open(TOK_PATH).read()
    hf = Tokenizer.from_str(tok_json)
    specials = [
        i
        for i in range(N_VOCAB)
        if hf.id_to_token(i).startswith("<")
        and hf.id_to_token(i) in {a.content for a in hf.get_added_tokens_decoder().values()}
        and i not in EOS
    ]
    t_import = time.perf_counter_ns()
    lib = LLG(tok_json) if which == "llg" else XGR(tok_json)
    out = {
        "lib": lib.name,
        "version": lib.version,
        "tok_init_ms": lib.tok_init_ns / 1e6,
        "compiler_init_ms": lib.compiler_init_ns / 1e6,
        "import_plus_init_ms": (time.perf_counter_ns() - t_import) / 1e6,
        "workloads": {},
    }
    for name, schema, inst in WORKLOADS:
        text = json.dumps(inst)
        tokens = hf.encode(text, add_special_tokens=False).ids
        t0 = time.perf_counter_ns()
        g = lib.compile(schema)
        cold_ns = time.perf_counter_ns() - t0
        rep = []
        for _ in range(COMPILE_REPEATS):
            t0 = time.perf_counter_ns()
            lib.compile(schema)
            rep.append(time.perf_counter_ns() - t0)
        cold_times, bad, eos_ok, sp, n_allowed = walk(lib, g, tokens, specials)
        warm = []
        for _ in range(WARM_PASSES):
            tt, bad2, _, sp2, _ = walk(lib, g, tokens, specials)
            warm += tt
            bad += bad2
            sp = max(sp, sp2)
        out["workloads"][name] = {
            "n_tokens": len(tokens),
            "text_chars": len(text),
            "compile_cold_ms": cold_ns / 1e6,
            "compile_repeat_median_ms": statistics.median(rep) / 1e6,
            "first_mask_us": cold_times[0] / 1000,
            "pass1": stats_us(cold_times),
            "warm": stats_us(warm),
            "tokens_disallowed_by_mask": bad,
            "eos_allowed_at_end": eos_ok,
            "max_non_eos_special_tokens_allowed": sp,
            "allowed_count_median": int(np.median(n_allowed)),
            "allowed_count_max": int(max(n_allowed)),
            "rollback": rollback_check(lib, g, tokens),
        }
    cov = {}
    for feat, schema, good, badv in COVERAGE:
        g, msg = lib.coverage_compile(schema)
        entry = {"compiles": g is not None, "message": msg[:400]}
        if g is not None:
            gt = hf.encode(json.dumps(good), add_special_tokens=False).ids
            bt = hf.encode(json.dumps(badv), add_special_tokens=False).ids
            entry["valid_accepted"] = lib.accepts(g, gt)
            entry["invalid_rejected"] = not lib.accepts(g, bt)
        cov[feat] = entry
    out["coverage"] = cov
    return out


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--lib":
        print(json.dumps(run_lib(sys.argv[2])))
        return
    import jsonschema

    for _, schema, inst in WORKLOADS:
        jsonschema.validate(inst, schema)
    for feat, schema, good, badv in COVERAGE:
        jsonschema.validate(good, schema)
        if "format" not in schema:  # jsonschema checks date-time only if rfc3339-validator is installed
            assert not jsonschema.Draft202012Validator(schema).is_valid(badv), feat
    res = {}
    for which in ("llg", "xgr"):
        p = subprocess.run([sys.executable, __file__, "--lib", which], capture_output=True, text=True)
        if p.returncode != 0:
            res[which] = {"error": p.stderr[-3000:]}
            continue
        res[which] = json.loads(p.stdout.strip().splitlines()[-1])
    json.dump(res, open(os.path.join(HERE, "results.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

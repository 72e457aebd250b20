"""Build the copy-heavy bench workloads, data/bench/workloads-v1.jsonl (issue 24, part 5).

Five kinds of chat request, each built from public text shipped on this machine: the CPython 3.11
standard library sources and the Python 3.11 documentation sources (Debian's `python3.11-doc`),
both PSF-licensed. Only files in the held-out split of `make_prompts.py` are used, so no prompt
shares a file with drafter training data.

- code_edit: a 20-60 line stdlib function and "rename variable x to y, return the whole function".
- quote_qa: 2-4 documentation paragraphs and a question to answer by quoting the passage.
- rewrite: 1-3 documentation paragraphs to rewrite plainly or to summarise.
- revision: a two-turn conversation, then "revise your last answer". The assistant's first answer is
  the original public text (the stdlib function, or the documentation paragraphs), not a model
  generation: the set needs no model to build and does not change when the model does.
- chat: open questions with no passage to copy from (topics from documentation section titles).

Records are {"id", "kind", "messages"}, as in prompts-v1.jsonl. The selection is deterministic
(sorted files, seeded shuffle): the same inputs give the same bytes. A changed file is a new
version (workloads-v2.jsonl), since the bench report pins the file's sha256.

Usage: python scripts/make_bench_workloads.py [--out data/bench/workloads-v1.jsonl] [--per-kind 8]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
from pathlib import Path

from make_prompts import DOCS, doc_paragraphs, doc_topics, heldout

STDLIB = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")
OUT = Path(__file__).resolve().parents[1] / "data" / "bench" / "workloads-v1.jsonl"
KINDS = ("code_edit", "quote_qa", "rewrite", "revision", "chat")
# Names too generic to make a meaningful rename request.
SKIP_NAMES = {"self", "cls", "_", "i", "j", "k", "x", "y", "args", "kwargs"}

CODE_EDIT = ("Rename the variable `{old}` to `{new}` in this function. Return the whole edited function "
             "in one Python code block.\n\n```python\n{code}\n```")
QUOTE_QA = ("Read the passage below, then answer the question by quoting the passage: copy the sentences "
            "that answer it word for word, in quotation marks.\n\nPassage:\n{text}\n\nQuestion: What does the "
            "passage say about {term}?")
REWRITE = (
    "Rewrite the following passage in plain English for a beginner. Keep every technical term and code "
    "name.\n\n{text}",
    "Summarise the following passage in a few sentences.\n\n{text}",
    "Edit the following passage so that it reads more clearly. Keep its meaning and all code names, and "
    "return the whole edited passage.\n\n{text}",
)
REVISE_CODE = ("Revise your last answer: add type hints to the function's parameters and return value. "
               "Give the whole revised function again.")
REVISE_PROSE = ("Revise your last answer so that a beginner can follow it. Keep its structure and give the "
                "whole revised answer.")
CHAT = ("What is {topic}?", "Can you explain {topic} to a beginner?", "Give me an example of {topic}.",
        "Why would I use {topic}?", "Tell me about {topic}.")


def renamable(func: ast.FunctionDef) -> list[str]:
    """Local names (parameters or assigned names) used at least 3 times in the function, most used first."""
    counts: dict[str, int] = {}
    assigned = {a.arg for a in func.args.args + func.args.kwonlyargs}
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            counts[node.id] = counts.get(node.id, 0) + 1
            if isinstance(node.ctx, ast.Store):
                assigned.add(node.id)
    names = [n for n in assigned if counts.get(n, 0) >= 3 and n not in SKIP_NAMES and len(n) >= 2]
    return sorted(names, key=lambda n: (-counts[n], n))


def new_name(old: str) -> str:
    """A plausible new name for `old` that does not occur in ordinary code by accident."""
    base = old.strip("_")
    return f"{base}_item" if base.endswith("value") else f"{base}_value"


def stdlib_functions(root: Path) -> list[tuple[str, str, ast.FunctionDef]]:
    """(module path, source, node) of every 20-60 line top-level or method function in held-out files."""
    skip = ("test", "idlelib", "site-packages", "lib2to3", "turtledemo", "tkinter", "ensurepip")
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in skip for part in rel.parts) or not heldout(path):
            continue
        try:
            source = path.read_text()
            tree = ast.parse(source)
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 20 <= node.end_lineno - node.lineno + 1 <= 60:
                out.append((str(rel), source, node))
    return out


def dedented_source(source: str, node: ast.FunctionDef) -> str:
    """The function's source lines, with a method's indentation removed."""
    lines = source.splitlines()[node.lineno - 1 - len(node.decorator_list): node.end_lineno]
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def doc_passages(docs: Path, lo: int, hi: int, max_paras: int) -> list[tuple[str, str, list[str]]]:
    """(file, topic, paragraphs) runs of up to `max_paras` consecutive paragraphs, lo..hi characters."""
    out = []
    for path in sorted(docs.rglob("*.rst.txt")):
        if not heldout(path):
            continue
        paras, topics = doc_paragraphs(path), doc_topics(path)
        topic = topics[0] if topics else path.stem.split(".")[0]
        for start in range(0, len(paras), max_paras):
            group = paras[start:start + max_paras]
            if lo <= sum(map(len, group)) <= hi:
                out.append((str(path.relative_to(docs)), topic, group))
    return out


def literal_term(text: str) -> str | None:
    """A code name the passage mentions (an rST ``literal`` or :role:`target`), to ask about."""
    terms = re.findall(r"``([A-Za-z_][\w.]{2,40})``|:\w+:`~?([A-Za-z_][\w.]{2,40})`", text)
    names = [a or b for a, b in terms]
    return f"`{names[0]}`" if names else None


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def code_edits(funcs, rng: random.Random, n: int) -> list[list[dict]]:
    """Rename requests on functions that have a name worth renaming."""
    out = []
    for _, source, node in rng.sample(funcs, len(funcs)):
        names = renamable(node)
        if names:
            old = names[0]
            out.append([user(CODE_EDIT.format(old=old, new=new_name(old), code=dedented_source(source, node)))])
        if len(out) == n:
            break
    return out


def quoting(passages, rng: random.Random, n: int) -> list[list[dict]]:
    """Passages of 2-4 paragraphs that mention a code name, with a question about that name."""
    out = []
    for _, _, paras in rng.sample(passages, len(passages)):
        text = "\n\n".join(paras)
        term = literal_term(text)
        if term and len(paras) >= 2:
            out.append([user(QUOTE_QA.format(text=text, term=term))])
        if len(out) == n:
            break
    return out


def rewrites(passages, rng: random.Random, n: int) -> list[list[dict]]:
    """Rewrite, summarise and edit requests, in turn, on 1-3 paragraph passages."""
    chosen = rng.sample(passages, n)
    return [[user(REWRITE[i % len(REWRITE)].format(text="\n\n".join(p)))] for i, (_, _, p) in enumerate(chosen)]


def revisions(funcs, passages, rng: random.Random, n: int) -> list[list[dict]]:
    """Two-turn conversations ending in "revise your last answer", code and prose alternating.

    The first answer is the original text: a stdlib function, or documentation paragraphs."""
    code = rng.sample(funcs, n)
    prose = rng.sample(passages, n)
    out = []
    for i in range(n):
        if i % 2 == 0:
            module, source, node = code[i]
            first = user(f"Write the `{node.name}` function from Python's `{module}`.")
            answer = "```python\n" + dedented_source(source, node) + "\n```"
            out.append([first, {"role": "assistant", "content": answer}, user(REVISE_CODE)])
        else:
            _, topic, paras = prose[i]
            first = user(f"Explain {topic}.")
            out.append([first, {"role": "assistant", "content": "\n\n".join(paras)}, user(REVISE_PROSE)])
    return out


def chats(docs: Path, rng: random.Random, n: int) -> list[list[dict]]:
    """Open questions on documentation section titles: nothing in the prompt to copy."""
    topics = sorted({t for p in sorted(docs.rglob("*.rst.txt")) if heldout(p) for t in doc_topics(p)})
    return [[user(CHAT[i % len(CHAT)].format(topic=t))] for i, t in enumerate(rng.sample(topics, n))]


def build(stdlib: Path, docs: Path, per_kind: int, seed: int) -> list[dict]:
    """Every workload record, kinds interleaved in file order by kind then index."""
    rng = random.Random(seed)
    funcs = stdlib_functions(stdlib)
    # Character bounds keep prompts near 300-1500 tokens of SmolLM2's tokenizer (about 3.5 chars a token).
    quote_passages = doc_passages(docs, 1200, 4500, 4)
    rewrite_passages = doc_passages(docs, 900, 3000, 3)
    revise_passages = doc_passages(docs, 700, 2200, 2)
    by_kind = {
        "code_edit": code_edits(funcs, rng, per_kind),
        "quote_qa": quoting(quote_passages, rng, per_kind),
        "rewrite": rewrites(rewrite_passages, rng, per_kind),
        "revision": revisions(funcs, revise_passages, rng, per_kind),
        "chat": chats(docs, rng, per_kind),
    }
    records = []
    for kind in KINDS:
        if len(by_kind[kind]) < per_kind:
            raise SystemExit(f"only {len(by_kind[kind])} {kind} prompts could be built, {per_kind} asked")
        records += [{"id": f"{kind}-{i + 1}", "kind": kind, "messages": m} for i, m in enumerate(by_kind[kind])]
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--stdlib", type=Path, default=STDLIB)
    ap.add_argument("--docs", type=Path, default=DOCS)
    ap.add_argument("--per-kind", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for need, hint in ((args.stdlib, "--stdlib DIR (CPython 3.11 Lib)"), (args.docs, "python3.11-doc")):
        if not need.is_dir():
            raise SystemExit(f"{need} not found: pass or install {hint}")
    records = build(args.stdlib, args.docs, args.per_kind, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"wrote {args.out}: {len(records)} prompts, {args.per_kind} per kind ({', '.join(KINDS)})")


if __name__ == "__main__":
    main()

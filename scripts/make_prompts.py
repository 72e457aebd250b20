"""Build the offline prompt sets for drafter training and held-out evaluation.

Sources (both PSF-licensed, both offline): the Python 3.11 documentation sources from Debian's
`python3.11-doc` and the CPython standard library of the running interpreter. Files are split into
train / held-out by a hash of their path, so no held-out prompt shares a file with training data.

Writes JSONL files of {"messages": [{"role": "user", "content": ...}], "kind": ...} into OUT:
train.jsonl, heldout_docs.jsonl, heldout_code.jsonl, heldout_chat.jsonl.

Usage: python scripts/make_prompts.py OUT [--docs DIR] [--max-train N]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import re
import sysconfig
from pathlib import Path

DOCS = Path("/usr/share/doc/python3.11/html/_sources")
DOC_TEMPLATES = [
    "Explain this passage from the Python documentation in simple terms:\n\n{text}",
    "Summarize the following documentation text in a few sentences:\n\n{text}",
    "Continue the following documentation text:\n\n{text}",
]
CODE_TEMPLATES = [
    "Explain what this Python function does:\n\n```python\n{text}\n```",
    "Write a short docstring for this Python function:\n\n```python\n{text}\n```",
    "Rewrite this Python function with clearer variable names:\n\n```python\n{text}\n```",
]
CHAT_TEMPLATES = [
    "What is {topic}?", "Can you explain {topic} to a beginner?", "Give me an example of {topic}.",
    "Why would I use {topic}?", "Tell me about {topic}.",
]


def heldout(path: Path) -> bool:
    """Deterministic 1-in-10 split by file path."""
    return hashlib.sha1(str(path).encode()).digest()[0] % 10 == 0


def doc_paragraphs(path: Path) -> list[str]:
    text = path.read_text(errors="ignore")
    paras = [p.strip() for p in re.split(r"\n\s*\n", text)]
    return [p for p in paras if 200 <= len(p) <= 1200 and not p.startswith(("..", "==", "--", "**"))]


def doc_topics(path: Path) -> list[str]:
    lines = path.read_text(errors="ignore").splitlines()
    out = []
    for a, b in zip(lines, lines[1:]):
        if b and set(b) <= set("=-~^*") and len(b) >= len(a) > 6 and not a.startswith(":"):
            topic = re.sub(r"[:`*]|\b(module|class|function)\b", "", a).strip()
            if 6 < len(topic) < 60:
                out.append(topic)
    return out


def code_functions(path: Path) -> list[str]:
    try:
        source = path.read_text(errors="ignore")
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    funcs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            seg = ast.get_source_segment(source, node)
            if seg and 200 <= len(seg) <= 1500:
                funcs.append(seg)
    return funcs


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "site-packages", "lib2to3", "turtledemo", "tkinter")
    return sorted(p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts))


def message(text: str, kind: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "kind": kind}


def build(docs: Path, rng: random.Random) -> dict[str, list[dict]]:
    sets: dict[str, list[dict]] = {"train": [], "heldout_docs": [], "heldout_code": [], "heldout_chat": []}
    for path in sorted(docs.rglob("*.rst.txt")):
        split = heldout(path)
        for para in doc_paragraphs(path):
            item = message(rng.choice(DOC_TEMPLATES).format(text=para), "docs")
            sets["heldout_docs" if split else "train"].append(item)
        for topic in doc_topics(path):
            item = message(rng.choice(CHAT_TEMPLATES).format(topic=topic), "chat")
            sets["heldout_chat" if split else "train"].append(item)
    for path in stdlib_files():
        split = heldout(path)
        for func in code_functions(path):
            item = message(rng.choice(CODE_TEMPLATES).format(text=func), "code")
            sets["heldout_code" if split else "train"].append(item)
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=Path, default=DOCS)
    ap.add_argument("--max-train", type=int, default=6000)
    ap.add_argument("--max-heldout", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not args.docs.is_dir():
        raise SystemExit(f"{args.docs} not found: install Debian's python3.11-doc (apt-get install python3.11-doc)")
    rng = random.Random(args.seed)
    sets = build(args.docs, rng)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, items in sets.items():
        rng.shuffle(items)
        items = items[: args.max_train if name == "train" else args.max_heldout]
        with open(args.out / f"{name}.jsonl", "w") as fh:
            for item in items:
                fh.write(json.dumps(item) + "\n")
        kinds = {k: sum(1 for i in items if i["kind"] == k) for k in ("docs", "code", "chat")}
        print(f"{name}: {len(items)} prompts {kinds}")


if __name__ == "__main__":
    main()

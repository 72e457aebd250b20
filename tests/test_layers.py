"""Import direction: server -> engine.api / engine.client only; nothing in engine imports web code."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED_FROM_SERVER = {"engine", "engine.api", "engine.client"}
WEB = ("fastapi", "pydantic", "starlette", "sse_starlette", "uvicorn", "pydantic_settings")


def imports(path: Path) -> set[str]:
    """Absolute module names imported by a Python file."""
    source = path.read_text()
    try:
        tree = ast.parse(source, filename=str(path))
    except SystemError:
        # CPython 3.11's AST constructor keeps one recursion counter per interpreter: an ast.parse
        # in another thread of this worker at the same moment can make this one fail spuriously
        # (CPython gh-106905; seen once in the suite). The file itself is fine: parse it again.
        tree = ast.parse(source, filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if node.module == "engine")
    return names


def files(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def test_engine_has_no_web_imports():
    """No fastapi / pydantic / starlette / uvicorn import anywhere in engine/."""
    bad = [(p.name, m) for p in files("engine") for m in imports(p) if m.split(".")[0] in WEB]
    assert bad == []


def test_engine_never_imports_server_or_cli():
    """engine/ does not import server/ or dspark_cli/ (imports go one way)."""
    bad = [(p.name, m) for p in files("engine") for m in imports(p) if m.split(".")[0] in ("server", "dspark_cli")]
    assert bad == []


def test_server_uses_only_engine_api_and_client():
    """server/ imports engine.api and engine.client, nothing deeper."""
    bad = [(str(p.relative_to(ROOT)), m) for p in files("server") for m in imports(p)
           if m.split(".")[0] == "engine" and m not in ALLOWED_FROM_SERVER
           and not any(m.startswith(a + ".") for a in ("engine.api", "engine.client"))]
    assert bad == []


def test_clients_and_loadtest_are_http_only():
    """clients/ and loadtest/ never import engine or server."""
    bad = [(p.name, m) for d in ("clients", "loadtest") for p in files(d) for m in imports(p)
           if m.split(".")[0] in ("engine", "server", "dspark_cli")]
    assert bad == []

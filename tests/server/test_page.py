"""The chat page's server side, in-process over the fake engine: `/` and its files are served (and
shipped in the package), `--no-ui` removes them, they need no API key while the API still does, the
Host guard still applies, and the `dspark` extensions the page uses: `token_origins` is off by default
(no field at all) and lists every token once when on; `baseline` reaches the engine request.

The same extensions on the real engine (drafts really accepted) are checked in test_page_browser.py.
"""

from __future__ import annotations

import httpx
import pytest

from server.app import create_app
from server.routes.ui import FILES, STATIC_DIR
from tests.server.conftest import CHAT, COMPLETIONS, chat_body, settings, sse_data
from tests.server.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

PAGE_PATHS = ["/", *(f"/ui/{name}" for name in FILES)]


def _client(engine: FakeEngine | None = None, **overrides) -> httpx.AsyncClient:
    app = create_app(settings(**overrides), engine or FakeEngine())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def test_static_files_exist():
    """Every file the routes serve is in the package directory (package data, see pyproject.toml)."""
    for name in ["index.html", *FILES]:
        assert (STATIC_DIR / name).is_file(), name


async def test_page_and_files_served_with_a_strict_policy():
    """/ is the HTML page; its scripts and styles come with their types, a CSP allowing only this
    origin and nosniff; an unknown file name is a 404 (nothing else in the directory is reachable)."""
    async with _client() as c:
        page = await c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/ui/app.js"' in page.text and "http" not in page.text.split("<body>")[0].replace(
            "http-equiv", "")  # no external resource in the head
        for name, media_type in FILES.items():
            r = await c.get(f"/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(media_type), name
            assert "script-src 'self'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
        for missing in ("/ui/index.html.bak", "/ui/..%2Fapp.py", "/ui/"):
            assert (await c.get(missing)).status_code == 404, missing


async def test_no_ui_turns_the_page_off():
    """`--no-ui` (ui=False): / and the files are 404s; the API is unchanged."""
    async with _client(ui=False) as c:
        for path in PAGE_PATHS:
            assert (await c.get(path)).status_code == 404, path
        assert (await c.get("/v1/models")).status_code == 200


async def test_page_needs_no_key_but_the_api_does():
    """With --api-key the page and its files load without a key; the API and /metrics still need it."""
    async with _client(api_key="sekret") as c:
        for path in PAGE_PATHS:
            assert (await c.get(path)).status_code == 200, path
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.post(CHAT, json=chat_body())).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer sekret"})).status_code == 200
        # Only the page's own names are open: a look-alike path still needs the key.
        assert (await c.get("/ui/other.js")).status_code == 401


async def test_host_guard_covers_the_page():
    """A DNS-rebinding Host is refused on the page as on the API (421)."""
    async with _client() as c:
        assert (await c.get("/", headers={"Host": "evil.example"})).status_code == 421
        assert (await c.get("/ui/app.js", headers={"Host": "evil.example"})).status_code == 421


async def test_token_origins_off_by_default():
    """Without the extension no chunk and no reply carries `dspark_tokens`, and nothing is decoded."""
    engine = FakeEngine()
    decoded: list[list[int]] = []
    real_decode = engine.decode
    engine.decode = lambda ids: decoded.append(ids) or real_decode(ids)  # type: ignore[method-assign]
    async with _client(engine) as c:
        streamed = await c.post(CHAT, json=chat_body(stream=True))
        reply = await c.post(CHAT, json=chat_body())
        completion = await c.post(COMPLETIONS, json={"prompt": "hi", "stream": True})
    chunks = [d for d in sse_data(streamed.text) + sse_data(completion.text) if isinstance(d, dict)]
    assert chunks and all("dspark_tokens" not in chunk for chunk in chunks)
    assert "dspark_tokens" not in reply.json() and decoded == []


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_token_origins_list_every_token_once(path):
    """With `dspark.token_origins`, the chunks together list every generated token once, in order,
    with its text and origin; the drafts among them are the accepted drafts of `dspark_stats`."""
    engine = FakeEngine()
    body = chat_body(stream=True) if path == CHAT else {"prompt": "hi", "stream": True}
    async with _client(engine) as c:
        r = await c.post(path, json={**body, "dspark": {"token_origins": True},
                                     "stream_options": {"include_usage": True}})
        plain = await c.post(path, json={**body, "stream": False, "dspark": {"token_origins": True}})
    chunks = [d for d in sse_data(r.text) if isinstance(d, dict)]
    tokens = [t for chunk in chunks for t in chunk.get("dspark_tokens", [])]
    stats = next(chunk["dspark_stats"] for chunk in chunks if "dspark_stats" in chunk)
    usage = next(chunk["usage"] for chunk in chunks if chunk.get("usage"))
    assert len(tokens) == usage["completion_tokens"] == stats["generated_tokens"]
    assert sum(t["origin"] == "draft" for t in tokens) == stats["accepted_tokens"]
    assert [t["id"] for t in tokens] == list(range(100, 100 + len(tokens)))  # the fake's ids, in order
    assert all(t["text"] == engine.decode([t["id"]]) for t in tokens)
    # A round's drafts come first, then the target's token: a round never ends with a draft.
    assert tokens[-1]["origin"] == "target" and "draft" in {t["origin"] for t in tokens}
    assert plain.json()["dspark_tokens"] == tokens


async def test_baseline_extension_reaches_the_engine():
    """`dspark.baseline` asks the engine for plain decoding of that request only."""
    engine = FakeEngine()
    async with _client(engine) as c:
        await c.post(CHAT, json=chat_body(dspark={"baseline": True}))
        await c.post(CHAT, json=chat_body())
    assert [r.baseline for r in engine.submitted] == [True, False]

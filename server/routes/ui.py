"""GET / (the chat page) and GET /ui/* (its static files), unless `--no-ui`.

The files ship in the package (server/static/): no build step, no CDN, nothing fetched at run time.
They need no API key (the page asks for it and sends it on its API calls); the Host guard and CORS
apply as to every route. Every reply carries a strict Content-Security-Policy: scripts, styles and
connections from this origin only, no inline script, no framing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
PREFIX = "/ui/"
# The page's files, by URL name: nothing else under STATIC_DIR is served (no directory walking).
FILES = {"app.js": "text/javascript", "markdown.js": "text/javascript", "style.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    """The chat page."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=SECURITY_HEADERS)


@router.get(PREFIX + "{name}")
async def static_file(name: str) -> FileResponse:
    """One of the page's scripts or its style sheet; 404 for any other name."""
    media_type = FILES.get(name)
    if media_type is None:
        raise HTTPException(status_code=404)
    return FileResponse(STATIC_DIR / name, media_type=media_type, headers=SECURITY_HEADERS)


def is_page_path(path: str) -> bool:
    """Whether `path` is the page or one of its files (served without an API key)."""
    return path == "/" or (path.startswith(PREFIX) and path[len(PREFIX):] in FILES)

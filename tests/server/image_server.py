"""Test images, and a small HTTP server on 127.0.0.1 that serves them (and misbehaves on request).

Loopback only: the image-fetch tests run it with `allow_private`, and the guard tests check that, without
that flag, it is never reached.
"""

from __future__ import annotations

import base64
import contextlib
import io
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

STALL_S = 3.0  # how long /stall waits before answering: far past the tests' fetch timeout


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (4, 3), color: str = "red") -> bytes:
    """A small real image in `fmt`."""
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=fmt)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    """`data` as a base64 data: URL."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` pixels and that holds no pixel data (a bomb's header)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


PNG = image_bytes()


class ImageServer:
    """What the server was asked (paths, Host headers), and its base URL."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.paths: list[str] = []
        self.hosts: list[str] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def _handler(state: ImageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes, content_type: str = "image/png", length: bool = True,
                  **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            if length:
                self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (the http.server API)
            state.paths.append(self.path)
            state.hosts.append(self.headers.get("Host", ""))
            route = self.path.split("?")[0]
            if route == "/ok.png":
                self._send(200, PNG)
            elif route == "/octet":
                self._send(200, PNG, content_type="application/octet-stream")
            elif route == "/big":  # no Content-Length: the cap is hit while streaming
                self.close_connection = True
                self._send(200, b"\0" * 200_000, length=False)
            elif route == "/big-declared":
                self._send(200, b"\0" * 200_000)
            elif route == "/page.html":
                self._send(200, b"<html>not an image</html>", content_type="text/html")
            elif route == "/text.png":
                self._send(200, b"not really a png", content_type="image/png")
            elif route == "/missing.png":
                self._send(404, b"no", content_type="text/plain")
            elif route == "/redirect":
                self._send(302, b"", Location="/ok.png")
            elif route == "/loop":
                self._send(302, b"", Location="/loop")
            elif route == "/to-file":
                self._send(302, b"", Location="file:///etc/passwd")
            elif route == "/stall":
                time.sleep(STALL_S)
                self._send(200, PNG)
            else:
                self._send(404, b"", content_type="text/plain")

    return Handler


@contextlib.contextmanager
def image_server() -> Iterator[ImageServer]:
    """Serve the test routes on a free loopback port for the duration of the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    state = ImageServer(server)
    server.RequestHandlerClass = _handler(state)
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()

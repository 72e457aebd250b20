"""An image URL of a request -> the `ImageInput` the engine takes (one job: get the bytes and vouch for them).

- `data:` URLs: base64 (or percent-encoded) bytes of a declared image type (PNG, JPEG, WebP, GIF, BMP).
- `http(s)` URLs: fetched with httpx behind the SSRF guard (`server.netguard`: scheme and address
  checked before any connection, the connection pinned to the checked address, each redirect hop
  checked again), without proxies from the environment, streamed and stopped past `max_bytes`, the
  whole fetch bounded by `timeout_s`, and the answer's content type checked.
- Either way the bytes must open as one of those formats with Pillow (no other decoder is tried) and
  hold at most `max_pixels` pixels (a decompression-bomb guard, checked from the header before
  decoding), then decode fully. `media_type` is the format Pillow found, whatever was declared.

Every failure is an `ImageError` whose message is written for the client; the caller names the
content part. Fetching and decoding never block the event loop (decoding runs in a worker thread).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import urllib.parse
import warnings
from dataclasses import dataclass

import httpx
from PIL import Image

from engine.api import ImageInput
from server import netguard
from server.netguard import Resolver, URLRefused

# Pillow format -> the media type reported to the engine. Only these decoders are ever tried, so a
# payload cannot reach Pillow's rarer plugins (EPS would even start Ghostscript).
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
# Content types accepted as declared (by a data: URL or an HTTP answer).
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/jpg", "image/pjpeg", "image/webp", "image/gif",
                         "image/bmp", "image/x-bmp", "image/x-ms-bmp"})
# An HTTP answer may also say only "bytes" (or nothing): Pillow then decides what they are.
GENERIC_TYPES = frozenset({"", "application/octet-stream", "binary/octet-stream"})
SUPPORTED = "PNG, JPEG, WebP, GIF or BMP"
USER_AGENT = "dspark-serve (image fetch)"


@dataclass(frozen=True)
class ImageLimits:
    """What one image may cost (server/settings.py has the defaults and the flags)."""

    max_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 10.0
    max_pixels: int = 50_000_000
    allow_private: bool = False  # fetch from loopback and private addresses too (--allow-private-image-urls)
    max_redirects: int = 5


class ImageError(ValueError):
    """The URL does not give an acceptable image; the message says why, in words for the client."""


async def load_image(url: str, limits: ImageLimits, *, resolver: Resolver = netguard.system_resolver,
                     transport: httpx.AsyncBaseTransport | None = None) -> ImageInput:
    """The checked image behind `url` (a data: or http(s) URL). Raises ImageError.

    `resolver` and `transport` are for tests (a stub resolver, a recording transport); by default the
    system resolver and httpx's own connections are used.
    """
    if url[:5].lower() == "data:":
        data = await asyncio.to_thread(decode_data_url, url, limits.max_bytes)
    else:
        data = await fetch(url, limits, resolver, transport)
    media_type = await asyncio.to_thread(verify_image, data, limits.max_pixels)
    return ImageInput(data=data, digest=hashlib.sha256(data).hexdigest(), media_type=media_type)


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """The bytes of a `data:<image type>[;base64],<data>` URL of at most `max_bytes`."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise ImageError("the data: URL has no ',' before its data")
    params = [p.strip().lower() for p in header.split(";")]
    declared, is_base64 = params[0], "base64" in params[1:]
    if declared not in IMAGE_TYPES:
        raise ImageError(f"the data: URL declares {declared or 'no media type'!r}, not an image type; send "
                         f"{SUPPORTED} as data:image/<type>;base64,...")
    if (len(payload) * 3 // 4 if is_base64 else len(payload) // 3) > max_bytes:  # known too big before decoding
        raise too_large(max_bytes)
    try:
        data = base64.b64decode("".join(payload.split()), validate=True) if is_base64 else \
            urllib.parse.unquote_to_bytes(payload)
    except (binascii.Error, ValueError):
        raise ImageError("the data: URL's base64 data is not valid base64") from None
    if len(data) > max_bytes:
        raise too_large(max_bytes)
    if not data:
        raise ImageError("the data: URL holds no data")
    return data


def verify_image(data: bytes, max_pixels: int) -> str:
    """The media type of `data` once it decoded as one of FORMATS with at most `max_pixels` pixels (blocking)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap applies below
            with Image.open(io.BytesIO(data), formats=list(FORMATS)) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise ImageError(f"the image has {width}x{height} pixels, more than the server's limit of "
                                     f"{max_pixels} (--image-max-pixels)")
                image.load()
                return FORMATS[image.format or ""]
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError(f"the image has more pixels than the server's limit of {max_pixels}") from None
    except Exception:  # whatever a decoder raises on a broken file (OSError, SyntaxError, struct.error, ...)
        raise ImageError(f"the data is not a decodable image; send {SUPPORTED}") from None


def too_large(max_bytes: int) -> ImageError:
    """The error for an image over the size limit."""
    return ImageError(f"the image is larger than the server's limit of {max_bytes} bytes (--image-max-bytes)")


async def fetch(url: str, limits: ImageLimits, resolver: Resolver,
                transport: httpx.AsyncBaseTransport | None) -> bytes:
    """The body of an http(s) image URL, within the limits and behind the guard."""
    try:
        target = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ImageError("the image URL is not a valid URL") from None
    # trust_env=False: no proxy from the environment, which would connect to what the guard never checked.
    client = httpx.AsyncClient(transport=transport, trust_env=False, follow_redirects=False,
                               timeout=limits.timeout_s, headers={"User-Agent": USER_AGENT})
    try:
        async with client, asyncio.timeout(limits.timeout_s):
            return await _follow(client, target, limits, resolver)
    except TimeoutError:
        raise ImageError(f"fetching the image took longer than {limits.timeout_s:g} s (--image-timeout)") from None
    except URLRefused as exc:
        raise ImageError(f"the image URL is refused: {exc}") from None
    except httpx.HTTPError as exc:  # connection refused, TLS failure, broken answer: the class says enough
        raise ImageError(f"the image could not be fetched ({type(exc).__name__})") from None


async def _follow(client: httpx.AsyncClient, url: httpx.URL, limits: ImageLimits, resolver: Resolver) -> bytes:
    """GET `url`, following up to `max_redirects` redirects, each hop checked by the guard first."""
    for _ in range(limits.max_redirects + 1):
        address = await netguard.checked_address(url, resolver, limits.allow_private)
        response = await client.send(netguard.pinned_request(client, url, address), stream=True)
        try:
            location = response.headers.get("location")
            if response.is_redirect and location:
                url = url.join(location)
                continue
            _check_answer(response)
            return await _read_capped(response, limits.max_bytes)
        finally:
            await response.aclose()
    raise ImageError(f"the image URL redirects more than {limits.max_redirects} times")


def _check_answer(response: httpx.Response) -> None:
    """A 2xx answer whose content type may be an image."""
    if not response.is_success:
        raise ImageError(f"the image URL answered HTTP {response.status_code}")
    declared = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if declared not in IMAGE_TYPES and declared not in GENERIC_TYPES:
        raise ImageError(f"the image URL answered with content type {declared[:100]!r}, not {SUPPORTED}")


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    """The (decompressed) body, stopped as soon as it is known to exceed `max_bytes`."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise too_large(max_bytes)
    return bytes(body)

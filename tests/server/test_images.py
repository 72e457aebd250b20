"""server/images.py and server/netguard.py: data URLs, the SSRF guard, fetching within limits, the image check.

Nothing here leaves the machine: guard tests use a stub resolver and a recording transport and assert
that a refused URL reached neither; fetch tests talk to a server on 127.0.0.1 (with `allow_private`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import time

import httpx
import pytest

from server import netguard
from server.images import ImageError, ImageLimits, decode_data_url, load_image, verify_image
from tests.server.image_server import PNG, data_url, image_bytes, image_server, png_header_only

pytestmark = pytest.mark.anyio

LIMITS = ImageLimits(max_bytes=100_000, timeout_s=5.0, max_pixels=1_000_000)
LOCAL = ImageLimits(max_bytes=100_000, timeout_s=0.5, max_pixels=1_000_000, allow_private=True)


class Recorder:
    """A stub resolver (name -> addresses) and a transport that records what would have been sent."""

    def __init__(self, names: dict[str, list[str]] | None = None, answer=None) -> None:
        self.names = names or {}
        self.lookups: list[tuple[str, int]] = []
        self.sent: list[httpx.Request] = []
        self.answer = answer or (lambda request: httpx.Response(200, content=PNG,
                                                                headers={"Content-Type": "image/png"}))
        self.transport = httpx.MockTransport(self._handle)

    async def resolve(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        return list(self.names.get(host, []))

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return self.answer(request)

    async def load(self, url: str, limits: ImageLimits = LIMITS):
        return await load_image(url, limits, resolver=self.resolve, transport=self.transport)


# ---- data: URLs and the image check ------------------------------------------------------------------


async def test_data_url_png():
    image = await load_image(data_url(PNG), LIMITS)
    assert image.data == PNG and image.media_type == "image/png"
    assert image.digest == hashlib.sha256(PNG).hexdigest()


@pytest.mark.parametrize("fmt,media_type", [("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif"),
                                            ("BMP", "image/bmp")])
async def test_data_url_formats(fmt, media_type):
    image = await load_image(data_url(image_bytes(fmt), media_type), LIMITS)
    assert image.media_type == media_type


async def test_media_type_is_what_the_bytes_are():
    """A PNG declared as JPEG is reported as the PNG it is."""
    assert (await load_image(data_url(PNG, "image/jpeg"), LIMITS)).media_type == "image/png"


def test_data_url_percent_encoded():
    assert decode_data_url("data:image/png,%89PNG", 100) == b"\x89PNG"


@pytest.mark.parametrize("url,words", [
    ("data:image/png;base64", "no ','"),
    ("data:text/plain;base64,aGVsbG8=", "not an image type"),
    ("data:;base64,aGVsbG8=", "no media type"),
    ("data:image/svg+xml;base64,PHN2Zy8+", "not an image type"),
    ("data:image/png;base64,!!!notbase64", "not valid base64"),
    ("data:image/png;base64,", "no data"),
    ("data:image/png;base64,aGVsbG8gd29ybGQ=", "not a decodable image"),
    (data_url(PNG[: len(PNG) // 2]), "not a decodable image"),
    (data_url(image_bytes("TIFF"), "image/png"), "not a decodable image"),  # a format outside the list
])
async def test_bad_data_urls(url, words):
    with pytest.raises(ImageError, match=words):
        await load_image(url, LIMITS)


async def test_oversized_data_url():
    with pytest.raises(ImageError, match="larger than the server's limit of 100 bytes"):
        await load_image(data_url(image_bytes(size=(64, 64), color="blue") + b"\0" * 200), ImageLimits(max_bytes=100))


async def test_pixel_cap():
    with pytest.raises(ImageError, match="400x300 pixels, more than the server's limit of 1000"):
        await load_image(data_url(image_bytes(size=(400, 300))), ImageLimits(max_pixels=1000))


@pytest.mark.parametrize("size", [(100_000, 100_000), (30_000, 30_000)])
async def test_decompression_bomb_header_is_refused_before_decoding(size):
    """A header claiming billions of pixels is refused from the header (Pillow's own guard or ours)."""
    started = time.monotonic()
    with pytest.raises(ImageError, match="pixels"):
        verify_image(png_header_only(*size), 50_000_000)
    assert time.monotonic() - started < 5


# ---- the guard: refused before any lookup or connection -------------------------------------------------


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://example.com/",
                                 "javascript:alert(1)", "//example.com/a.png", "example.com/a.png"])
async def test_other_schemes_are_refused(url):
    rec = Recorder()
    with pytest.raises(ImageError, match="refused|not a valid URL"):
        await rec.load(url, LOCAL)  # even with private addresses allowed
    assert rec.lookups == [] and rec.sent == []


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/a.png", "http://127.8.9.10/", "http://localhost.:80@127.0.0.1/", "http://0.0.0.0/",
    "http://10.1.2.3/", "http://172.16.0.1/", "http://172.31.255.254/", "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/", "http://100.64.0.1/", "http://224.0.0.1/", "http://240.0.0.1/",
    "http://255.255.255.255/", "http://[::1]/", "http://[::]/", "http://[fc00::1]/", "http://[fd12:3456::1]/",
    "http://[fe80::1]/", "http://[ff02::1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:10.0.0.1]/",
    "http://[::ffff:169.254.169.254]/", "http://[2002:7f00:1::]/", "http://[::127.0.0.1]/",
    "http://2130706433/", "http://0x7f000001/", "http://0x7f.1/", "http://127.1/", "http://017700000001/",
    "https://10.0.0.1:8443/a.png",
])
async def test_private_addresses_are_refused_before_connecting(url):
    rec = Recorder()
    with pytest.raises(ImageError, match="refused"):
        await rec.load(url)
    assert rec.lookups == [] and rec.sent == []


@pytest.mark.parametrize("addresses", [["10.0.0.5"], ["127.0.0.1"], ["169.254.169.254"], ["::1"],
                                       ["::ffff:192.168.0.1"], ["93.184.216.34", "10.0.0.5"], []])
async def test_a_name_is_checked_by_every_address_it_resolves_to(addresses):
    """A public-looking name whose resolver answers a private address (one of several is enough) is refused."""
    rec = Recorder({"images.example.com": addresses})
    with pytest.raises(ImageError, match="refused"):
        await rec.load("https://images.example.com/cat.png")
    assert rec.lookups == [("images.example.com", 443)] and rec.sent == []


async def test_a_public_name_is_fetched_from_the_checked_address():
    """The connection goes to the address that was checked; Host and the TLS name stay the URL's."""
    rec = Recorder({"images.example.com": ["93.184.216.34"]})
    image = await rec.load("https://images.example.com:8443/cat.png?x=1")
    assert image.data == PNG and rec.lookups == [("images.example.com", 8443)]
    (request,) = rec.sent
    assert str(request.url) == "https://93.184.216.34:8443/cat.png?x=1"
    assert request.headers["Host"] == "images.example.com:8443"
    assert request.extensions["sni_hostname"] == "images.example.com"


async def test_a_redirect_to_a_private_address_is_refused():
    """Each hop is checked: the redirect target is refused before anything connects to it."""
    rec = Recorder({"cdn.example.com": ["93.184.216.34"], "internal.example.com": ["10.0.0.7"]})
    for target in ("http://169.254.169.254/latest/meta-data/", "http://internal.example.com/a.png",
                   "file:///etc/passwd"):
        rec.sent.clear()
        rec.answer = lambda request, target=target: httpx.Response(302, headers={"Location": target})
        with pytest.raises(ImageError, match="refused"):
            await rec.load("https://cdn.example.com/a.png")
        assert [r.url.host for r in rec.sent] == ["93.184.216.34"]


async def test_allow_private_lets_private_addresses_through():
    rec = Recorder({"nas.lan": ["192.168.1.20"]})
    assert (await rec.load("http://nas.lan/a.png", LOCAL)).data == PNG
    assert rec.sent[0].url.host == "192.168.1.20" and rec.sent[0].headers["Host"] == "nas.lan"


async def test_unresolvable_host():
    async def fails(host, port):
        raise OSError("no such host")
    with pytest.raises(ImageError, match="could not be resolved"):
        await load_image("http://nowhere.invalid/a.png", LIMITS, resolver=fails, transport=Recorder().transport)


@pytest.mark.parametrize("address,why", [("8.8.8.8", None), ("2606:4700:4700::1111", None), ("127.0.0.1", "loopback"),
                                         ("10.0.0.1", "private"), ("169.254.1.1", "link-local"),
                                         ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "unspecified")])
def test_refusal_reasons(address, why):
    found = netguard.refusal(ipaddress.ip_address(address))
    assert found == why if why is None else why in found


# ---- fetching from a server on 127.0.0.1 --------------------------------------------------------------


async def test_fetch_ok_and_redirect():
    with image_server() as srv:
        assert (await load_image(f"{srv.base_url}/ok.png", LOCAL)).data == PNG
        assert (await load_image(f"{srv.base_url}/redirect", LOCAL)).data == PNG
        assert (await load_image(f"{srv.base_url}/octet", LOCAL)).media_type == "image/png"
    assert srv.paths == ["/ok.png", "/redirect", "/ok.png", "/octet"]


async def test_loopback_server_is_not_reached_without_the_flag():
    with image_server() as srv:
        with pytest.raises(ImageError, match="loopback"):
            await load_image(f"{srv.base_url}/ok.png", LIMITS)
    assert srv.paths == []


@pytest.mark.parametrize("path,words", [
    ("/big", "larger than the server's limit"),
    ("/big-declared", "larger than the server's limit"),
    ("/page.html", "content type 'text/html'"),
    ("/text.png", "not a decodable image"),
    ("/missing.png", "HTTP 404"),
    ("/loop", "redirects more than 5 times"),
    ("/to-file", "scheme 'file'"),
    ("/stall", "took longer than 0.5 s"),
])
async def test_fetch_failures(path, words):
    with image_server() as srv:
        started = time.monotonic()
        with pytest.raises(ImageError, match=words):
            await load_image(f"{srv.base_url}{path}", LOCAL)
        assert time.monotonic() - started < 2.5  # the stall is cut at the timeout, not waited out


async def test_connection_refused_is_an_image_error():
    with image_server() as srv:
        url = f"{srv.base_url}/ok.png"
    with pytest.raises(ImageError, match="could not be fetched"):
        await load_image(url, LOCAL)

"""Images through the app: chat `image_url` parts, Messages `image` blocks and Responses `input_image` parts
reach the engine as `ImageInput`s with one placeholder each, for a vision model; everything else is a 4xx.

Image URLs point at a server on 127.0.0.1 (fetched with --allow-private-image-urls), or at addresses the
guard refuses before any connection.
"""

from __future__ import annotations

import dataclasses
import hashlib

import httpx
import pytest

from server.app import create_app
from server.policy import HEADER
from tests.server.conftest import CHAT, chat_body, settings, sse_data
from tests.server.fake_engine import IMAGE_TOKEN_ID, INFO, FakeEngine
from tests.server.image_server import PNG, data_url, image_bytes, image_server

pytestmark = pytest.mark.anyio

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
VISION = dataclasses.replace(INFO, vision=True, image_token_id=IMAGE_TOKEN_ID)
JPEG = image_bytes("JPEG")


def image_part(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def with_images(*parts: dict, **extra) -> dict:
    return chat_body(**extra) | {"messages": [{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}]}


@pytest.fixture
def srv():
    with image_server() as server:
        yield server


@pytest.fixture
def vision_engine() -> FakeEngine:
    return FakeEngine(info=VISION)


def make_client(engine: FakeEngine, **overrides) -> httpx.AsyncClient:
    app = create_app(settings(**{"allow_private_image_urls": True, **overrides}), engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


async def test_images_reach_the_engine_in_order(vision_engine, srv):
    body = with_images(image_part(data_url(JPEG, "image/jpeg"), detail="high"),
                       {"type": "text", "text": "and"}, {"type": "image_url", "image_url": f"{srv.base_url}/ok.png"})
    async with make_client(vision_engine) as c:
        r = await c.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    request = vision_engine.submitted[-1]
    assert [(i.data, i.media_type) for i in request.images] == [(JPEG, "image/jpeg"), (PNG, "image/png")]
    assert request.images[1].digest == hashlib.sha256(PNG).hexdigest()
    assert request.prompt_ids.count(IMAGE_TOKEN_ID) == 2
    messages, _ = vision_engine.encoded[-1]
    assert messages[0]["content"] == [{"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "text", "text": "and"},
                                      {"type": "image"}]
    assert r.headers[HEADER] == "messages[].content[].image_url.detail"  # detail is ignored and says so
    assert srv.paths == ["/ok.png"]


async def test_detail_is_accepted_under_strict_params(vision_engine):
    async with make_client(vision_engine, strict_params=True) as c:
        r = await c.post(CHAT, json=with_images(image_part(data_url(PNG), detail="low")))
    assert r.status_code == 200, r.text
    assert len(vision_engine.submitted[-1].images) == 1


async def test_text_only_messages_are_rendered_as_before(vision_engine):
    async with make_client(vision_engine) as c:
        assert (await c.post(CHAT, json=chat_body("hi"))).status_code == 200
    messages, _ = vision_engine.encoded[-1]
    assert messages == [{"role": "user", "content": "hi"}] and vision_engine.submitted[-1].images == ()


async def test_a_text_only_model_refuses_images_before_fetching(srv):
    engine = FakeEngine()
    async with make_client(engine) as c:
        for stream in (False, True):
            r = await c.post(CHAT, json=with_images(image_part(f"{srv.base_url}/ok.png"), stream=stream))
            assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert "does not take images" in error["message"] and error["param"] == "messages[0].content[1]"
    assert srv.paths == [] and engine.submitted == [] and engine.encoded == []


@pytest.mark.parametrize("url,param_words", [
    ("file:///etc/passwd", "scheme 'file'"),
    ("ftp://127.0.0.1/a.png", "scheme 'ftp'"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.0.0.1/a.png", "private"),
    ("http://[::1]/a.png", "loopback"),
    (data_url(b"hello"), "not a decodable image"),
    ("data:text/html;base64,PGh0bWw+", "not an image type"),
    (data_url(image_bytes(size=(300, 300)) + b"\0" * 5000), "larger than the server's limit"),
])
async def test_refused_images_are_400s_naming_the_part(vision_engine, url, param_words):
    async with make_client(vision_engine, allow_private_image_urls=False, image_max_bytes=4000) as c:
        r = await c.post(CHAT, json=with_images(image_part(url)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1].image_url" and error["code"] == "invalid_image"
    assert param_words in error["message"] and error["type"] == "invalid_request_error"
    assert vision_engine.submitted == []


async def test_loopback_url_is_refused_without_the_flag(vision_engine, srv):
    async with make_client(vision_engine, allow_private_image_urls=False) as c:
        r = await c.post(CHAT, json=with_images(image_part(f"{srv.base_url}/ok.png")))
    assert r.status_code == 400 and "loopback" in r.json()["error"]["message"]
    assert srv.paths == []


async def test_fetch_failures_are_400s(vision_engine, srv):
    async with make_client(vision_engine, image_timeout_s=0.5, image_max_bytes=100_000) as c:
        for path in ("/stall", "/big", "/page.html", "/missing.png"):
            r = await c.post(CHAT, json=with_images(image_part(f"{srv.base_url}{path}")))
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["param"] == "messages[0].content[1].image_url"
    assert vision_engine.submitted == []


@pytest.mark.parametrize("content,param", [
    ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "messages[0].content[0]"),
    ([{"type": "image_url"}], "messages[0].content[0].image_url"),
    ([{"type": "image_url", "image_url": {"detail": "low"}}], "messages[0].content[0].image_url.url"),
    ([{"type": "image_url", "image_url": 5}], "messages[0].content[0].image_url"),
    ([{"type": "input_image", "image_url": "data:,"}], "messages[0].content[0]"),
])
async def test_malformed_parts(vision_engine, content, param):
    async with make_client(vision_engine) as c:
        r = await c.post(CHAT, json=chat_body() | {"messages": [{"role": "user", "content": content}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


async def test_images_only_in_user_messages(vision_engine):
    body = chat_body() | {"messages": [{"role": "system", "content": [image_part(data_url(PNG))]},
                                       {"role": "user", "content": "hi"}]}
    async with make_client(vision_engine) as c:
        r = await c.post(CHAT, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0]"


async def test_at_most_max_images(vision_engine, srv):
    from server.vision import MAX_IMAGES
    parts = [image_part(f"{srv.base_url}/ok.png")] * (MAX_IMAGES + 1)
    async with make_client(vision_engine) as c:
        r = await c.post(CHAT, json=with_images(*parts))
    assert r.status_code == 400 and r.json()["error"]["param"] == f"messages[0].content[{MAX_IMAGES + 1}]"
    assert srv.paths == []


async def test_streamed_image_chat(vision_engine):
    async with make_client(vision_engine) as c:
        r = await c.post(CHAT, json=with_images(image_part(data_url(PNG)), stream=True))
    assert r.status_code == 200 and sse_data(r.text)[-1] == "[DONE]"
    assert len(vision_engine.submitted[-1].images) == 1


async def test_messages_api_image_blocks(vision_engine, srv):
    import base64
    blocks = [{"type": "text", "text": "Compare"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                           "data": base64.b64encode(JPEG).decode()}},
              {"type": "image", "source": {"type": "url", "url": f"{srv.base_url}/ok.png"}}]
    body = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": blocks}]}
    async with make_client(vision_engine) as c:
        r = await c.post(MESSAGES, json=body)
        count = await c.post("/v1/messages/count_tokens", json={"messages": body["messages"]})
    async with make_client(vision_engine, allow_private_image_urls=False) as c:  # the guard on: nothing is sent
        bad = await c.post(MESSAGES, json=body | {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/a.png"}}]}]})
    assert r.status_code == 200, r.text
    request = vision_engine.submitted[-1]
    assert [i.data for i in request.images] == [JPEG, PNG] and request.prompt_ids.count(IMAGE_TOKEN_ID) == 2
    assert count.status_code == 200 and count.json()["input_tokens"] > 0
    assert bad.status_code == 400 and "private" in bad.json()["error"]["message"]
    assert "'messages[0].content[0].source'" in bad.json()["error"]["message"]  # Anthropic's envelope: no param
    assert srv.paths == ["/ok.png"]  # count_tokens counts, it does not fetch


async def test_messages_api_text_only_model():
    body = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:9/a.png"}}]}]}
    async with make_client(FakeEngine()) as c:
        r = await c.post(MESSAGES, json=body)
    assert r.status_code == 400 and "does not take images" in r.json()["error"]["message"]


async def test_responses_api_input_image(vision_engine):
    body = {"model": "fake-model", "instructions": "Be brief.", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": data_url(PNG), "detail": "auto"}]}]}
    async with make_client(vision_engine) as c:
        r = await c.post(RESPONSES, json=body)
        bad = await c.post(RESPONSES, json=body | {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "file:///etc/passwd"}]}]})
        file_id = await c.post(RESPONSES, json=body | {"input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-1"}]}]})
    assert r.status_code == 200, r.text
    assert [i.data for i in vision_engine.submitted[-1].images] == [PNG]
    assert r.headers[HEADER] == "input[].content[].detail"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0].content[0].image_url"
    assert file_id.status_code == 400 and file_id.json()["error"]["param"] == "input[0].content[0]"


async def test_responses_api_text_only_model():
    body = {"model": "fake-model", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://127.0.0.1:9/a.png"}]}]}
    async with make_client(FakeEngine()) as c:
        r = await c.post(RESPONSES, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[0]"


async def test_openapi_documents_images_only_for_a_vision_model(vision_engine):
    for engine, expected in ((FakeEngine(), False), (vision_engine, True)):
        async with make_client(engine) as c:
            text = (await c.get("/openapi.json")).text
        # chat's and the Responses image parts describe their URL; the Messages image block has a base64 source
        assert ("data:image/" in text) == expected and ('"const":"base64"' in text) == expected
        assert "x-vision-only" not in text

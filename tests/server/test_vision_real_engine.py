"""Images end to end: the OpenAI SDK against `dspark serve` on a tiny random Gemma-4 saved as an
mlx-vlm model directory (tests/engine/tiny_gemma.py), speculating with a Gemma-4 DSpark drafter.

An image chat succeeds streamed and not, with the same greedy answer, and the image is read (the
prompt grows by its image block, and a different image gives another answer). A file:// URL, a
private address and an oversized image get clear 4xx errors, never a 5xx.
"""

from __future__ import annotations

import base64

import openai
import pytest

from tests.engine import tiny_gemma as tg
from tests.real_server import ServeProcess
from tests.server.conftest import free_port

pytest.importorskip("mlx_vlm")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """`dspark serve` on a saved tiny Gemma-4 directory (loaded through mlx-vlm) with a Gemma-4-layout
    DSpark drafter and the auto cap (its cost curve measured at start)."""
    model = tg.write_tiny_gemma_dir(tmp_path_factory.mktemp("tiny-gemma4"))
    drafter = tmp_path_factory.mktemp("tiny-gemma4-dspark")
    tg.gemma_dspark_drafter(drafter)
    server = ServeProcess(free_port(), "--model", str(model), "--drafter", str(drafter), "--mode", "dspark")
    try:
        health = server.wait_ready()
        assert health["mode"] == "dspark", health
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        server.stop()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def ask(url: str, text: str = "w5 w6 w7") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_an_image_chat_streamed_and_not(client):
    messages = ask(data_url(tg.png(0)))
    whole = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=24)
    stream = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
    text_only = client.chat.completions.create(model="default", temperature=0, max_tokens=24,
                                               messages=[{"role": "user", "content": "w5 w6 w7"}])
    # The image block (begin, 4 soft tokens, end) replaces its placeholder: 5 more prompt tokens.
    assert whole.usage.prompt_tokens == text_only.usage.prompt_tokens + 1 + 5
    other = client.chat.completions.create(model="default", messages=ask(data_url(tg.png(1))), temperature=0,
                                           max_tokens=24)
    answers = {whole.choices[0].message.content, other.choices[0].message.content, text_only.choices[0].message.content}
    assert len(answers) >= 2  # what the image shows changes the answer


@pytest.mark.parametrize("url, status", [
    ("file:///etc/passwd", 400),
    ("http://127.0.0.1:9/x.png", 400),
    ("http://10.0.0.1/x.png", 400),
    (data_url(b"\x89PNG not really"), 400),
])
def test_refused_images_are_clear_4xx(client, url, status):
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="default", messages=ask(url), max_tokens=4)
    assert err.value.status_code == status and err.value.body and err.value.body.get("message")


def test_an_oversized_image_is_a_clear_4xx(client):
    big = data_url(b"\x89PNG" + b"\0" * (21 * 2**20))
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="default", messages=ask(big), max_tokens=4)
    assert 400 <= err.value.status_code < 500

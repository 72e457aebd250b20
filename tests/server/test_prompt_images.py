"""How image parts reach the chat template (server.prompt.template_content): one `{"type": "image"}` part per
image, in order, so a multimodal template writes one image placeholder per image.

The templates below are the image-handling parts of Qwen2-VL's and Gemma 3's chat templates, rendered with
Jinja as transformers renders them; a fake tokenizer reads each special token as one id.
"""

from __future__ import annotations

import re

import jinja2
import pytest

from server.prompt import build_chat_prompt, chat_messages, template_content
from server.protocol import ChatCompletionRequest

QWEN2_VL = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)
GEMMA3 = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] | trim }}"
    "{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)
SPECIAL = {"<|image_pad|>": 900, "<start_of_image>": 901}


class TemplateEngine:
    """The parts of the engine contract `build_chat_prompt` uses: a Jinja template and a tokenizer that
    reads each special token as one id and every other character as its code point."""

    def __init__(self, template: str) -> None:
        self.template = template

    def chat_template(self) -> str:
        return self.template

    def encode_chat(self, messages, kwargs=None) -> list[int]:
        return self.encode_text(jinja2.Template(self.template).render(messages=messages, bos_token="<bos>"))

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in re.split(f"({'|'.join(map(re.escape, SPECIAL))})", text):
            ids += [SPECIAL[piece]] if piece in SPECIAL else [ord(c) for c in piece]
        return ids

    def decode(self, ids) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(names.get(i, chr(i)) for i in ids)


def request(*messages) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": list(messages)})


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
TWO_IMAGES = request(
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "First:"}, IMAGE, {"type": "text", "text": "second:"},
                                 {"type": "image_url", "image_url": "https://example.com/b.png"}]},
    {"role": "assistant", "content": "Two cats."},
    {"role": "user", "content": [IMAGE, {"type": "text", "text": "And this?"}]},
)


def test_template_content_keeps_the_order_of_parts():
    parts = template_content(TWO_IMAGES.messages[1])
    assert parts == [{"type": "text", "text": "First:"}, {"type": "image"}, {"type": "text", "text": "second:"},
                     {"type": "image"}]
    assert template_content(TWO_IMAGES.messages[0]) == "Be brief."  # text-only content stays a string


def test_chat_messages_with_images():
    out = chat_messages(TWO_IMAGES.messages, native_calls=True, fallback_tools=None)
    assert [m["content"] if isinstance(m["content"], str) else len(m["content"]) for m in out] == \
        ["Be brief.", 4, "Two cats.", 2]


@pytest.mark.parametrize("template,image_id", [(QWEN2_VL, 900), (GEMMA3, 901)])
def test_one_placeholder_per_image_in_order(template, image_id):
    ids, _ = build_chat_prompt(TWO_IMAGES, TemplateEngine(template))
    assert ids.count(image_id) == 3
    text = TemplateEngine(template).decode(ids)
    marker = next(k for k, v in SPECIAL.items() if v == image_id)
    assert text.index("First:") < text.index(marker) < text.index("second:")
    assert text.rindex(marker) < text.index("And this?")


def test_hermes_calls_on_a_message_with_images_keep_the_images():
    """A template without tool support gets history calls as text: added as one more part, not by
    flattening the parts to a string (which would lose the image placeholders)."""
    req = request({"role": "user", "content": [IMAGE, {"type": "text", "text": "hi"}],
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    (message,) = chat_messages(req.messages, native_calls=False, fallback_tools=None)
    assert message["content"][:2] == [{"type": "image"}, {"type": "text", "text": "hi"}]
    assert message["content"][2]["text"].startswith("<tool_call>")

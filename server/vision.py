"""The images of a chat request: refused for a model that does not take them, else loaded for the engine.

A route calls `image_refs` and `require_vision` before rendering (so a text-only model refuses images
before anything is fetched), then `load_images` after rendering and before submitting: the fetching
happens while the request holds no place in the engine. The i-th image of the request, in message
and part order, is the i-th `ImageInput` and fills the i-th image placeholder of the prompt
(server.prompt.template_content renders one per image part).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.api import EngineInfo, ImageInput
from server.errors import APIError
from server.images import ImageError, ImageLimits, load_image
from server.protocol import ChatCompletionRequest, ImagePart

# Most images one request may carry: each may be up to --image-max-bytes, all held until the request is
# submitted, so the count bounds what one request can make the server download and keep.
MAX_IMAGES = 16


@dataclass(frozen=True)
class ImageRef:
    """One image part of a request: its URL, the part (`param`) and the field that holds the URL
    (`url_param`), as the client named them (in errors)."""

    url: str
    param: str
    url_param: str


def image_refs(req: ChatCompletionRequest, params: Sequence[tuple[str, str]] | None = None) -> list[ImageRef]:
    """The request's image parts in prompt order. `params`: (part, URL field) of each image as the client
    sent it (a Messages or Responses request converted to chat); else the chat paths
    `messages[i].content[j]` and `messages[i].content[j].image_url`."""
    refs = []
    for i, message in enumerate(req.messages):
        for j, part in enumerate(message.content):
            if isinstance(part, ImagePart):
                where = f"messages[{i}].content[{j}]"
                param, url_param = params[len(refs)] if params is not None else (where, f"{where}.image_url")
                refs.append(ImageRef(part.image_url.url, param, url_param))
    return refs


def require_vision(refs: list[ImageRef], info: EngineInfo) -> None:
    """400 naming the first image part when the served model does not take images, or the first one past
    MAX_IMAGES (checked before anything is fetched)."""
    if refs and not info.vision:
        raise APIError(400, f"The served model {info.model_id} does not take images (it is not a vision model); "
                            "send text only.", param=refs[0].param, code="unsupported_parameter")
    if len(refs) > MAX_IMAGES:
        raise APIError(400, f"A request may carry at most {MAX_IMAGES} images; this one has {len(refs)}.",
                       param=refs[MAX_IMAGES].param, code="invalid_value")


async def load_images(refs: list[ImageRef], limits: ImageLimits) -> tuple[ImageInput, ...]:
    """The images, fetched or decoded and checked one after another (at most one image's bytes in flight
    beyond those kept); a bad one is a 400 naming the field of its URL."""
    images = []
    for ref in refs:
        try:
            images.append(await load_image(ref.url, limits))
        except ImageError as exc:
            raise APIError(400, f"Invalid image in '{ref.url_param}': {exc}.", param=ref.url_param,
                           code="invalid_image") from None
    return tuple(images)

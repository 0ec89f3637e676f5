"""A chat template and a tokenizer for coordinator tests that need conversations but no model."""

from __future__ import annotations

from services.common.conversation import ChatTokens

CHAT = ChatTokens(im_start=1, im_end=2, vision_start=3, image_pad=4, vision_end=5, newline=(6,),
                  user_header=(1, 7), assistant_header=(1, 8), system_header=(1, 9))


class CharTokenizer:
    """One token per character, above the chat template's ids."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [100 + ord(c) for c in text]

    def convert_tokens_to_ids(self, token: str) -> int:
        raise NotImplementedError

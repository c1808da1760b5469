"""The server's `Preprocessor`: long prompts are tokenized without holding the GIL.

`Preprocessor.encode` already moves a long text to a worker thread, but the
Rust tokenizer's `encode` keeps the GIL for its whole run, so the event loop
still stops: a 100,000-character message blocked it ~150 ms here, and every
stream's next chunk with it. `encode_batch` releases the GIL while it works;
with it the loop's worst lag during that message was ~20 ms. Same ids: a
batch of one is the same encoding.

(Belongs in `sluice.tokenizer.Tokenizer.encode`; kept here until it moves.)
"""

from __future__ import annotations

import asyncio

from sluice.frontend.preprocess import Preprocessor


class ServerPreprocessor(Preprocessor):
    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        backend = getattr(self.tokenizer, "backend", None)
        if backend is None or len(text) <= self.offload_threshold_chars:
            return await super().encode(text, add_special_tokens)
        (encoding,) = await asyncio.to_thread(
            backend.encode_batch, [text], add_special_tokens=add_special_tokens
        )
        return encoding.ids

"""The max_tokens a request runs with: one policy, one order, for every API.

    1. The server's limit (`--max-tokens-limit`) caps what is asked. An
       explicit value above it was already refused (`limits.check_body`) where
       the API refuses, or lowered where it caps (Messages); what reaches here
       above it is the server's own default (`max_new_tokens`), never sent by
       the client, so it is lowered, not refused.
    2. An agent API (Responses, Messages) lowers what is beyond the room the
       prompt leaves in the context to that room: agents ask for 32,000
       tokens whatever the model.
    3. The context: beyond the room is a 400 with both numbers (chat,
       completions); nothing asked means the rest of the context.
    4. The rest of the context is capped by the limit too.

Why cap before fitting: the context check judges what will run. Fitting first
refused a request for tokens the server would never have generated (chat did
so, completions did not: the same request shape got a 400 on one and ran on
the other).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.frontend.preprocess import Preprocessor
from sluice.frontend.request import PromptInput


def effective_max_tokens(
    requested: int | None,
    prompts: Sequence[PromptInput],
    preprocessor: Preprocessor,
    limit: int | None,
    *,
    prompt_param: str,
    is_clamped_to_context: bool = False,
) -> int:
    """The max_tokens every prompt of the request runs with (module docstring);
    `requested`: the client's value or the server's default (None: the rest
    of the context); `limit`: `--max-tokens-limit`; `prompt_param`: the field a
    prompt that leaves no room is blamed on."""
    # 1. The server's limit first: the context judges what will run.
    if requested is not None and limit is not None:
        requested = min(requested, limit)
    # 2. Agent APIs: lowered to the room (None when there is none: refused below).
    if is_clamped_to_context and requested is not None:
        num_prompt_tokens = max(len(prompt.token_ids) for prompt in prompts)
        room = preprocessor.max_model_len - num_prompt_tokens
        requested = min(requested, room) if room >= 1 else None
    # 3. The context: refuse what does not fit; None is the rest of it.
    max_tokens = preprocessor.fit_max_tokens(prompts, requested, prompt_param)
    # 4. The rest of the context is bounded by the limit too.
    return max_tokens if limit is None else min(max_tokens, limit)

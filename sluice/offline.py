"""The offline API: `LLM(...).generate(...)` runs the engine core on this
thread, with no server and no event loop. It batches every prompt it is given
(continuous batching applies as usual) and returns when all are done.

Prompts are encoded as the server encodes them (a raw prompt as
/v1/completions does, with the tokenizer's special tokens; the chat form as
/v1/chat/completions does), so the same prompt gets the same ids and the
same greedy output offline and over HTTP. A `generate` that raises leaves
the engine empty: the next one starts clean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.outputs import FinishReason
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import ContextLengthError, InvalidRequestError


@dataclass(frozen=True, slots=True)
class GenerationOutput:
    prompt: str
    prompt_token_ids: tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    # One per generated token when logprobs were asked, else empty.
    logprobs: tuple[float, ...] = ()


class LLM:
    def __init__(self, model: str = "embedded", *, config: EngineConfig | None = None, **model_kw):
        config = config or EngineConfig(multiprocess=False)
        model_config = replace(config.model, model=model, **model_kw)
        self.config = replace(config, model=model_config)
        self.core = EngineCore(self.config)
        self.tokenizer = self.core.loaded.tokenizer
        self._next_id = 0

    def generate(
        self,
        prompts: str | list[str],
        params: SamplingParams | None = None,
        *,
        use_chat_template: bool = False,
    ) -> list[GenerationOutput]:
        """Generate for every prompt. A prompt or parameter the engine could
        never run is an InvalidRequestError (a ContextLengthError for a prompt
        too long) naming it, raised before any prompt starts; whatever fails
        or interrupts later leaves nothing running."""
        params = params or SamplingParams()
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        names = (
            ["prompt"]
            if isinstance(prompts, str)
            else [f"prompts[{i}]" for i in range(len(prompt_list))]
        )
        # 1. Encode and check every prompt before the engine sees any of them.
        encoded = [
            self._checked(self._encode(prompt, use_chat_template, name), name)
            for prompt, name in zip(prompt_list, names, strict=True)
        ]
        if params.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {params.max_tokens}", param="max_tokens"
            )
        # 2. Run them together; on any way out but success, abort what was added.
        request_ids: list[str] = []
        try:
            for token_ids, name in zip(encoded, names, strict=True):
                request_ids.append(self._add(token_ids, params, name))
            tokens, logprobs, finish = self._run_to_completion(set(request_ids))
        except BaseException:
            self.core.abort_requests(request_ids)
            raise
        return [
            GenerationOutput(
                prompt=prompt,
                prompt_token_ids=tuple(token_ids),
                text=self.tokenizer.decode(tokens[request_id]),
                token_ids=tuple(tokens[request_id]),
                finish_reason=finish[request_id],
                logprobs=tuple(logprobs[request_id]),
            )
            for prompt, token_ids, request_id in zip(prompt_list, encoded, request_ids, strict=True)
        ]

    def _encode(self, prompt: str, use_chat_template: bool, name: str) -> list[int]:
        """The ids /v1/chat/completions (chat form) or /v1/completions (raw) would
        run: the rendered template already holds its special tokens; a raw
        prompt gets the tokenizer's (<s> for Llama's)."""
        if use_chat_template:
            messages = [{"role": "user", "content": prompt}]
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False)
        if not prompt:
            raise InvalidRequestError("the prompt is empty", param=name)
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def _checked(self, token_ids: list[int], name: str) -> list[int]:
        if not token_ids:
            raise InvalidRequestError("the prompt encodes to no tokens", param=name)
        if len(token_ids) >= self.core.max_model_len:
            raise ContextLengthError(
                f"the prompt has {len(token_ids)} tokens; max_model_len "
                f"{self.core.max_model_len} leaves no room to generate",
                param=name,
            )
        return token_ids

    def _add(self, prompt_token_ids: list[int], params: SamplingParams, name: str) -> str:
        request_id = f"offline-{self._next_id}"
        self._next_id += 1
        try:
            self.core.add_request(generation_request(request_id, prompt_token_ids, params))
        except ValueError as error:  # a request the engine could never run
            raise InvalidRequestError(str(error), param=name) from error
        return request_id

    def _run_to_completion(self, pending: set[str]):
        tokens: dict[str, list[int]] = {request_id: [] for request_id in pending}
        logprobs: dict[str, list[float]] = {request_id: [] for request_id in pending}
        finish: dict[str, FinishReason] = {}
        while pending:
            deltas = self.core.step()
            for error in self.core.take_errors():  # a grammar refused while compiling
                raise InvalidRequestError(error.message, param="structured_output")
            for delta in deltas:
                tokens[delta.request_id].extend(delta.new_token_ids)
                if delta.logprobs is not None:
                    logprobs[delta.request_id].extend(delta.logprobs.logprobs)
                if delta.finish_reason is not None:
                    finish[delta.request_id] = delta.finish_reason
                    pending.discard(delta.request_id)
        return tokens, logprobs, finish


__all__ = ["LLM", "GenerationOutput", "ModelConfig", "SamplingParams"]

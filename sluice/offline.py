"""The offline API: `LLM(...).generate(...)` runs the engine core on this
thread, with no server and no event loop. It batches every prompt it is given
(continuous batching applies as usual) and returns when all are done.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.outputs import FinishReason
from sluice.engine.sampling_params import SamplingParams


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
        params = params or SamplingParams()
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        encoded = [self._encode(prompt, use_chat_template) for prompt in prompt_list]
        request_ids = [self._add(token_ids, params) for token_ids in encoded]
        tokens, logprobs, finish = self._run_to_completion(set(request_ids))
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

    def _encode(self, prompt: str, use_chat_template: bool) -> list[int]:
        if use_chat_template:
            messages = [{"role": "user", "content": prompt}]
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(prompt)

    def _add(self, prompt_token_ids: list[int], params: SamplingParams) -> str:
        request_id = f"offline-{self._next_id}"
        self._next_id += 1
        self.core.add_request(request_id, prompt_token_ids, params)
        return request_id

    def _run_to_completion(self, pending: set[str]):
        tokens: dict[str, list[int]] = {request_id: [] for request_id in pending}
        logprobs: dict[str, list[float]] = {request_id: [] for request_id in pending}
        finish: dict[str, FinishReason] = {}
        while pending:
            for delta in self.core.step():
                tokens[delta.request_id].extend(delta.new_token_ids)
                if delta.logprobs is not None:
                    logprobs[delta.request_id].extend(delta.logprobs.logprobs)
                if delta.finish_reason is not None:
                    finish[delta.request_id] = delta.finish_reason
                    pending.discard(delta.request_id)
        return tokens, logprobs, finish


__all__ = ["LLM", "GenerationOutput", "ModelConfig", "SamplingParams"]

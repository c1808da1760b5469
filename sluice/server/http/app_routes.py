"""What an API's routes use of the app (`routes.Routes`), declared once: its
body reader, the models it serves, the model a request names, admission and
the way a generation is answered. The Messages, Responses, Ollama and
embeddings routes each take an `AppRoutes`; the app's `Routes` is the one implementation.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from fastapi import Request
from starlette.responses import Response

from sluice.engine.client_base import QueueTimeout
from sluice.frontend.request import GenerationRequest
from sluice.frontend.serving import ResponseChunks
from sluice.server.body.body import BodyReader
from sluice.server.served_models.model_parts import ModelOptions, ModelParts
from sluice.server.served_models.model_pool import ModelPool


class AppRoutes(Protocol):
    bodies: BodyReader
    # Every model served, running or not (sluice/server/served_models/model_pool.py).
    models: ModelPool[ModelParts]

    def model_for(
        self,
        request: Request,
        name: str | None,
        *,
        keep_alive_s: float | None = None,
        is_any_name_served: bool = False,
    ) -> AbstractAsyncContextManager[ModelParts]: ...

    async def options_for(self, name: str | None) -> ModelOptions: ...

    def admit(
        self, request: Request, n: int, model: ModelParts | None = None, *, is_pooling: bool = False
    ) -> QueueTimeout | None: ...

    async def respond(
        self,
        request: Request,
        generation: GenerationRequest,
        queue_timeout: QueueTimeout | None,
        chunks: ResponseChunks,
        media_type: str = ...,
        *,
        model: ModelParts | None = None,
    ) -> Response: ...

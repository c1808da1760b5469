"""Every API's HTTP surface, declared once: its routes, request models and error shape.

    API          root path              routes                                   errors
    completions  /v1/completions        POST (generation)                        OpenAI
    chat         /v1/chat/completions   POST (generation)                        OpenAI
    responses    /v1/responses          POST (generation), POST input_tokens,    OpenAI
                                        GET and DELETE {response_id}
    messages     /v1/messages           POST (generation), POST count_tokens     Anthropic
    ollama       /api                   POST chat, generate (generation),        Ollama
                                        GET tags, ps, version; POST show;
                                        pull, push, create, copy, delete (refused);
                                        POST embed, embeddings (a pooling model)
    embeddings   /v1/embeddings         POST (a pooling model)                   OpenAI
    rerank       /v1/rerank, /rerank,   POST (a pooling model), each its own     OpenAI
                 /v2/rerank             API: no root lies under another's
    score        /v1/score              POST (a pooling model)                   OpenAI

Who reads the table (`API_TABLE`, or the table an app was built with):
- the app's routing (`server.app.create_app`) registers exactly its routes;
- the API key middleware asks a key on a keyed API's paths and holds the
  key's limits (a `KeyLease`) on its generation routes;
- the trace middleware opens a span on a traced API's generation routes;
- the error mapper (`server.errors`) answers every path under an API's root,
  an unknown one (404) or a wrong method (405) included, in its `ErrorShape`.

A generation route is one that runs the engine: its handler passes admission
(`AdmissionGate`), reserves the key's tokens and fills the access log's token
counts (`routes.Routes.respond`). Every route with a request model reads a JSON
body and refuses one not declared JSON with a 415 (`BodyReader.parse`).

Invariants: every route path lies under its API's root; no API's root lies
under another's (so a path has at most one API), and no route is declared twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from sluice.apis.chat.protocol import ChatCompletionRequest
from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.embeddings import protocol as pooling_protocol
from sluice.apis.messages import protocol as messages_protocol
from sluice.apis.ollama import protocol as ollama_protocol
from sluice.apis.responses import protocol as responses_protocol
from sluice.errors import ErrorShape


@dataclass(frozen=True, slots=True)
class ApiRoute:
    """One HTTP route of an API."""

    method: str  # "POST", "GET", "DELETE"
    path: str  # Starlette's path syntax: `{response_id}` is a path parameter
    # The JSON body the route reads (None: the route reads no body).
    request_model: type[BaseModel] | None = None
    # Runs the engine: admission, the key's limits and tokens, traces, token counts.
    is_generation: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.method, self.path)


@dataclass(frozen=True, slots=True)
class ApiSurface:
    """One API: the routes under its root path and how they answer."""

    name: str
    # Every route lies under it; every error under it takes `error_shape`.
    root_path: str
    error_shape: ErrorShape
    routes: tuple[ApiRoute, ...]
    # An API key is asked on its paths (when the server has keys).
    is_keyed: bool = True
    # Its generation routes open a request span (when tracing is on).
    is_traced: bool = True

    def __post_init__(self) -> None:
        for route in self.routes:
            assert self.owns(route.path), f"{route.path} is not under {self.root_path}"

    def owns(self, path: str) -> bool:
        return path == self.root_path or path.startswith(self.root_path + "/")


@dataclass(frozen=True, slots=True)
class ApiTable:
    """The APIs one app serves, and the per-path decisions read from them."""

    surfaces: tuple[ApiSurface, ...]
    # (method, path) of every generation route, and of the traced ones.
    generation_routes: frozenset[tuple[str, str]] = field(init=False)
    traced_routes: frozenset[tuple[str, str]] = field(init=False)

    def __post_init__(self) -> None:
        for surface in self.surfaces:
            others = [other for other in self.surfaces if other is not surface]
            nested = [o.name for o in others if o.owns(surface.root_path)]
            assert not nested, f"{surface.name}'s root lies under another API's: {nested}"
        keys = [route.key for route in self.routes()]
        assert len(set(keys)) == len(keys), f"a route is declared twice: {keys}"
        generation = [(s, r) for s in self.surfaces for r in s.routes if r.is_generation]
        object.__setattr__(self, "generation_routes", frozenset(r.key for _, r in generation))
        traced = frozenset(r.key for s, r in generation if s.is_traced)
        object.__setattr__(self, "traced_routes", traced)

    def routes(self) -> list[ApiRoute]:
        return [route for surface in self.surfaces for route in surface.routes]

    def surface_of(self, path: str) -> ApiSurface | None:
        """The API whose root `path` lies under (None: no API's path)."""
        return next((surface for surface in self.surfaces if surface.owns(path)), None)

    def error_shape_of(self, path: str) -> ErrorShape:
        """The shape of every error on `path`: its API's (OpenAI's off every API)."""
        surface = self.surface_of(path)
        return ErrorShape.OPENAI if surface is None else surface.error_shape

    def is_keyed(self, path: str) -> bool:
        """Whether `path` needs an API key: every path does but an unkeyed API's
        (probes and pages are the key middleware's own exceptions)."""
        surface = self.surface_of(path)
        return surface is None or surface.is_keyed


COMPLETIONS_CREATE = ApiRoute("POST", "/v1/completions", CompletionRequest, is_generation=True)
CHAT_CREATE = ApiRoute("POST", "/v1/chat/completions", ChatCompletionRequest, is_generation=True)
RESPONSES_CREATE = ApiRoute(
    "POST", "/v1/responses", responses_protocol.ResponsesRequest, is_generation=True
)
RESPONSES_INPUT_TOKENS = ApiRoute(
    "POST", "/v1/responses/input_tokens", responses_protocol.InputTokensRequest
)
RESPONSES_RETRIEVE = ApiRoute("GET", "/v1/responses/{response_id}")
RESPONSES_DELETE = ApiRoute("DELETE", "/v1/responses/{response_id}")
MESSAGES_CREATE = ApiRoute(
    "POST", "/v1/messages", messages_protocol.MessagesRequest, is_generation=True
)
MESSAGES_COUNT_TOKENS = ApiRoute(
    "POST", "/v1/messages/count_tokens", messages_protocol.CountTokensRequest
)
OLLAMA_CHAT = ApiRoute("POST", "/api/chat", ollama_protocol.ChatRequest, is_generation=True)
OLLAMA_GENERATE = ApiRoute(
    "POST", "/api/generate", ollama_protocol.GenerateRequest, is_generation=True
)
OLLAMA_TAGS = ApiRoute("GET", "/api/tags")
OLLAMA_SHOW = ApiRoute("POST", "/api/show", ollama_protocol.ShowRequest)
OLLAMA_PS = ApiRoute("GET", "/api/ps")
OLLAMA_VERSION = ApiRoute("GET", "/api/version")
# Model management: answered with what sluice does instead (no body read).
OLLAMA_PULL = ApiRoute("POST", "/api/pull")
OLLAMA_PUSH = ApiRoute("POST", "/api/push")
OLLAMA_CREATE = ApiRoute("POST", "/api/create")
OLLAMA_COPY = ApiRoute("POST", "/api/copy")
OLLAMA_DELETE = ApiRoute("DELETE", "/api/delete")
# Pooling models' routes (sluice/apis/embeddings): they run the engine, so
# they are generation routes to admission, keys, traces and the access log.
EMBEDDINGS_CREATE = ApiRoute(
    "POST", "/v1/embeddings", pooling_protocol.EmbeddingsRequest, is_generation=True
)
RERANK_CREATE = ApiRoute("POST", "/v1/rerank", pooling_protocol.RerankRequest, is_generation=True)
RERANK_JINA = ApiRoute("POST", "/rerank", pooling_protocol.RerankRequest, is_generation=True)
RERANK_V2 = ApiRoute("POST", "/v2/rerank", pooling_protocol.RerankRequest, is_generation=True)
SCORE_CREATE = ApiRoute("POST", "/v1/score", pooling_protocol.ScoreRequest, is_generation=True)
OLLAMA_EMBED = ApiRoute(
    "POST", "/api/embed", pooling_protocol.OllamaEmbedRequest, is_generation=True
)
OLLAMA_EMBEDDINGS = ApiRoute(
    "POST", "/api/embeddings", pooling_protocol.OllamaEmbeddingsRequest, is_generation=True
)
# The routes a pooling model serves (a generation model refuses them).
POOLING_ROUTES = (
    EMBEDDINGS_CREATE, RERANK_CREATE, RERANK_JINA, RERANK_V2, SCORE_CREATE, OLLAMA_EMBED,
    OLLAMA_EMBEDDINGS,
)  # fmt: skip

COMPLETIONS = ApiSurface("completions", "/v1/completions", ErrorShape.OPENAI, (COMPLETIONS_CREATE,))
CHAT = ApiSurface("chat", "/v1/chat/completions", ErrorShape.OPENAI, (CHAT_CREATE,))
RESPONSES = ApiSurface(
    "responses",
    "/v1/responses",
    ErrorShape.OPENAI,
    (RESPONSES_CREATE, RESPONSES_INPUT_TOKENS, RESPONSES_RETRIEVE, RESPONSES_DELETE),
)
MESSAGES = ApiSurface(
    "messages", "/v1/messages", ErrorShape.ANTHROPIC, (MESSAGES_CREATE, MESSAGES_COUNT_TOKENS)
)
OLLAMA = ApiSurface(
    "ollama",
    "/api",
    ErrorShape.OLLAMA,
    (
        OLLAMA_CHAT, OLLAMA_GENERATE, OLLAMA_TAGS, OLLAMA_SHOW, OLLAMA_PS, OLLAMA_VERSION,
        OLLAMA_PULL, OLLAMA_PUSH, OLLAMA_CREATE, OLLAMA_COPY, OLLAMA_DELETE,
        OLLAMA_EMBED, OLLAMA_EMBEDDINGS,
    ),
)  # fmt: skip
EMBEDDINGS = ApiSurface("embeddings", "/v1/embeddings", ErrorShape.OPENAI, (EMBEDDINGS_CREATE,))
RERANK = ApiSurface("rerank", "/v1/rerank", ErrorShape.OPENAI, (RERANK_CREATE,))
RERANK_JINA_PATH = ApiSurface("rerank_jina", "/rerank", ErrorShape.OPENAI, (RERANK_JINA,))
RERANK_V2_PATH = ApiSurface("rerank_v2", "/v2/rerank", ErrorShape.OPENAI, (RERANK_V2,))
SCORE = ApiSurface("score", "/v1/score", ErrorShape.OPENAI, (SCORE_CREATE,))

# The APIs `sluice serve` serves.
API_TABLE = ApiTable((
    COMPLETIONS, CHAT, RESPONSES, MESSAGES, OLLAMA, EMBEDDINGS, RERANK, RERANK_JINA_PATH,
    RERANK_V2_PATH, SCORE,
))  # fmt: skip

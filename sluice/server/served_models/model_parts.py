"""What the routes use of one served model: its request options, read from
its `ServedModel` alone (tokenize needs no engine), and while its engine runs,
its admission gate, frontend and metrics.

A server of several models (`model_pool.ModelPool`) builds one `ModelParts`
each time a model's engine starts (`ModelPool.prepare`); the routes take the
parts of the model a request names and nothing else of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.apis import openai_request
from sluice.config import ServerConfig
from sluice.engine.messages import EngineStatsSnapshot
from sluice.frontend.preprocess import Preprocessor
from sluice.frontend.serving import Frontend
from sluice.server.body.body import Conversion
from sluice.server.in_flight.admission import AdmissionGate
from sluice.server.observability.metrics import ModelMetrics, ServerMetrics
from sluice.server.served_models.served_model import ServedModel, ServedTokenizer
from sluice.tools.reasoning import chosen_reasoning_parser
from sluice.tools.tool_format import chosen_tool_call_format


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """A model's name as clients send it, and how its requests are converted."""

    name: str
    served: ServedModel
    conversion: Conversion

    @property
    def tokenizer(self) -> ServedTokenizer:
        return self.served.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.served.max_model_len

    @property
    def options(self) -> openai_request.RequestOptions:
        return self.conversion.on_loop


@dataclass(frozen=True, slots=True)
class ModelParts:
    """A model whose engine runs, as the routes use it."""

    model: ModelOptions
    gate: AdmissionGate
    frontend: Frontend
    # The observer of its requests without an API key, and its keys' series.
    metrics: ModelMetrics

    @property
    def name(self) -> str:
        return self.model.name


def model_options(config: ServerConfig, name: str, served: ServedModel) -> ModelOptions:
    """How requests for `served`, served as `name`, are checked and tokenized."""
    tokenizer = served.tokenizer
    options = openai_request.RequestOptions(
        name,
        Preprocessor(tokenizer, served.max_model_len),
        config.limits,
        tool_format=chosen_tool_call_format(
            config.tool_call_parser, tokenizer.chat_template_source
        ),
        reasoning_parser=chosen_reasoning_parser(
            config.reasoning_parser, tokenizer.chat_template_source
        ),
        is_priority_scheduling=config.engine.scheduler.scheduling_policy == "priority",
        generation_defaults=config.generation_defaults or openai_request.API_DEFAULTS,
        reasoning_effort_budgets=config.reasoning_effort_budgets,
    )
    return ModelOptions(name, served, Conversion.of(options))


def model_parts(
    model: ModelOptions,
    gate: AdmissionGate,
    metrics: ServerMetrics,
    is_running: Callable[[AdmissionGate], bool],
) -> ModelParts:
    """`model`'s parts over its running engine's `gate`; `is_running(gate)`:
    whether that engine still serves it (its stats are shown while it does)."""

    def stats() -> EngineStatsSnapshot | None:
        return gate.engine.stats() if is_running(gate) else None

    model_metrics = metrics.for_model(model.name, stats, model.max_model_len)
    model_metrics.stats = stats  # this start's engine (the metrics outlive it)
    frontend = Frontend(gate, model.tokenizer, observer=model_metrics)
    return ModelParts(model, gate, frontend, model_metrics)

"""The frontend: requests in, detokenized and stop-checked chunks out."""

from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.observer import RequestObserver
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import EventStream, Frontend
from sluice.frontend.stream_output import StreamOutput

__all__ = [
    "ChoiceDelta",
    "EventStream",
    "Frontend",
    "GenerationRequest",
    "PromptInput",
    "RequestObserver",
    "SampledLogprob",
    "StreamOutput",
]

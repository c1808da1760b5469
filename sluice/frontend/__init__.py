"""The frontend: requests in, detokenized and stop-checked chunks out."""

from sluice.frontend.debug import DebugHooks
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.mailbox import Mailbox
from sluice.frontend.observer import RequestObserver
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import Frontend

__all__ = [
    "ChoiceDelta",
    "DebugHooks",
    "Frontend",
    "GenerationRequest",
    "Mailbox",
    "PromptInput",
    "RequestObserver",
    "SampledLogprob",
]

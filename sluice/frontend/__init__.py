"""The frontend: requests in, detokenized and stop-checked chunks out.

Re-exports lazily (`sluice.lazy_exports`): the frontend's modules import
each other, never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
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
__getattr__ = lazy_exports(
    __name__,
    {
        "ChoiceDelta": "sluice.frontend.deltas",
        "SampledLogprob": "sluice.frontend.deltas",
        "RequestObserver": "sluice.frontend.observer",
        "GenerationRequest": "sluice.frontend.request",
        "PromptInput": "sluice.frontend.request",
        "EventStream": "sluice.frontend.serving",
        "Frontend": "sluice.frontend.serving",
        "StreamOutput": "sluice.frontend.stream_output",
    },
)

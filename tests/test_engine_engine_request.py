"""The engine request value: frozen, and equal after the process boundary."""

from __future__ import annotations

import msgspec
import pytest

from sluice.engine.engine_request import (
    EngineRequest,
    Generation,
    Pooling,
    generation_request,
    pooling_request,
)
from sluice.engine.messages import AddRequest, input_decoder, input_encoder
from sluice.engine.pooling_params import PoolingInput, PoolingParams
from sluice.engine.sampling_params import SamplingParams


def test_the_prompt_is_copied_so_the_callers_list_cannot_change_the_request():
    prompt = [5, 6, 7]
    request = generation_request("r", prompt, SamplingParams(max_tokens=3))
    prompt.append(8)
    assert isinstance(request.payload, Generation)
    assert request.payload.prompt_token_ids == (5, 6, 7)


def test_a_request_cannot_be_changed_in_place():
    request = generation_request("r", [1], SamplingParams())
    with pytest.raises(AttributeError):
        request.request_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "request_",
    [
        generation_request("gen", [1, 2, 3], SamplingParams(seed=3, logit_bias={2: 0.5}), "tp"),
        pooling_request("pool", [PoolingInput([1, 2], [0, 1]), PoolingInput([3])],
                        PoolingParams(dimensions=8)),
    ],
)  # fmt: skip
def test_either_payload_crosses_the_wire_as_an_equal_value(request_: EngineRequest):
    received = input_decoder.decode(input_encoder.encode(AddRequest(request_)))
    assert received == AddRequest(request_)
    assert type(received.request.payload) is type(request_.payload)


def test_the_wire_names_the_payload_by_its_tag():
    wire = msgspec.msgpack.decode(
        input_encoder.encode(AddRequest(pooling_request("p", [], PoolingParams())))
    )
    assert wire["type"] == "add" and wire["request"]["payload"]["type"] == "pool"
    assert isinstance(msgspec.convert(wire["request"], EngineRequest).payload, Pooling)

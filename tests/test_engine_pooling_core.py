"""The pooling engine core: a request's inputs answered together, many
requests per step within the token budget, aborts, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from sluice.engine.engine_request import generation_request, pooling_request
from sluice.engine.messages import AbortRequests, AddRequest
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.pooling_core import PoolingCore, engine_core_for
from sluice.engine.pooling_params import PoolingInput, PoolingParams
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.pooling_model import load_pooling_model, pooling_spec_of
from tests.model_factory import make_core
from tests.pooling_models import build_tiny_bert, minilm_folder


@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    minilm = minilm_folder(tmp_path_factory.mktemp("minilm"))
    folder, _ = build_tiny_bert(tmp_path_factory.mktemp("bert"), minilm)
    return folder


@pytest.fixture(scope="module")
def tiny_bert(tiny_bert_folder, tmp_path_factory):
    config = ModelConfig(model=str(tiny_bert_folder), cache_dir=tmp_path_factory.mktemp("cache"))
    spec = pooling_spec_of(config)
    assert spec is not None
    return load_pooling_model(config, spec)


class RecordingRunner:
    """Wraps the real runner: the inputs of each step."""

    def __init__(self, runner):
        self.runner = runner
        self.steps: list[list[list[int]]] = []

    def execute(self, inputs):
        self.steps.append([one.token_ids for one in inputs])
        return self.runner.execute(inputs)


def core_of(loaded, budget=2048, max_seqs=64) -> tuple[PoolingCore, RecordingRunner]:
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs),
        cache=CacheConfig(),
        multiprocess=False,
    )
    core = PoolingCore(config, loaded)
    recorder = RecordingRunner(core.runner)
    core.runner = recorder
    return core, recorder


def inputs_of(*lengths: int, start: int = 1000) -> list[PoolingInput]:
    return [PoolingInput([101] + [start + i] * (n - 2) + [102]) for i, n in enumerate(lengths)]


def run(core: PoolingCore) -> list[RequestDelta]:
    deltas = []
    while core.has_unfinished_requests():
        deltas += core.step()
    return deltas


def vectors(delta: RequestDelta) -> np.ndarray:
    assert delta.pooled is not None
    return np.frombuffer(delta.pooled.data, dtype=np.float32).reshape(delta.pooled.num_inputs, -1)


def test_a_request_spanning_several_steps_finishes_once_with_every_vector_in_order(tiny_bert):
    core, recorder = core_of(tiny_bert, budget=10)
    core.add_request(pooling_request("r", inputs_of(6, 6, 4), PoolingParams()))
    deltas = run(core)
    assert [len(step) for step in recorder.steps] == [1, 2]  # 6, then 6 + 4
    assert [d.request_id for d in deltas] == ["r"] and deltas[0].finish_reason == "stop"
    assert deltas[0].num_prompt_tokens == 16
    alone, _ = core_of(tiny_bert)
    for index, one in enumerate(inputs_of(6, 6, 4)):
        alone.add_request(pooling_request(f"alone{index}", [one], PoolingParams()))
        (delta,) = run(alone)
        assert np.allclose(vectors(delta)[0], vectors(deltas[0])[index], atol=1e-6)


def test_many_requests_share_a_step_up_to_the_budget_and_the_sequence_cap(tiny_bert):
    core, recorder = core_of(tiny_bert, budget=100, max_seqs=3)
    for name in "abcd":
        core.add_request(pooling_request(name, inputs_of(5), PoolingParams()))
    deltas = run(core)
    assert [len(step) for step in recorder.steps] == [3, 1]
    assert [d.request_id for d in deltas] == ["a", "b", "c", "d"]


def test_an_input_longer_than_the_budget_runs_alone(tiny_bert):
    core, recorder = core_of(tiny_bert, budget=8)
    core.add_request(pooling_request("long", inputs_of(20), PoolingParams()))
    core.add_request(pooling_request("short", inputs_of(4), PoolingParams()))
    run(core)
    assert [[len(ids) for ids in step] for step in recorder.steps] == [[20], [4]]


def test_dimensions_cut_each_vector_and_normalize_it_again(tiny_bert):
    core, _ = core_of(tiny_bert)
    core.add_request(pooling_request("r", inputs_of(5, 7), PoolingParams(dimensions=8)))
    (delta,) = run(core)
    cut = vectors(delta)
    assert cut.shape == (2, 8)
    assert np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-6)


def test_an_aborted_request_leaves_the_queue_with_an_abort_delta(tiny_bert):
    core, recorder = core_of(tiny_bert)
    deltas: list[RequestDelta] = []
    errors: list[EngineError] = []
    core.handle(AddRequest(pooling_request("r", inputs_of(5), PoolingParams())), deltas, errors)
    core.handle(AbortRequests(["r"]), deltas, errors)
    assert [(d.request_id, d.finish_reason, d.pooled) for d in deltas] == [("r", "abort", None)]
    assert not core.has_unfinished_requests() and not recorder.steps


def test_the_pooling_core_refuses_generation_and_inputs_it_cannot_run(tiny_bert):
    core, _ = core_of(tiny_bert)
    deltas: list[RequestDelta] = []
    errors: list[EngineError] = []
    core.handle(AddRequest(generation_request("gen", [1, 2], SamplingParams())), deltas, errors)
    core.handle(AddRequest(pooling_request("none", [], PoolingParams())), deltas, errors)
    core.handle(AddRequest(pooling_request("long", inputs_of(65), PoolingParams())), deltas, errors)
    assert [e.request_id for e in errors] == ["gen", "none", "long"]
    assert "pooling model" in errors[0].message
    assert "65 tokens" in errors[2].message and "1 to 64" in errors[2].message
    assert not core.has_unfinished_requests()


def test_the_generation_core_refuses_a_pooling_request(tiny_loaded):
    core = make_core(tiny_loaded)
    deltas: list[RequestDelta] = []
    errors: list[EngineError] = []
    core.handle(AddRequest(pooling_request("p", inputs_of(3), PoolingParams())), deltas, errors)
    assert [e.request_id for e in errors] == ["p"] and "does not embed" in errors[0].message
    assert not core.has_unfinished_requests()


def test_the_engine_builds_the_pooling_core_for_a_pooling_model(tiny_bert_folder, tmp_path):
    model = ModelConfig(model=str(tiny_bert_folder), cache_dir=tmp_path)
    core = engine_core_for(EngineConfig(model=model, multiprocess=False))
    assert isinstance(core, PoolingCore)
    assert core.info.pooling == pooling_spec_of(model) and core.info.max_model_len == 64

"""The sampling fields are declared once (sampling/params.py); everything that lists them derives from
that declaration: the compiled step's per-row arrays, every wire format's body, the CLI flags, the
seed's vSurgeRequest and what generation defaults may set."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vsurge.cli import build_parser
from vsurge.sampling.defaults import GenerationDefaults
from vsurge.ops.sampling import SamplingArrays
from vsurge.sampling.params import FIELD_NAMES, SamplingParams, cli_fields, device_columns, knob_of, wire_fields
from vsurge.server.adapters.chat import ChatCompletionRequest
from vsurge.server.adapters.completions import CompletionRequest
from vsurge.server.adapters.messages import MessagesRequest
from vsurge.server.adapters.responses import ResponsesRequest
from vsurge.vsurge import vSurgeRequest


def test_device_columns_are_the_sampling_arrays():
    names = [f.name for f in dataclasses.fields(SamplingArrays)]
    assert names == [name for name, _, _ in device_columns()] + ["key_data"]
    arrays = SamplingArrays.from_params([SamplingParams(temperature=0.5, top_k=3), SamplingParams()], [1, 2])
    assert arrays.temperature.tolist() == [0.5, 1.0] and arrays.top_k.tolist() == [3, 0]
    neutral = SamplingArrays.neutral(2)
    assert all(getattr(neutral, name).tolist() == [value] * 2 for name, _, value in device_columns())


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest, ResponsesRequest, MessagesRequest])
def test_every_wire_format_carries_every_wire_field(model):
    assert set(wire_fields()) <= set(model.model_fields)


def test_cli_flags_and_vsurge_request_follow_the_schema():
    parser = build_parser()
    generate = next(a for a in parser._subparsers._group_actions[0].choices["generate"]._actions
                    if a.dest == "temperature")
    assert generate.option_strings == list(knob_of("temperature").cli)
    flags = {a.dest for a in parser._subparsers._group_actions[0].choices["chat"]._actions}
    assert {name for name, _, _ in cli_fields()} <= flags
    assert set(FIELD_NAMES) <= {f.name for f in dataclasses.fields(vSurgeRequest)}
    request = vSurgeRequest("hi", 4, priority=2, stop="x")  # a field beyond the seed's, by keyword
    params = request.to_sampling_params()
    assert (params.priority, params.stop, params.temperature) == (2, ["x"], 0.7)  # the seed's temperature
    assert vSurgeRequest.from_sampling_params("hi", params).to_sampling_params() == params


def test_generation_defaults_take_any_field_and_checks_name_it():
    defaults = GenerationDefaults(presence_penalty=0.5)
    assert defaults.sampling_params().presence_penalty == 0.5 and defaults.top_k == 40
    with pytest.raises(ValueError, match="unknown sampling field"):
        GenerationDefaults(typical=1)
    with pytest.raises(ValueError, match="top_p must be in") as info:
        SamplingParams(top_p=3)
    assert info.value.param == "top_p"


EXTREMES = [2**31, -(2**31) - 1, 10**12, 10**30, 1e300, -1e300, 1e-40, 3.5e38]


@pytest.mark.parametrize("name", [name for name, _, _ in device_columns()])
def test_every_device_field_is_refused_by_name_or_fits_its_array(name):
    """A value the schema accepts never overflows the compiled step's per-row array (issue 63: top_k
    2^31 raised OverflowError in the engine thread and took the server down); one it cannot hold is a
    ParamError naming the field."""
    for value in EXTREMES:
        try:
            params = SamplingParams(**{name: value})
        except ValueError as exc:
            assert exc.param == name, (name, value, exc)
            continue
        with np.errstate(over="raise"):
            column = getattr(SamplingArrays.from_params([params], [0]), name)
        assert np.all(np.isfinite(column)), (name, value, column)


def test_top_k_beyond_any_vocabulary_clamps_and_counts_are_bounded():
    assert SamplingParams(top_k=2**31).top_k == SamplingParams(top_k=10**12).top_k == 2**31 - 1
    assert SamplingParams(temperature=1e-40).temperature == 0.01  # (vLLM's floor: no inf logits)
    for field, value in [("max_tokens", 2**31), ("n", 17), ("stop_token_ids", [2**40]), ("logit_bias", {"-1": 1}),
                         ("logit_bias", {str(10**12): 1}), ("seed", 2**63), ("logprobs", 10**12),
                         ("prompt_logprobs", -1), ("speculative_tokens", 2**31), ("priority", 2**63)]:
        with pytest.raises(ValueError) as info:
            SamplingParams(**{field: value})
        assert info.value.param == field, (field, value)

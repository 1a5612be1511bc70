"""The sampling fields are declared once (sampling_params.py); everything that lists them derives from
that declaration: the compiled step's per-row arrays, every wire format's body, the CLI flags, the
seed's vSurgeRequest and what generation defaults may set."""

from __future__ import annotations

import dataclasses

import pytest

from vsurge.cli import build_parser
from vsurge.generation_defaults import GenerationDefaults
from vsurge.ops.sampling import SamplingArrays
from vsurge.sampling_params import FIELD_NAMES, SamplingParams, cli_fields, device_columns, knob_of, wire_fields
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

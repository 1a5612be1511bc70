"""OpenAI-compatible request bodies (pydantic) and their mapping onto SamplingParams.

Unknown fields are ignored, as OpenAI and vLLM do; fields we know but do not
implement (tools, response_format, ...) are refused with 501 by the app.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ..generation_defaults import OPENAI_DEFAULTS, GenerationDefaults
from ..sampling_params import SamplingParams

MAX_STOP = 16
TOP_LOGPROBS_LIMIT = 20

# Fields clients may send that vsurge does not implement: a clear 501 beats silently ignoring them.
# (response_format, guided_*, structured_outputs, tools and tool_choice are read by
# structured/openai_fields.py.)
UNSUPPORTED_FIELDS = ("functions", "function_call", "suffix", "prediction", "audio", "modalities", "best_of")


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Optional[Union[StrictStr, list[TextPart]]] = None
    name: Optional[StrictStr] = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=100.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(default=None, ge=-1)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0, le=100.0)
    stop: Optional[Union[StrictStr, Annotated[list[StrictStr], Field(max_length=MAX_STOP)]]] = None
    stop_token_ids: Optional[list[Annotated[int, Field(ge=0)]]] = None
    seed: Optional[Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]] = None
    n: StrictInt = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    user: Optional[StrictStr] = None

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int],
                        defaults: Optional[GenerationDefaults] = None) -> SamplingParams:
        """The request's fields over `defaults` (`vsurge serve --generation-config`; None: OpenAI's own
        defaults) for the sampling fields it leaves unset. Raises ValueError (-> 400) for values
        SamplingParams refuses."""
        logit_bias = None
        if self.logit_bias:
            try:
                logit_bias = {int(k): v for k, v in self.logit_bias.items()}
            except ValueError:
                raise ValueError("logit_bias keys must be token ids (integers)") from None
        return (defaults or OPENAI_DEFAULTS).sampling_params(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            n=self.n,
            skip_special_tokens=self.skip_special_tokens,
            logprobs=logprobs,
            logit_bias=logit_bias,
        )


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=TOP_LOGPROBS_LIMIT)
    add_generation_prompt: bool = True


class CompletionRequest(_SamplingFields):
    prompt: Union[StrictStr, Annotated[list[StrictStr], Field(min_length=1)],
                  Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)],
                  Annotated[list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
                            Field(min_length=1)]]
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=TOP_LOGPROBS_LIMIT)
    echo: bool = False


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    prompt: Optional[StrictStr] = None
    text: Optional[StrictStr] = None


CountTokenRequest = CountTokensRequest  # the seed's name


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    tokens: list[Annotated[int, Field(ge=0)]]


def messages_as_dicts(messages: list[ChatMessage]) -> list[dict]:
    out = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": m.role, "content": content or ""}
        extra = m.model_extra or {}
        for key in ("tool_calls", "tool_call_id"):  # a tool-calling conversation's history
            if extra.get(key) is not None:
                message[key] = extra[key]
        out.append(message)
    return out

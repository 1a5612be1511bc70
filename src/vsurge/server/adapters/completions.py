"""POST /v1/completions (OpenAI's legacy API): prompts -> GenerationRequest; output through generation.py.

`echo` puts the prompt before each choice's text; with `logprobs` too, the prompt's tokens
get log-probabilities (the first has none), as OpenAI's API did. vLLM's `prompt_logprobs`
returns them beside the choice instead. `max_tokens: 0` with `echo` scores the prompt and
generates nothing. `suffix` is fill-in-the-middle, for models whose tokenizer has FIM tokens
(Qwen2.5-Coder's <|fim_prefix|>..., StarCoder's <fim_prefix>...): prefix, suffix, middle order.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from pydantic import StrictStr

from ...engine.request import ReturnSample
from ...engine.validation import check_prompt
from ...structured.errors import ParamError
from ..errors import APIError
from ..formatting import Formatter
from ..generation import ChoiceStreams
from ..protocol import StreamOptions, WholeInt
from ..routes import GUARDED, Route
from .chat import UNSUPPORTED_FIELDS as CHAT_UNSUPPORTED
from .chat import StructuredFields, check_stream_options
from .common import (LARGE_INPUT_CHARS, GenerationRequest, as_api_error, compile_constraint, first_set,
                     prompt_items, sampling_params, unsupported)

OPENAI_MAX_TOKENS = 16  # OpenAI's default for completions
UNSUPPORTED_FIELDS = tuple(name for name in CHAT_UNSUPPORTED if name != "suffix")  # suffix: fill-in-the-middle
# fill-in-the-middle tokens: Qwen2.5-Coder's, then StarCoder's (prefix, suffix, middle)
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


class CompletionRequest(StructuredFields):
    model: Optional[StrictStr] = None
    # a string, strings, token ids or token-id lists (common.prompt_items checks it, with clearer
    # messages than a pydantic union's); required, and null is OpenAI's default: <|endoftext|> (end_of_text)
    prompt: Optional[Any] = None
    suffix: Optional[StrictStr] = None  # fill-in-the-middle: the text after the completion
    logprobs: Optional[WholeInt] = None
    echo: Optional[bool] = None  # None: false
    stream: Optional[bool] = None  # None: false
    stream_options: Optional[StreamOptions] = None
    user: Optional[StrictStr] = None


def fim_token_ids(processor) -> tuple[int, int, int] | None:
    """(prefix, suffix, middle) ids of the tokenizer's fill-in-the-middle tokens, or None without them."""
    unk = getattr(processor, "unk_token_id", None)
    for names in FIM_TOKENS:
        ids = [processor.convert_tokens_to_ids(name) for name in names]
        if all(isinstance(i, int) and i != unk for i in ids):
            return tuple(ids)
    return None


def _encode_all(processor, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    return [processor.encode(t, add_special_tokens=add_special_tokens) for t in texts]


def end_of_text(processor) -> list[int]:
    """OpenAI's default prompt, `<|endoftext|>`: a document boundary, from which a model writes a new
    document. The tokenizer's own `<|endoftext|>` where it has one, else its BOS token, else its EOS."""
    unk = getattr(processor, "unk_token_id", None)
    found = processor.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(found, int) and found != unk:
        return [found]
    for token in (getattr(processor, "bos_token_id", None), getattr(processor, "eos_token_id", None)):
        if isinstance(token, int):
            return [token]
    raise APIError(400, "this model's tokenizer has no end-of-text, BOS or EOS token to stand for a null "
                        "prompt: give a prompt", "prompt")


async def prompt_token_lists(surge, prompt, suffix: str | None = None) -> list[list[int]]:
    """The prompts' token ids; with a suffix, each as fill-in-the-middle: prefix tokens, the prompt,
    suffix tokens, the suffix, the middle token (the model writes what goes between). A null prompt
    is OpenAI's default, one `<|endoftext|>` (end_of_text)."""
    if prompt is None:
        prompt = [end_of_text(surge.processor)]
    try:
        items = prompt_items(prompt, "prompt")
    except ParamError as exc:
        raise as_api_error(exc) from None
    processor = surge.processor
    fim = None
    if suffix is not None:
        fim = fim_token_ids(processor)
        if fim is None and suffix:
            raise APIError(400, "suffix (fill-in-the-middle) needs a model whose tokenizer has FIM tokens "
                                "(<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or <fim_prefix> ...); this "
                                "model's has none", "suffix", code="unsupported_parameter")
    if isinstance(items[0], list):
        ids = items
    else:
        if any(p == "" for p in items) and fim is None:
            raise APIError(400, "the prompt is empty", "prompt")
        large = sum(len(p) for p in items) > LARGE_INPUT_CHARS
        special = fim is None  # a FIM prompt's special tokens are placed below
        ids = await asyncio.to_thread(_encode_all, processor, items, special) if large else \
            _encode_all(processor, items, special)
    if fim is None:
        return ids
    prefix, middle = fim[0], fim[2]
    head = [] if isinstance(items[0], list) else processor.encode("")  # e.g. BOS, where the tokenizer adds one
    tail = [fim[1], *processor.encode(suffix, add_special_tokens=False), middle]
    return [[*head, prefix, *p, *tail] for p in ids]


class PromptOnlyStreams(ChoiceStreams):
    """`max_tokens: 0` with `echo`: the prompt (scored, with logprobs if asked) and nothing generated;
    each choice ends at once with finish_reason "length", as OpenAI's and vLLM's prompt scoring."""

    def start(self) -> None:
        pass

    async def updates(self):
        for p, ids in enumerate(self.prompts):
            for i in range(self.params.n):
                yield p * self.params.n + i, ReturnSample(
                    text="", token_ids=[], accumulated_text="", tokens_per_second=0.0, num_generated_tokens=0,
                    time_spent_computing=0.0, finish_reason="length", index=i, prompt_tokens=len(ids),
                    logprobs=[] if self.params.logprobs is not None else None)


def scores_prompt_only(body: CompletionRequest) -> bool:
    """`max_tokens: 0` with `echo`: prompt scoring (without echo, max_tokens 0 stays a 400)."""
    return body.max_tokens == 0 and bool(body.echo)


async def to_request(server, body: CompletionRequest, surge) -> GenerationRequest:
    if body.tools:
        raise APIError(400, "tools need /v1/chat/completions", "tools")
    if body.echo and body.suffix is not None:
        raise APIError(400, "echo cannot be combined with suffix", "echo")
    try:
        structured = body.structured()
        defaults = server.defaults_for(surge)
        max_tokens = 1 if scores_prompt_only(body) else first_set(body.max_tokens, defaults and defaults.max_tokens,
                                                                  OPENAI_MAX_TOKENS)
        params = sampling_params(body, defaults, prompt_logprobs=True, max_tokens=max_tokens,
                                 logprobs=body.logprobs, structured=structured.constraint)
    except ParamError as exc:
        raise as_api_error(exc) from None
    if "prompt" not in body.model_fields_set:  # null is a prompt (the default one); no prompt is not
        raise APIError(400, "'prompt' is a required field", "prompt", code="missing_required_parameter")
    structured = await compile_constraint(structured, surge)
    prompts = await prompt_token_lists(surge, body.prompt, body.suffix)
    return GenerationRequest(prompts, params, structured, chat=False)


async def respond(server, body: CompletionRequest):
    unsupported(body, UNSUPPORTED_FIELDS)
    check_stream_options(body)
    surge = await server.surge_for(body.model)
    request = await to_request(server, body, surge)
    prompt_only = scores_prompt_only(body)
    if prompt_only:
        try:
            for ids in request.prompts:
                check_prompt(surge.engine, ids)
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc), "prompt") from None
    echo = [surge.processor.decode(ids) for ids in request.prompts] if body.echo else None
    fmt = Formatter("completion", server.name_of(surge), surge.processor)
    params, echo_logprobs, prompt_logprobs = request.params, None, None
    if params.prompt_logprobs is not None or (body.echo and params.logprobs is not None):
        try:  # the prompts' own log-probabilities: one batched pass before generating
            scores = await surge.encode(request.prompts, "score")
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc), "prompt") from None
        except RuntimeError as exc:
            raise APIError(503, f"prompt logprobs failed: {exc}") from None
        if body.echo and params.logprobs is not None:
            echo_logprobs = [fmt.prompt_entries(ids, sc, params.logprobs) for ids, sc in zip(request.prompts, scores)]
        if params.prompt_logprobs is not None:
            prompt_logprobs = [fmt.prompt_logprobs(ids, sc, params.prompt_logprobs)
                               for ids, sc in zip(request.prompts, scores)]
    streams = (PromptOnlyStreams if prompt_only else ChoiceStreams)(
        surge, request.prompts, params, echo, echo_logprobs=echo_logprobs, prompt_logprobs=prompt_logprobs)
    return await server.respond(streams, fmt, body)


# the routes this adapter answers (app.py installs every adapter module's ROUTES)
ROUTES = (Route("POST", "/v1/completions", GUARDED, respond, "completions"),)

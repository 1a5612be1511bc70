"""A tiny random model served with a thinking chat template (`--reasoning-parser qwen3`) and priority
scheduling (`--scheduling-policy priority`, 2 slots), as a real `vsurge serve` on loopback.

Reasoning: the output is forced by a regex grammar to be `<think>letters</think>letters`, so the
split is deterministic; the same prompt and grammar through /v1/completions (which splits nothing)
gives the raw text the chat, Responses and Messages splits must reproduce. `enable_thinking` is
checked against transformers' own rendering of the template. Priority: with both slots busy, a
high-priority request's first token beats the low-priority ones queued before it."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time

import anthropic
import httpx
import pytest

from anthropic_checks import check_message, stream_events
from openai_schemas import CHUNK_FINISH, check
from server_process import ServerProcess, client_for
from tiny_models import write_tiny_model

NAME = "thinker"
# Qwen3's thinking switch, on ChatML: with enable_thinking false the template closes an empty think block
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
FORCED = r"<think>[a-z]{4,10}</think>[a-z]{4,10}"
QUESTION = [{"role": "user", "content": "Think, then answer."}]
GRAMMAR = {"structured_outputs": {"regex": FORCED}}


@pytest.fixture(scope="module")
def thinking_dir(tmp_path_factory, default_processor_dir):
    folder = tmp_path_factory.mktemp("thinking_model")
    write_tiny_model("llama", folder, default_processor_dir, seed=3)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = THINKING_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    model_config = json.loads((folder / "config.json").read_text())
    model_config["max_position_embeddings"] = 1024  # room for the priority test's long streams
    (folder / "config.json").write_text(json.dumps(model_config))
    return folder


@pytest.fixture(scope="module")
def server(thinking_dir, cache_dir):
    server = ServerProcess(str(thinking_dir), "--served-model-name", NAME, "--reasoning-parser", "qwen3",
                           "--scheduling-policy", "priority", "--max-concurrent-decodes", "2", "--max-length", "1024",
                           "--max-prefill-length", "64", "--prefill-lengths", "64", cache_dir=cache_dir).wait_ready()
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def raw(server):
    """The forced output as generated: (reasoning, content) cut from the completions text."""
    ids = server.post("/tokenize", json={"messages": QUESTION}).json()["tokens"]
    text = client_for(server).completions.create(model=NAME, prompt=ids, max_tokens=40, temperature=0,
                                                 extra_body=GRAMMAR).choices[0].text
    match = re.fullmatch(r"<think>([a-z]+)</think>([a-z]+)", text)
    assert match, text
    return match.group(1), match.group(2)


def test_chat_splits_reasoning_content_whole_and_streamed(server, raw):
    client = client_for(server)
    whole = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=40, temperature=0,
                                           extra_body=GRAMMAR).model_dump()
    message = whole["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == raw
    chunks = list(client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=40, temperature=0,
                                                 stream=True, extra_body=GRAMMAR))
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == raw
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_content:])  # reasoning comes first


def test_responses_emit_a_reasoning_item_then_the_message(server, raw):
    client = client_for(server)
    response = client.responses.create(model=NAME, input=QUESTION, max_output_tokens=40, temperature=0,
                                       extra_body=GRAMMAR)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == raw[0]
    assert message.type == "message" and response.output_text == raw[1]
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model=NAME, input=QUESTION, max_output_tokens=40, temperature=0,
                                 extra_body=GRAMMAR) as stream:
        kinds = [event.type for event in stream]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")


def test_messages_emit_a_thinking_block_then_text(server, raw):
    client = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    body = dict(model=NAME, max_tokens=40, messages=QUESTION, extra_body={"temperature": 0, **GRAMMAR})
    message = client.messages.create(**body)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == raw
    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert (final.content[0].thinking, final.content[1].text) == raw


def test_reasoning_output_fits_openais_schemas(server, raw):
    """Chat's reasoning_content (an extension the spec's objects allow) and Responses' reasoning item and
    reasoning_text events, whole and streamed, against OpenAI's spec (tests/openai_schemas.py)."""
    chat = {"model": NAME, "messages": QUESTION, "max_tokens": 40, "temperature": 0, **GRAMMAR}
    check("CreateChatCompletionResponse", server.post("/v1/chat/completions", json=chat).json())
    responses = {"model": NAME, "input": QUESTION, "max_output_tokens": 40, "temperature": 0, **GRAMMAR}
    whole = server.post("/v1/responses", json=responses).json()
    check("Response", whole)
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message"]
    for path, body, schema, skip in (("/v1/chat/completions", chat, "CreateChatCompletionStreamResponse",
                                      (CHUNK_FINISH,)), ("/v1/responses", responses, "ResponseStreamEvent", ())):
        with httpx.stream("POST", server.base + path, json={**body, "stream": True}, timeout=120) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert events
        for event in events:
            check(schema, event, skip=skip)


def test_newest_anthropic_sdk_thinking_blocks_and_deltas(server, raw):
    """The newest SDK's `thinking` (enabled with a budget, adaptive) and `output_config.effort`: thinking
    blocks and thinking_delta events, checked by the SDK's own types with no field they lack; the
    header names what this template cannot honour (it reads enable_thinking, not reasoning_effort)."""
    client = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    body = dict(model=NAME, max_tokens=40, messages=QUESTION, extra_body={"temperature": 0, **GRAMMAR},
                output_config={"effort": "low"})
    for thinking, ignored in (({"type": "enabled", "budget_tokens": 1024}, "output_config.effort, "
                                                                           "thinking.budget_tokens"),
                              ({"type": "adaptive"}, "output_config.effort")):
        reply = client.messages.with_raw_response.create(**body, thinking=thinking)
        assert reply.headers["x-vsurge-ignored"] == ignored
        message = check_message(reply.http_response.json())
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert (message.content[0].thinking, message.content[1].text) == raw
    wire = {"model": NAME, "max_tokens": 40, "messages": QUESTION, "temperature": 0, **GRAMMAR,
            "thinking": {"type": "adaptive"}}
    events, headers = stream_events(server.base, wire)
    assert "x-vsurge-ignored" not in headers
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta") == raw[0]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == raw[1]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]


def test_enable_thinking_reaches_the_template(server, thinking_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(thinking_dir))
    texts = {flag: reference.apply_chat_template(QUESTION, add_generation_prompt=True, enable_thinking=flag,
                                                  tokenize=False) for flag in (True, False)}
    counts = {flag: len(reference(text, add_special_tokens=False)["input_ids"]) for flag, text in texts.items()}
    assert counts[False] > counts[True]
    client = client_for(server)
    for flag in (True, False):
        reply = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=2, temperature=0,
                                               extra_body={"chat_template_kwargs": {"enable_thinking": flag}})
        assert reply.usage.prompt_tokens == counts[flag]
    claude = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    off = claude.messages.create(model=NAME, max_tokens=2, messages=QUESTION, thinking={"type": "disabled"})
    assert off.usage.input_tokens == counts[False]
    # thinking switched off: the prompt closed the think block, so the answer is all content
    plain = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=12, temperature=0, extra_body={
        "chat_template_kwargs": {"enable_thinking": False}, "structured_outputs": {"regex": "[a-z]{4,8}"}})
    assert plain.choices[0].message.content and getattr(plain.choices[0].message, "reasoning_content", None) is None
    r = server.post("/v1/chat/completions", json={"messages": QUESTION, "chat_template_kwargs": {"messages": []}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs.messages"


def test_a_high_priority_request_overtakes_the_queue(server):
    """Both slots run long low-priority streams; two more low-priority requests queue; then one high-priority
    request arrives. Its first token must come before either queued low one's (it preempts a running one).
    The long streams are 900 tokens so that they outlast the round (at 200 a fast CPU finished them while the
    urgent request was on its way, and the queued ones were admitted first); should they still end before the
    urgent request arrives, the queued ones start without waiting, nothing is tested, and the round runs again."""
    url = server.base + "/v1/completions"

    def round_of_requests():
        first_token: dict[str, float] = {}  # time to first token of each request
        first_at: dict[str, float] = {}  # when it came
        began: dict[str, float] = {}
        started = threading.Barrier(3)

        def stream(name: str, priority: int, max_tokens: int, wait: threading.Barrier | None = None):
            body = {"model": NAME, "prompt": f"go {name}", "max_tokens": max_tokens, "temperature": 0,
                    "stream": True, "ignore_eos": True, "priority": priority}
            began[name] = time.perf_counter()
            with httpx.stream("POST", url, json=body, timeout=120) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: {") and name not in first_token:
                        first_at[name] = time.perf_counter()
                        first_token[name] = first_at[name] - began[name]
                        if wait is not None:
                            wait.wait()
            return name

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            running = [pool.submit(stream, f"long{i}", 5, 900, started) for i in range(2)]
            started.wait(timeout=60)  # both slots are generating
            queued = [pool.submit(stream, f"queued{i}", 5, 4) for i in range(2)]
            deadline = time.time() + 10  # they are waiting for a slot (a fixed pause let the long ones finish
            while server.metric("vsurge:num_requests_waiting") < 2 and time.time() < deadline:  # on a fast CPU)
                time.sleep(0.01)
            urgent = pool.submit(stream, "urgent", -5, 4)
            for future in running + queued + [urgent]:
                future.result(timeout=120)
        return first_token, first_at, began

    before = server.metric("vsurge:num_preemptions_total")
    for _ in range(3):
        first_token, first_at, began = round_of_requests()
        if min(first_at["queued0"], first_at["queued1"]) > began["urgent"]:  # they were still waiting
            break
    else:
        pytest.fail(f"in 3 rounds the queued requests never waited until the urgent one came: {first_at}")
    assert first_token["urgent"] < min(first_token["queued0"], first_token["queued1"]), first_token
    assert first_at["urgent"] < min(first_at["queued0"], first_at["queued1"]), first_at  # it overtook them
    assert server.metric("vsurge:num_preemptions_total") > before

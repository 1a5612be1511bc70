"""One adapter per wire format: its request body -> the one internal request, and the engine's
updates -> its wire events.

    chat.py         POST /v1/chat/completions   (OpenAI)
    completions.py  POST /v1/completions        (OpenAI, legacy)
    responses.py    POST /v1/responses          (OpenAI Responses; response_store.py keeps them)
    messages.py     POST /v1/messages           (Anthropic Messages)
    embeddings.py   POST /v1/embeddings         (OpenAI)

common.py holds what they share: the sampling fields every body carries (generated from
sampling/params.py), `GenerationRequest` (token ids + SamplingParams + structured output
and tools) and each choice's OutputParser (reasoning, content, tool calls).
"""

"""A greedy request's tokens do not depend on the load around it (issue 60): the block kernel makes the
model's passes (ops/quantized.py `activation_passes`) in every row of every step, so the README's own
question gets the same answer alone and among other streams. On the real `vsurge serve` of the default
model (the shared default server: 8 slots), through the openai SDK."""

from __future__ import annotations

import concurrent.futures

from server_process import DEFAULT_NAME, client_for

QUESTION = "What is the capital of France?"
OTHERS = ["Name three primary colors.", "Write a haiku about autumn leaves.", "What is 12 times 7?",
          "Say hello in Spanish.", "Explain in one sentence why the sky is blue.", "List two ocean animals.",
          "Give me a synonym for happy.", "What is the boiling point of water?", "Name a planet.",
          "Translate 'thank you' into French.", "What color is grass?", "Count from one to five.",
          "Who wrote Romeo and Juliet?", "Name a fruit that starts with B.", "What is the largest ocean?"]
TOKENS = 16


def ask(client, question: str) -> str:
    reply = client.chat.completions.create(model=DEFAULT_NAME, messages=[{"role": "user", "content": question}],
                                           max_tokens=TOKENS, temperature=0)
    return reply.choices[0].message.content


def test_the_readme_question_answers_alike_alone_and_among_15_streams(default_server):
    client = client_for(default_server)
    alone = {q: ask(client, q) for q in (QUESTION, *OTHERS[:3])}
    assert "Paris" in alone[QUESTION], alone[QUESTION]
    with concurrent.futures.ThreadPoolExecutor(len(OTHERS) + 1) as pool:
        # the others first: the question's prompt and its decode steps share steps with up to 7 streams
        crowd = {q: pool.submit(ask, client, q) for q in (*OTHERS, QUESTION)}
        crowd = {q: f.result() for q, f in crowd.items()}
    assert {q: crowd[q] for q in alone} == alone

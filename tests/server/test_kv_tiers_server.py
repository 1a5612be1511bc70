"""`vsurge serve --kv-cache-dir`: a restarted server answers a cached prompt without prefilling its
pages (a real server process on loopback, a tiny random-weight model, the openai client)."""

from __future__ import annotations

import json

import pytest

from server_process import ServerProcess, client_for

PAGE = 16
ARGS = ("--max-concurrent-decodes", "2", "--max-length", "256", "--prefill-tokens", "64", "--prefill-lengths", "32",
        "--page-size", str(PAGE), "--num-pages", "32")
PROMPT = "Tides follow the moon, and sailors read them from tables printed every year. " * 8
NOTES = "A lighthouse keeper writes down the weather at dawn, noon and dusk in a leather book. " * 6


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, default_processor_dir):
    from tiny_models import write_tiny_model

    folder = tmp_path_factory.mktemp("tiny_llama_kv_dir")
    write_tiny_model("llama", folder, default_processor_dir)
    return folder


def labelled(server, name: str, **labels) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def complete(server, prompt=PROMPT):
    client = client_for(server)
    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0.0)
    return out.choices[0].text, out.usage.prompt_tokens


def slot(server, action, **body):
    response = server.post(f"/v1/cache/{action}", json=body)
    return response.status_code, response.json()


def test_a_restarted_server_reads_the_prompt_from_its_cache_dir(tiny_dir, tmp_path, cache_dir):
    kv_dir = tmp_path / "kv"
    first = ServerProcess(str(tiny_dir), *ARGS, "--kv-cache-dir", str(kv_dir), cache_dir=cache_dir).wait_ready()
    try:
        text, prompt_tokens = complete(first)
        assert labelled(first, "vsurge:kv_tier_hits_total", tier="disk") == 0  # nothing there yet
        status, saved = slot(first, "save", name="notes", prompt=NOTES)  # a named prompt cache
        assert status == 200 and saved["pages"] == (saved["prompt_tokens"] - 1) // PAGE >= 5, saved
        for body, code, what in ((dict(name="../up", prompt=NOTES), 400, "'name'"), (dict(name="x"), 400, "prompt"),
                                 (dict(name="x", prompt=NOTES, extra=1), 400, "extra")):
            status, error = slot(first, "save", **body)
            assert status == code and what in error["error"]["message"], error
        status, error = slot(first, "restore", name="never-saved")
        assert status == 404 and "never-saved" in error["error"]["message"]
    finally:
        assert first.stop() == 0  # a clean stop writes what is still queued
    pages = (prompt_tokens - 1) // PAGE
    assert pages >= 8 and len(list(kv_dir.rglob("*.kvp"))) >= pages
    again = ServerProcess(str(tiny_dir), *ARGS, "--kv-cache-dir", str(kv_dir), cache_dir=cache_dir).wait_ready()
    try:
        assert complete(again) == (text, prompt_tokens)  # the same greedy text
        # every full page of the prompt came from disk: only the last partial page was prefilled
        assert labelled(again, "vsurge:kv_tier_hits_total", tier="disk") == pages * PAGE
        assert labelled(again, "vsurge:prefix_cache_hits_total") == pages * PAGE
        assert labelled(again, "vsurge:kv_tier_bytes_total", direction="from_disk") > 0
        stats = again.get("/v1/stats").json()["models"][0]
        assert stats["kv_tier_hits"]["disk"] == pages * PAGE
        # the cache lost the saved prompt's pages (LRU, say): a restore brings them back from the slot
        manifest = json.loads(next(kv_dir.rglob("notes/slot.json")).read_text())
        for key in manifest["keys"]:
            next(p for p in kv_dir.glob(f"*/{key}.kvp")).unlink()
        assert slot(again, "restore", name="notes") == (200, {"object": "cache.slot", "name": "notes",
                                                             "pages": saved["pages"]})
        complete(again, NOTES)
        # its whole pages, and the part of its last page the save computed (the disk tier's tail)
        hits = labelled(again, "vsurge:kv_tier_hits_total", tier="disk") - pages * PAGE
        assert saved["pages"] * PAGE < hits < (saved["pages"] + 1) * PAGE
        assert slot(again, "erase", name="notes")[0] == 200
        assert slot(again, "erase", name="notes")[0] == 404
    finally:
        again.stop()

"""Images over HTTP: `vsurge serve` on a tiny random Idefics3 (SmolVLM) checkpoint, images sent as base64
through the real `openai` (chat and Responses) and `anthropic` SDKs reach the model (HF's greedy tokens,
the image tokens counted in usage); a second turn about the same image hits the prefix cache; bad
images are each their API's 4xx while the server keeps serving."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import anthropic
import httpx
import openai
import pytest

from server_process import ENV, ServerProcess, client_for
from test_images import PROMPT_ONE, hf_greedy, png
from tiny_vlm import SMOLVLM_TEMPLATE, write_tiny_idefics3

STEPS = 6


@pytest.fixture(scope="module")
def vlm_setup(tmp_path_factory, default_processor_dir):
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    folder = tmp_path_factory.mktemp("idefics3_server")
    torch_model = write_tiny_idefics3(folder, default_processor_dir)
    hf_processor = transformers.Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(folder),
                                                  transformers.AutoTokenizer.from_pretrained(folder), image_seq_len=4,
                                                  chat_template=SMOLVLM_TEMPLATE)
    return folder, torch_model, hf_processor


@pytest.fixture(scope="module")
def server(vlm_setup, cache_dir, tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    (media / "cat.png").write_bytes(png(50, 90, 1))
    server = ServerProcess(str(vlm_setup[0]), "--served-model-name", "vlm", "--dtype", "float32",
                           "--max-concurrent-decodes", "4", "--max-length", "256", "--prefill-lengths", "32",
                           "--allowed-local-media-path", str(media), "--max-images-per-request", "3",
                           cache_dir=cache_dir).wait_ready()
    server.media = media
    yield server
    assert server.stop() == 0


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat_parts(data: bytes, text: str = "Describe this") -> list[dict]:
    return [{"type": "image_url", "image_url": {"url": data_uri(data)}}, {"type": "text", "text": text}]


def metric(server, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def test_an_image_reaches_the_model_through_every_sdk(server, vlm_setup):
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    _, torch_model, hf_processor = vlm_setup
    image = png(50, 90, 1)
    want_ids = hf_greedy(torch_model, hf_processor, PROMPT_ONE, [image], STEPS)
    want = hf_processor.tokenizer.decode(want_ids)
    client = client_for(server)
    chat = client.chat.completions.create(model="vlm", messages=[{"role": "user", "content": chat_parts(image)}],
                                          max_tokens=STEPS, temperature=0.0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == want
    assert chat.usage.prompt_tokens == len(hf_processor(text=[PROMPT_ONE], images=[[_pil(image)]])["input_ids"][0])

    response = client.responses.create(model="vlm", input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_uri(image)}, {"type": "input_text", "text": "Describe this"}]}],
        max_output_tokens=STEPS, temperature=0.0, extra_body={"ignore_eos": True})
    assert response.output_text == want

    claude = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    message = claude.messages.create(model="vlm", max_tokens=STEPS, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(image).decode()}},
        {"type": "text", "text": "Describe this"}]}], extra_body={"ignore_eos": True, "temperature": 0.0})
    assert message.content[0].text == want
    assert message.usage.input_tokens == chat.usage.prompt_tokens

    local = client.chat.completions.create(model="vlm", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": str(server.media / "cat.png")}},
        {"type": "text", "text": "Describe this"}]}], max_tokens=STEPS, temperature=0.0,
        extra_body={"ignore_eos": True})
    assert local.choices[0].message.content == want

    # detail "low": the whole image as one tile (transformers' count without splitting), in chat and Responses
    unsplit = transformers.Idefics3Processor(
        Idefics3ImageProcessorPil.from_pretrained(vlm_setup[0], do_image_splitting=False), hf_processor.tokenizer,
        image_seq_len=4)
    low_tokens = len(unsplit(text=[PROMPT_ONE], images=[[_pil(image)]])["input_ids"][0])
    assert low_tokens < chat.usage.prompt_tokens
    low = client.chat.completions.create(model="vlm", max_tokens=1, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(image), "detail": "low"}},
        {"type": "text", "text": "Describe this"}]}])
    assert low.usage.prompt_tokens == low_tokens
    low = client.responses.create(model="vlm", max_output_tokens=1, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_uri(image), "detail": "low"},
        {"type": "input_text", "text": "Describe this"}]}])
    assert low.usage.input_tokens == low_tokens


def _pil(data: bytes):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data))


def test_a_second_turn_about_the_image_reuses_its_cached_pages(server):
    """Turn two repeats turn one's messages (image included) and adds a question: the image's tokens
    come from the prefix cache, not computed again."""
    client = client_for(server)
    image = png(80, 60, 7)
    first = [{"role": "user", "content": chat_parts(image, "What is it?")}]
    answer = client.chat.completions.create(model="vlm", messages=first, max_tokens=4, temperature=0.0)
    hits_before = metric(server, "vsurge:prefix_cache_hits_total")
    second = first + [{"role": "assistant", "content": answer.choices[0].message.content},
                      {"role": "user", "content": [{"type": "text", "text": "And its colour?"}]}]
    again = client.chat.completions.create(model="vlm", messages=second, max_tokens=4, temperature=0.0)
    hits = metric(server, "vsurge:prefix_cache_hits_total") - hits_before
    assert hits >= answer.usage.prompt_tokens - 16  # all of turn one but its last page's tail
    assert again.usage.prompt_tokens > answer.usage.prompt_tokens
    # the same image in another conversation (no page in common): its embeddings from the encoder cache
    encoded, image_hits = metric(server, "vsurge:images_encoded_total"), metric(server, "vsurge:image_cache_hits_total")
    client.chat.completions.create(model="vlm", max_tokens=2, messages=[
        {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": chat_parts(image, "Hm?")}])
    assert metric(server, "vsurge:images_encoded_total") == encoded
    assert metric(server, "vsurge:image_cache_hits_total") > image_hits


BAD = [
    ("not base64", lambda s: {"url": "data:image/png;base64,@@@not-base64@@@"}, "not valid base64"),
    ("corrupt bytes", lambda s: {"url": data_uri(b"\x89PNG\r\n\x1a\n garbage")}, "could not be decoded"),
    ("not an image type", lambda s: {"url": data_uri(b"hello", "text/plain")}, "is not an image"),
    ("tiff as png", lambda s: {"url": data_uri(png(20, 20, 0, fmt="TIFF"))}, "format TIFF is not supported"),
    ("remote url", lambda s: {"url": "https://example.com/cat.png"}, "not allowed by this server"),
    ("file outside", lambda s: {"url": "/etc/passwd"}, "outside the allowed media folder"),
    ("unknown scheme", lambda s: {"url": "ftp://example.com/cat.png"}, "unsupported image URL scheme"),
    ("bad detail", lambda s: {"url": data_uri(png(20, 20, 0)), "detail": "ultra"}, "detail must be"),
    ("too many pixels", lambda s: {"url": data_uri(blank_png(8000, 6000))}, "8000 x 6000 pixels"),
    ("empty", lambda s: {"url": "data:image/png;base64,"}, "the image is empty"),
]


def blank_png(width: int, height: int) -> bytes:
    """A huge but tiny file (one colour compresses to almost nothing): a decompression bomb's shape."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (width, height)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("case,image_url,message", BAD, ids=[b[0] for b in BAD])
def test_bad_images_get_a_400_naming_the_problem(server, case, image_url, message):
    client = client_for(server)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="vlm", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": image_url(server)}, {"type": "text", "text": "hi"}]}])
    assert message in err.value.body["message"]
    assert err.value.body["param"].startswith("messages[0].content[0]")


def test_too_many_images_and_wrong_apis_are_refused(server):
    client = client_for(server)
    part = {"type": "image_url", "image_url": {"url": data_uri(png(20, 20, 0))}}
    with pytest.raises(openai.BadRequestError, match="at most 3"):
        client.chat.completions.create(model="vlm", max_tokens=2, messages=[{"role": "user", "content": [part] * 4}])
    with pytest.raises(openai.BadRequestError, match="audio inputs are not supported"):
        client.chat.completions.create(model="vlm", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}])
    claude = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="media_type"):
        claude.messages.create(model="vlm", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": "AAAA"}}]}])
    with pytest.raises(openai.BadRequestError, match="file_id is not supported"):
        client.responses.create(model="vlm", max_output_tokens=2, input=[{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-123"}]}])
    # and the server still serves
    ok = client.chat.completions.create(model="vlm", max_tokens=2, messages=[{"role": "user", "content": [part]}])
    assert ok.choices[0].finish_reason == "length"


def test_a_text_model_answers_images_with_a_400(default_server):
    client = client_for(default_server)
    with pytest.raises(openai.BadRequestError, match="image inputs are not supported by this model"):
        client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri(png(20, 20, 0))}}]}])


def test_the_chat_page_sends_an_attached_image(server, tmp_path):
    """Real Chromium: attach an image with the page's file input, send a question; the reply streams
    back (HF's tokens for that image) and the image shows in the conversation."""
    from selenium.webdriver.common.by import By

    from test_web import start_chromium, wait

    driver = start_chromium()
    try:
        driver.get(server.base + "/")
        driver.execute_script("localStorage.clear()")
        driver.get(server.base + "/")
        wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-models") == "1")
        driver.execute_script("vsurge.state.messages = []; document.getElementById('temperature').value = '0';"
                              "document.getElementById('max-tokens').value = '4';")
        path = tmp_path / "picture.png"
        path.write_bytes(png(50, 90, 1))
        upload = driver.find_element(By.ID, "image-input")
        driver.execute_script("arguments[0].hidden = false", upload)  # (the Image button opens it for a user)
        upload.send_keys(str(path))
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#attachments img"), message="the thumbnail")
        driver.find_element(By.ID, "prompt").send_keys("Describe this")
        driver.find_element(By.ID, "send").click()
        wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle"
             and d.find_elements(By.CSS_SELECTOR, "#conversation .message.assistant .meta"), 60, "the reply")
        meta = driver.find_elements(By.CSS_SELECTOR, "#conversation .message.assistant .meta")[-1].text
        assert "4 tokens" in meta
        assert driver.find_elements(By.CSS_SELECTOR, "#conversation .message.user .images img")
        assert not driver.find_elements(By.CSS_SELECTOR, "#conversation .message.error")
        assert not driver.find_elements(By.CSS_SELECTOR, "#attachments img")  # sent with the message
    finally:
        driver.quit()


def test_text_only_chats_reach_a_vision_template(server, vlm_setup):
    """SmolVLM's template reads text from content parts only (a string prints nothing): a text-only chat,
    its content a string, still reaches the model whole, as HF's processor renders it."""
    _, _, hf_processor = vlm_setup
    client = client_for(server)
    reply = client.chat.completions.create(model="vlm", max_tokens=2, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour"}])
    text = hf_processor.apply_chat_template([
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour"}]}], add_generation_prompt=True)
    assert reply.usage.prompt_tokens == len(hf_processor.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_generate_with_an_image_from_the_command_line(vlm_setup, tmp_path):
    """`vsurge generate --image FILE` answers with HF's greedy tokens for that image; a text model, or a
    file that is no image, exits naming the problem."""
    import json

    from cli_helpers import run_cli

    folder, torch_model, hf_processor = vlm_setup
    path = tmp_path / "picture.png"
    path.write_bytes(png(50, 90, 1))
    out = run_cli("generate", "--model", str(folder), "--dtype", "float32", "--image", str(path), "--json",
                  "--temperature", "0", "--max-tokens", str(STEPS), "Describe this")
    assert out.returncode == 0, out.stderr
    tokens = json.loads(out.stdout)["tokens"]  # (it may end early at an end token; the reference runs on)
    want = hf_greedy(torch_model, hf_processor, PROMPT_ONE, [path.read_bytes()], STEPS)
    assert tokens and tokens == want[:len(tokens)]
    (tmp_path / "notes.txt").write_text("not a picture")
    bad = run_cli("generate", "--model", str(folder), "--image", str(tmp_path / "notes.txt"), "--max-tokens", "2", "hi")
    assert bad.returncode != 0 and "could not be decoded" in bad.stderr


def test_bench_serve_sends_images_in_every_wire_format(server):
    """`vsurge bench serve --images-per-request 2`: every request's two images (each its own JPEG, so
    the encoder cache answers none; another --seed for each run) reach the tower through chat, Responses
    and Messages."""
    for seed, endpoint in enumerate(("/v1/chat/completions", "/v1/responses", "/v1/messages")):
        encoded = metric(server, "vsurge:images_encoded_total")
        out = subprocess.run(
            [sys.executable, "-m", "vsurge.cli", "bench", "serve", "--base-url", server.base, "--endpoint", endpoint,
             "--num-prompts", "2", "--input-len", "4", "--output-len", "2", "--images-per-request", "2",
             "--image-size", "48x40", "--seed", str(seed + 1), "--json"], capture_output=True, text=True, timeout=300, env=ENV)
        assert out.returncode == 0, out.stdout + out.stderr
        summary = json.loads(out.stdout)
        assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (2, 0, 4), endpoint
        assert metric(server, "vsurge:images_encoded_total") - encoded == 4, endpoint


@pytest.mark.parametrize("argv,message", [
    (["--endpoint", "/v1/completions", "--images-per-request", "1"], "/v1/completions takes text only"),
    (["--images-per-request", "1", "--image-size", "wide"], "expected WIDTHxHEIGHT"),
    (["--images-per-request", "-1"], "must be 0 or more"),
    (["--temperature", "-0.5"], "--temperature must be 0 or more")])
def test_bench_serve_refuses_a_load_it_cannot_send(argv, message):
    out = subprocess.run([sys.executable, "-m", "vsurge.cli", "bench", "serve", "--base-url", "http://127.0.0.1:9",
                          *argv], capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode != 0 and message in out.stderr, out.stderr

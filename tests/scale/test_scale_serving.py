"""Serving at scale over real HTTP on loopback, with the official openai client.

* data parallel: 2 replicas x tensor parallel 2 behind one server (4 CPU devices in one
  process): 16 concurrent requests answer what one device answers, and both replicas serve.
* multi-host: two `vsurge serve` processes of 2 CPU devices each form one 4-device mesh over
  jax.distributed (gloo collectives); process 0 serves HTTP and answers what one device
  answers; killing the follower fails in-flight requests with a clear error, readiness turns
  503 naming the lost follower, and the leader exits 1 (nothing hangs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from server_process import free_port
from tiny_models import write_tiny_model
from xla_flags import xla_flags

HERE = Path(__file__).parents[1]  # tests/: the helper scripts
PROMPTS = [f"Tell me about {topic}" for topic in ("volcanoes", "the moon", "bees", "chess", "rivers", "robots",
                                                   "tea", "glaciers", "owls", "bridges", "jazz", "deserts",
                                                   "comets", "forests", "trains", "coral")]
MAX_TOKENS = 8


class Process:
    """One server process on loopback; output goes to a file (nobody reads a pipe during the test)."""

    def __init__(self, cmd: list[str], devices: int):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
               "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}")}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vsurge-scale-", suffix=".log")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    @property
    def output(self) -> str:
        with open(self.log.name) as f:
            return f.read()

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


def wait_ready(base: str, processes: list[Process], timeout: float = 400) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in processes:
            if p.proc.poll() is not None:
                raise RuntimeError(f"a server process exited early:\n{p.output[-4000:]}")
        try:
            if httpx.get(base + "/readiness", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("not ready:\n" + "\n----\n".join(p.output[-3000:] for p in processes))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, default_processor_dir):
    folder = tmp_path_factory.mktemp("tiny_llama_serving")
    write_tiny_model("llama", folder, default_processor_dir)
    return folder


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """Greedy continuations of every prompt on one device (the plain Generator)."""
    import vsurge
    from dense_generator import greedy_generate

    model, processor = vsurge.load(tiny_llama, dtype="float32", progress=False)
    return {p: processor.decode(greedy_generate(model, processor.encode(p), MAX_TOKENS)) for p in PROMPTS}


def complete_all(client: openai.OpenAI, model: str, prompts: list[str]) -> dict[str, str]:
    def one(prompt):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        return prompt, r.choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        return dict(pool.map(one, prompts))


def test_data_parallel_2_x_tensor_parallel_2_serves_like_one_device(tiny_llama, reference):
    port = free_port()
    server = Process([sys.executable, str(HERE / "scale_server.py"), str(tiny_llama), str(port), "2", "2"], devices=4)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, [server])
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        answers = complete_all(client, "tiny", PROMPTS)  # 16 at once: 4 slots per replica, the rest queue
        assert answers == reference
        stats = httpx.get(base + "/v1/stats", timeout=10).json()["models"][0]
        finished = [r["finished_total"] for r in stats["replicas"]]
        assert [r["id"] for r in stats["replicas"]] == [0, 1]
        assert all(n > 0 for n in finished) and sum(finished) == stats["finished_total"] == len(PROMPTS), finished
        assert stats["generation_tokens"] == len(PROMPTS) * MAX_TOKENS
        metrics = httpx.get(base + "/metrics", timeout=10).text
        assert 'replica="0"' in metrics and 'replica="1"' in metrics
    finally:
        assert server.stop() == 0, server.output[-3000:]


def test_cli_generate_runs_tensor_parallel(tiny_llama, reference):
    prompt = PROMPTS[0]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
           "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2")}
    out = subprocess.run([sys.executable, "-m", "vsurge.cli", "generate", prompt, "--raw", "--model", str(tiny_llama),
                          "--dtype", "float32", "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
                          "--tensor-parallel-size", "2"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.rstrip("\n") == reference[prompt]


def serve_command(model: Path, port: int, coordinator: int, process_id: int) -> list[str]:
    return [sys.executable, "-m", "vsurge.cli", "serve", "--model", str(model), "--served-model-name", "tiny",
            "--dtype", "float32", "--tensor-parallel-size", "4", "--engine", "dense",
            "--max-concurrent-decodes", "2", "--max-length", "128", "--prefill-lengths", "32",
            "--prefill-tokens", "64", "--compilation-cache", "none", "--port", str(port), "--metrics-port", "-1",
            "--coordinator-address", f"127.0.0.1:{coordinator}", "--num-processes", "2",
            "--process-id", str(process_id), "--heartbeat-timeout", "10"]


def test_two_processes_serve_one_mesh_and_a_lost_follower_fails_loudly(tiny_llama, reference):
    port, coordinator = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    follower = Process(serve_command(tiny_llama, port, coordinator, 1), devices=2)
    leader = Process(serve_command(tiny_llama, port, coordinator, 0), devices=2)
    try:
        wait_ready(base, [leader, follower])
        assert "process 1 follows process 0" in follower.output
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        prompts = PROMPTS[:4]
        assert complete_all(client, "tiny", prompts) == {p: reference[p] for p in prompts}

        # a long streamed request is in flight when the follower dies
        errors: list[BaseException] = []
        first_chunk = threading.Event()

        def stream():
            try:
                for _ in client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=110, temperature=0,
                                                   stream=True, extra_body={"ignore_eos": True}):
                    first_chunk.set()
            except Exception as exc:  # noqa: BLE001: the failure under test
                errors.append(exc)
            first_chunk.set()

        streamer = threading.Thread(target=stream)
        streamer.start()
        assert first_chunk.wait(60)
        follower.proc.kill()
        streamer.join(60)
        assert not streamer.is_alive(), "the in-flight request hung"
        assert errors and "follower process 1 was lost" in str(errors[0]), errors

        # the leader cannot serve without the follower's share: readiness names why while it drains, and it
        # exits 1 (a service manager restarts the pair) instead of answering 503 for good
        deadline = time.time() + 30
        while True:
            try:
                answer = httpx.get(base + "/readiness", timeout=5)
            except httpx.TransportError:
                break  # already gone
            if answer.status_code == 503:
                assert "follower process 1 was lost" in answer.text, answer.text
                break
            assert time.time() < deadline, "readiness never turned 503"
            time.sleep(0.1)
        assert leader.proc.wait(60) == 1, leader.output[-3000:]
        assert "follower process 1 was lost" in leader.output.split("exits with status 1")[0][-2000:]
    finally:
        follower.proc.kill()
        code = leader.stop(timeout=60)
    assert code == 1, "the leader did not exit 1:\n" + leader.output[-3000:]

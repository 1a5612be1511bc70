"""Every model family's GGUF, checked against llama.cpp itself (not run in CI: needs llama.cpp).

For each family's tiny random checkpoint (tests/tiny_models.py):
  1. llama.cpp's own converter (convert_hf_to_gguf.py) writes it as GGUF; the test suite's
     writer (tests/gguf_families.py) must produce the same tensors and metadata;
  2. vsurge loads the converter's file: its logits must equal transformers' on the checkpoint;
  3. llama.cpp's llama-server runs the same file: its greedy tokens for a token-id prompt must
     equal vsurge's on that file.
The test checkpoints carry SmolLM2's BPE tokenizer, which the converter reads for most families; for
Gemma 2 and Phi-3 it insists on a sentencepiece model, for Qwen2 it does not recognize this
pre-tokenizer and for GLM-4 it wants GLM's special tokens, so for those the converter runs with its
vocabulary step replaced by its own GPT-2 one (the tensors and the model's metadata are the
converter's as ever).

    python benchmarks/families_vs_llamacpp.py            (builds llama.cpp on first use, ~10 min)

With --mmproj, the vision-language pairs instead (tests/tiny_vlm.py's SmolVLM, Gemma 3, Mistral 3, Qwen2.5-VL and Qwen3-VL): the converter's
text GGUF and mmproj against the test writer's (tests/mmproj_files.py), and vsurge on the converter's pair
against vsurge on the HF directory (logits over a prompt with an image; tests/multimodal/test_images.py checks the
directory against transformers), and greedy tokens with an image: vsurge's engine on the pair against
llama-server `--mmproj` on the converter's pair (the same prompt, the image as llama.cpp's media marker).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from serve import Server, llama_server_binary  # noqa: E402

GREEDY = 8
# shapes llama.cpp needs beyond the tiny configs: its qwen3next and qwen35 take the value heads' width from the
# key heads' (ssm.state_size), as every released Qwen3-Next has them; its lfm2 has no convolution biases
# its mamba2 and nemotron_h no in/out projection biases, its falcon-h1 no out_proj bias (no released
# LFM2 / Mamba-2 / Nemotron-H / Falcon-H1 has them; the suite's do); its qwen35 wants the multimodal
# rotary sections to fit the rotary width (4 dims here: the converter's default [11, 11, 10] fits 64); its
# gemma4 shares the K/V of the last two computing layers, a sliding one then a global one (as Gemma 4's are)
QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
               "mrope_interleaved": True}
OVERRIDES = {"qwen3_next": {"linear_value_head_dim": 16},
             "qwen3_5": {"linear_value_head_dim": 16, "rope_parameters": QWEN35_ROPE},
             "qwen3_5_moe": {"linear_value_head_dim": 16, "rope_parameters": QWEN35_ROPE}, "lfm2": {"conv_bias": False},
             "mamba2": {"use_bias": False}, "nemotron_h": {"use_bias": False},
             "falcon_h1": {"projectors_bias": False},
             "gemma4": {"layer_types": ["sliding_attention"] * 3 + ["full_attention", "sliding_attention",
                                                                   "full_attention"]}}


# runs the converter with the vocabulary step of Gemma 2, Phi-3 and Qwen2 replaced (see the docstring), and
# Nemotron-H's config read from config.json: transformers 5's AutoConfig fills in the mixture-of-experts
# keys of Nemotron 3, which turn the converter to nemotron_h_moe (with transformers 4, which needs remote
# code for Nemotron-H, the converter falls back to config.json itself)
RUN_CONVERTER = """
import sys
sys.path.insert(0, sys.argv[1])
from conversion import base, gemma, glm, phi, qwen
for cls in (gemma.Gemma2Model, gemma.Gemma4Model, phi.Phi3MiniModel, qwen.Qwen2Model, glm.Glm4Model):
    cls.set_vocab = lambda self: self._set_vocab_gpt2()
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "smollm"  # the test tokenizer's
base.TextModel.get_vocab_base_pre = pre
import json
from pathlib import Path
hparams = base.ModelBase.load_hparams
def read_config(dir_model, is_mistral_format):  # Nemotron-H: config.json itself, see NEMOTRON_H_CONFIG
    config = json.loads((Path(dir_model) / "config.json").read_text())
    return config if config.get("model_type") == "nemotron_h" else hparams(dir_model, is_mistral_format)
base.ModelBase.load_hparams = staticmethod(read_config)
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[2:]
convert_hf_to_gguf.main()
"""


def convert(llama_cpp: Path, hf_dir: Path, out: Path, outtype: str = "f32", *extra: str) -> str | None:
    """Run llama.cpp's converter; None on success, else its last error line. Qwen3-Next and Qwen3.5 text
    checkpoints without a multi-token-prediction head need --no-mtp (it asserts one is there otherwise)."""
    import json

    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    text_only = "vision_config" not in config  # (a whole Qwen3.5 checkpoint's converter takes no --no-mtp)
    extra = [*extra, *(["--no-mtp"] if text_only and config.get("model_type", "").startswith(("qwen3_next", "qwen3_5"))
                       else [])]
    proc = subprocess.run([sys.executable, "-c", RUN_CONVERTER, str(llama_cpp), str(hf_dir), "--outfile", str(out),
                           "--outtype", outtype, *extra], env=env, capture_output=True, text=True)
    if proc.returncode:
        return (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
    return None


def same_file(ours: Path, theirs: Path, mtp: bool = False) -> str:
    """mtp: `theirs` also holds the checkpoint's multi-token-prediction layers (blocks after the model's own,
    nextn_predict_layers of them), which the test writer does not write: compared without them."""
    from vsurge.loading.gguf import dequantize
    from vsurge.loading.gguf_file import GGUFFile

    a, b = GGUFFile(ours), GGUFFile(theirs)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    if mtp:
        arch = b.fields["general.architecture"]
        own = int(b.fields[f"{arch}.block_count"]) - int(b.fields[f"{arch}.nextn_predict_layers"])
        tb = {n: t for n, t in tb.items() if not (n.startswith("blk.") and int(n.split(".")[1]) >= own)}
        total = int(b.fields[f"{arch}.block_count"])
        b.fields = {k: (v[:own] if isinstance(v, list) and len(v) == total else v)  # (per-block keys: the own blocks')
                    for k, v in b.fields.items() if k not in (f"{arch}.block_count", f"{arch}.nextn_predict_layers")}
        a.fields = {k: v for k, v in a.fields.items() if k != f"{arch}.block_count"}
    if set(ta) != set(tb):
        return f"tensor names differ ({sorted(set(ta) ^ set(tb))[:3]})"
    for name in ta:
        x, y = dequantize(ta[name]), dequantize(tb[name])
        # (float32 rounding: the converter's -exp(A_log) in torch, the writer's in numpy, one ulp apart)
        if x.shape != y.shape or np.abs(x - y).max() > 1e-6 * max(1.0, float(np.abs(y).max())):
            return f"tensor {name} differs"
    keys = lambda f: {k: v for k, v in f.fields.items() if not k.startswith(("tokenizer.", "general."))}  # noqa: E731
    fa, fb = keys(a), keys(b)
    bad = [k for k in set(fa) | set(fb) if not _close(fa.get(k), fb.get(k))]
    return f"metadata differs: {sorted(bad)}" if bad else "same"


def _close(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return abs(x - y) < 1e-6
    return x == y


def vsurge_greedy(model, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    import jax.numpy as jnp

    from dense_generator import greedy_generate

    logits = np.asarray(model(jnp.asarray([ids], jnp.int32))[0][0])
    return greedy_generate(model, ids, steps), logits


def llama_cpp_greedy(binary: str, gguf: Path, ids: list[int], steps: int) -> list[int]:
    server = Server("llama-server", [binary, "-m", str(gguf), "--port", "{port}", "-c", "256", "-np", "1", "-t", "2"],
                    "/health")
    try:
        server.wait_ready(120)
        body = {"prompt": ids, "n_predict": steps, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "ignore_eos": True, "samplers": ["top_k"]}
        return httpx.post(server.base + "/completion", json=body, timeout=120).json()["tokens"]
    finally:
        server.stop()


# Each pair's image and where llama-server's media marker goes in the prompt for the same tokens as vsurge's
# processor makes (transformers'): Gemma 3's processor writes "\n\n" around <start_of_image> ... <end_of_image>,
# which llama.cpp's mtmd writes around the marker; SmolVLM's whole tile grid is mtmd's own for the marker.
# Images at the towers' own sizes where that is one resize-free tile (Gemma 3: 32 x 32); SmolVLM's at its
# longest edge (64 x 64: four exact 32-pixel tiles, and the global image, which both sides downscale).
# (llama-server draws its marker at random per process: /props says which)
MMPROJ_GREEDY = {"gemma3": ((32, 32), lambda p, m: p.replace("<start_of_image>", f"\n\n{m}\n\n")),
                 "idefics3": ((64, 64), lambda p, m: p.replace("<image>", m)),
                 # Mistral 3: 64 x 64 is 4 x 4 merged blocks within both sides' limits (HF's longest edge, clip.cpp's
                 # 8 to 1024 tokens), so neither resizes; mtmd writes the [IMG_BREAK]s and [IMG_END] itself
                 "mistral3": ((64, 64), lambda p, m: p.replace("[IMG]", m)),
                 # Qwen-VL: 64 x 64 is 4 x 4 tokens within both sides' limits (the tiny processor's, clip.cpp's 8 to
                 # 4096 tokens), so neither resizes; mtmd writes <|vision_start|> and <|vision_end|> itself
                 **{family: ((64, 64), lambda p, m: p.replace("<|vision_start|><|image_pad|><|vision_end|>", m))
                    for family in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")}}


def greedy_with_image(binary: str, text: Path, mmproj: Path, model, processor, prompt: str, image: bytes,
                      family: str) -> str:
    """vsurge's engine on (model, processor) against llama-server on (text, mmproj): greedy tokens, one image."""
    import base64

    from test_images import serving
    from vsurge import EngineConfig

    config = EngineConfig(max_slots=2, max_length=256, prefill_tokens=64, chunk_lengths=(16,), page_size=16)
    our_prompt = processor.images.prompt(prompt, [image])
    with serving(model, processor, config, GREEDY) as (_, run):
        ours = run([our_prompt])[0]
    server = Server("llama-server", [binary, "-m", str(text), "--mmproj", str(mmproj), "--port", "{port}", "-c", "512",
                                     "-np", "1", "-t", "2", "--no-warmup"], "/health")
    try:
        server.wait_ready(120)
        marker = httpx.get(server.base + "/props", timeout=30).json()["media_marker"]
        body = {"prompt": {"prompt_string": MMPROJ_GREEDY[family][1](prompt, marker),
                           "multimodal_data": [base64.b64encode(image).decode()]},
                "n_predict": GREEDY, "temperature": 0.0, "top_k": 1, "cache_prompt": False, "return_tokens": True,
                "ignore_eos": True, "samplers": ["top_k"]}
        reply = httpx.post(server.base + "/completion", json=body, timeout=120).json()
    finally:
        server.stop()
    if "tokens" not in reply:
        raise RuntimeError(f"llama-server answered {str(reply)[:300]}")
    theirs, counted = reply["tokens"], reply.get("tokens_evaluated")
    prompt_note = f"prompt {len(our_prompt.ids)} / {counted} tokens"
    return (f"equal ({prompt_note})" if theirs == ours else f"differ: {ours} vs {theirs} ({prompt_note})")


def as_hub_checkpoint(family: str, hf_dir: Path) -> None:
    """What the converter needs of a tiny VLM that the hub's checkpoints have: SmolVLM's text_config names its
    architecture (the converter picks the text model by it), Gemma 3's tower its vision_model (transformers 5
    saves it without, which the converter's name map does not know), Qwen2.5-VL's windows the hub's 112 pixels
    (which clip.cpp assumes), Qwen3-VL-MoE's experts in the hub's layout (transformers 5 saves its own)."""
    import json

    from safetensors.numpy import load_file, save_file

    if family == "idefics3":
        path = hf_dir / "config.json"
        cfg = json.loads(path.read_text())
        cfg["text_config"]["architectures"] = ["VLlama3ForCausalLM"]
        path.write_text(json.dumps(cfg, indent=2))
        return
    if family == "qwen2_5_vl":  # clip.cpp reads no window for it: the hub's 112 pixels (the tiny tower's are 32)
        path = hf_dir / "config.json"
        cfg = json.loads(path.read_text())
        cfg["vision_config"]["window_size"] = 112
        path.write_text(json.dumps(cfg, indent=2))
    if family.startswith("qwen3_5"):  # a multi-token-prediction layer, which the converter requires of Qwen3.5
        add_mtp_layer(hf_dir)
    if family == "qwen3_vl_moe":  # the hub's (in, out) expert stacks, which the converter transposes
        for f in hf_dir.glob("*.safetensors"):
            state = {k: np.ascontiguousarray(v.swapaxes(1, 2)) if k.endswith(("experts.gate_up_proj",
                                                                              "experts.down_proj")) else v
                     for k, v in load_file(f).items()}
            save_file(state, str(f), metadata={"format": "pt"})
    if family != "gemma3":  # (Mistral 3, Qwen-VL: transformers 5 saves the hub's names)
        return
    for f in hf_dir.glob("*.safetensors"):
        state = {(k.replace("vision_tower.", "vision_tower.vision_model.", 1)
                  if k.startswith("vision_tower.") and ".vision_model." not in k else k): v
                 for k, v in load_file(f).items()}
        save_file(state, str(f), metadata={"format": "pt"})


MMPROJ_PAIRS = ("idefics3", "gemma3", "mistral3", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")


def add_mtp_layer(hf_dir: Path) -> None:
    """Qwen3.5's multi-token-prediction head as the hub's checkpoints hold it (mtp.*: a full-attention layer,
    here a copy of the text model's last one, the projection of [embedding, hidden] and its norms), which
    transformers does not save and llama.cpp's converter asserts is there."""
    import json

    from safetensors.numpy import load_file, save_file

    path = hf_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg["text_config"]["mtp_num_hidden_layers"] = 1
    path.write_text(json.dumps(cfg, indent=2))
    last, d = cfg["text_config"]["num_hidden_layers"] - 1, cfg["text_config"]["hidden_size"]
    rng = np.random.default_rng(0)
    for f in hf_dir.glob("*.safetensors"):
        state = load_file(f)
        layer = f"model.language_model.layers.{last}."
        mtp = {"mtp.layers.0." + k[len(layer):]: v.copy() for k, v in state.items() if k.startswith(layer)}
        mtp["mtp.fc.weight"] = rng.standard_normal((d, 2 * d)).astype(np.float32) * 0.05
        for norm in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            mtp[f"mtp.{norm}.weight"] = np.zeros(d, np.float32)
        save_file({**state, **mtp}, str(f), metadata={"format": "pt"})


def check_mmproj(llama_cpp: Path, work: Path, tokenizer: Path, only: set[str] | None = None) -> None:
    """The vision-language pairs (`only`: those of them): the test writer's files against the converter's,
    vsurge on the converter's."""
    from functools import partial

    import gguf
    import jax.numpy as jnp

    import vsurge
    from mmproj_files import with_img_break, write_pair
    from test_images import GEMMA_ONE, PROMPT_ONE, png
    from test_mistral3_vl import ONE as MISTRAL_ONE
    from test_qwen_vl import ONE as QWEN_ONE
    from vlm_checks import logits_with_images as prompt_logits
    from tiny_vlm import (write_tiny_gemma3_vlm, write_tiny_idefics3, write_tiny_mistral3, write_tiny_qwen2_5_vl,
                          write_tiny_qwen3_5_vl, write_tiny_qwen3_vl)
    from vsurge.loading import default_model_path

    binary = llama_server_binary()
    print("| pair | converter | test writer's text GGUF | test writer's mmproj | vsurge on the converter's pair vs "
          "the HF directory (max abs logit diff, one image) | greedy tokens with an image vs llama-server --mmproj |")
    print("|---|---|---|---|---|---|")
    # (Mistral 3 reading the last tower block's features: the converter writes no vision_feature_layer)
    for family, write, prompt in (("idefics3", write_tiny_idefics3, PROMPT_ONE),
                                  ("gemma3", write_tiny_gemma3_vlm, GEMMA_ONE),
                                  ("mistral3", partial(write_tiny_mistral3, feature_layer=-1), MISTRAL_ONE),
                                  ("qwen2_5_vl", write_tiny_qwen2_5_vl, QWEN_ONE), ("qwen3_vl", write_tiny_qwen3_vl, QWEN_ONE),
                                  ("qwen3_vl_moe", partial(write_tiny_qwen3_vl, moe=True), QWEN_ONE),
                                  ("qwen3_5", write_tiny_qwen3_5_vl, QWEN_ONE),
                                  ("qwen3_5_moe", partial(write_tiny_qwen3_5_vl, moe=True), QWEN_ONE)):
        if only is not None and family not in only:
            continue
        hf = work / family
        write(hf, tokenizer)
        as_hub_checkpoint(family, hf)
        text, mmproj = work / f"{family}.gguf", work / f"mmproj-{family}.gguf"
        error = convert(llama_cpp, hf, text) or convert(llama_cpp, hf, mmproj, "f32", "--mmproj")
        if error:
            print(f"| {family} | cannot convert: {error} | - | - | - | - |", flush=True)
            continue
        ours_text, ours_mmproj = work / f"{family}.ours.gguf", work / f"mmproj-{family}.ours.gguf"
        write_pair(hf, ours_text, ours_mmproj, default_model_path())
        text_same = same_file(ours_text, text, mtp=family.startswith("qwen3_5"))
        if family.startswith("qwen3_5"):
            text_same += " (the converter's MTP layer aside)"
        # the converter cuts Gemma 3's token_embd to the tokenizer.json's count, fewer rows than tokens here
        # (tests/mmproj_files.py): its text file does not load, the writer's (the same otherwise) stands in
        loadable = text if text_same.startswith("same") else ours_text
        model, processor = vsurge.load(loadable, dtype=jnp.float32, progress=False, mmproj=mmproj)
        ref, ref_processor = vsurge.load(hf, dtype=jnp.float32, progress=False)
        image = [png(50, 90, 1)]
        diff = np.abs(prompt_logits(model, processor.images.prompt(prompt, image))
                      - prompt_logits(ref, ref_processor.images.prompt(prompt, image))).max()
        note = "" if loadable == text else " (the test writer's text GGUF)"
        size = MMPROJ_GREEDY[family][0]
        served = mmproj
        if family == "mistral3" and "v.token_embd.img_break" not in {t.name for t in gguf.GGUFReader(mmproj).tensors}:
            served = with_img_break(mmproj, loadable, work / f"mmproj-{family}.img_break.gguf")
            note += " (llama-server: the converter's mmproj plus v.token_embd.img_break: mmproj_files.with_img_break)"
        try:
            greedy = greedy_with_image(binary, loadable, served, model, processor, prompt, png(*size, 3), family)
        except RuntimeError as e:  # llama-server could not load the pair
            greedy = "llama-server cannot load it: " + str(e).strip().splitlines()[-1][:120]
        print(f"| {family} | ok | {text_same} | {same_file(ours_mmproj, mmproj)} | {diff:.1e}{note} | {greedy} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=None,
                        help="comma-separated families (default: all; with --mmproj, all pairs: " + ",".join(MMPROJ_PAIRS) + ")")
    parser.add_argument("--mmproj", action="store_true", help="the vision-language pairs (text GGUF + mmproj)")
    args = parser.parse_args()
    import jax.numpy as jnp
    import torch

    import vsurge
    from gguf_families import AS_CONVERTED, FAMILIES, write_family_gguf
    from tiny_models import write_tiny_model
    from vsurge.loading import default_model_path, load_processor

    binary = llama_server_binary()
    llama_cpp = Path(binary).parents[2]
    work = Path(tempfile.mkdtemp(prefix="gguf-families-"))
    tokenizer = work / "tokenizer"
    load_processor("default").save_pretrained(tokenizer)
    ids = load_processor("default").encode("The river ran past the old mill where the ducks")
    print(f"llama.cpp: {llama_cpp}\n")
    if args.mmproj:
        return check_mmproj(llama_cpp, work, tokenizer, set(args.families.split(",")) if args.families else None)
    print("| family | converter | test writer vs converter | vsurge vs transformers (max abs logit diff) | "
          "greedy tokens vs llama.cpp |")
    print("|---|---|---|---|---|")
    for name in (args.families or ",".join(FAMILIES)).split(","):
        hf = work / name
        hf.mkdir()
        torch_model = write_tiny_model(name, hf, tokenizer, **AS_CONVERTED.get(name, {}), **OVERRIDES.get(name, {}))
        theirs = work / f"{name}.gguf"
        error = convert(llama_cpp, hf, theirs)
        if error:
            print(f"| {name} | cannot convert: {error} | - | - | - |", flush=True)
            continue
        ours = work / f"{name}.ours.gguf"
        write_family_gguf(ours, hf, default_model_path())
        model, _ = vsurge.load(theirs, dtype=jnp.float32, progress=False)
        tokens, logits = vsurge_greedy(model, ids, GREEDY)
        with torch.no_grad():
            ref = torch_model(torch.tensor([ids])).logits[0].numpy()
        try:
            theirs_tokens = llama_cpp_greedy(binary, theirs, ids, GREEDY)
            agree = "equal" if theirs_tokens == tokens else f"differ: {tokens} vs {theirs_tokens}"
        except RuntimeError as e:  # llama.cpp could not load the file
            reason = next((line for line in str(e).splitlines() if "error loading model:" in line), str(e)[-100:])
            agree = "llama.cpp cannot load it: " + reason.split("error loading model:")[-1].strip()[:90]
        print(f"| {name} | ok | {same_file(ours, theirs)} | {np.abs(logits - ref).max():.1e} | {agree} |", flush=True)


if __name__ == "__main__":
    main()

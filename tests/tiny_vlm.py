"""Tiny random-weight vision-language checkpoints written by transformers (vision tower included),
with the default model's tokenizer plus the family's image tokens, for numerical comparisons."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tiny_models import COMMON, TINY_CONFIGS, VOCAB, add_special_tokens, chosen_model_types

# model types of the checkpoints written here (tests/multimodal/test_images.py, test_qwen_vl.py and test_mistral3_vl.py
# compare them with transformers)
VLM_MODEL_TYPES = chosen_model_types("idefics3", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5",
                                     "qwen3_5_moe", "mistral3")

# SmolVLM's chat template (its processor's chat_template.json): content is always a list of parts
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")

IDEFICS3_TOKENS = (["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
                   + [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)])

# the tiny tower: 32-pixel tiles of 8-pixel patches (16 patches), pixel shuffle 2 -> 4 tokens per tile;
# images are resized to a longest edge of 64 (up to 2 x 2 tiles and the global image)
TILE, PATCH, LONGEST_EDGE = 32, 8, 64


def random_model(model_class, config, seed: int, noisy: tuple[str, ...], tweak=None):
    """transformers' `model_class` of `config` with eager attention throughout, seeded. Parameters whose
    names end in `noisy` (norms at 1 and biases at 0 as initialized) get noise so that they are tested;
    tweak(name, param), if given, then changes any parameter in place (under no_grad)."""
    import torch

    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(noisy):
                param.add_(0.1 * torch.randn_like(param))
            if tweak is not None:
                tweak(name, param)
    return model


def write_tokenizer(folder: Path, tokenizer_dir: Path, tokens: list[str], eos: str, template: str) -> list[int]:
    """The default model's tokenizer plus a family's special tokens, its end token and chat template, into
    `folder`: -> the tokens' ids (in order; the model's vocabulary must cover them)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_dir / "tokenizer.json", folder / "tokenizer.json")
    ids = add_special_tokens(folder, tokens)
    tok_cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)
    tok_cfg["eos_token"] = eos
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (folder / "chat_template.jinja").write_text(template)
    return ids


def write_idefics3_tokenizer(folder: Path, tokenizer_dir: Path) -> list[int]:
    """SmolVLM's tokens and template (write_tokenizer): -> the IDEFICS3_TOKENS' ids."""
    return write_tokenizer(folder, tokenizer_dir, IDEFICS3_TOKENS, "<end_of_utterance>", SMOLVLM_TEMPLATE)


def write_tiny_idefics3(folder: Path, tokenizer_dir: Path, seed: int = 0, model_type: str = "idefics3"):
    """An Idefics3 (SmolVLM) checkpoint: SigLIP-style tower, pixel-shuffle connector, Llama text model.
    Returns the torch model (float32, eval mode)."""
    import transformers

    folder = Path(folder)
    ids = write_idefics3_tokenizer(folder, tokenizer_dir)
    text = {**COMMON, "vocab_size": VOCAB + 64, "rope_theta": 100000.0, "pad_token_id": 2}
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  image_size=TILE, patch_size=PATCH, layer_norm_eps=1e-6)
    config = transformers.Idefics3Config(text_config=text, vision_config=vision, scale_factor=2,
                                         image_token_id=ids[1], tie_word_embeddings=False)
    model = random_model(transformers.Idefics3ForConditionalGeneration, config, seed,
                         ("norm.weight", "norm1.weight", "norm2.weight", "layernorm.weight", ".bias"))
    model.save_pretrained(folder)
    if model_type != "idefics3":
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": model_type}, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Idefics3ImageProcessor", "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True, "do_image_splitting": True, "do_pad": True,
        "resample": 1, "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "size": {"longest_edge": LONGEST_EDGE}, "max_image_size": {"longest_edge": TILE}}, indent=2))
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_len": 4, "processor_class":
                                                              "Idefics3Processor"}))
    return model


# Gemma 3's chat template, cut to what the tests send: an image part becomes <start_of_image>
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "<end_of_turn>\n{%- endfor -%}{%- if add_generation_prompt -%}<start_of_turn>model\n{%- endif -%}")
GEMMA3_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>", "<end_of_turn>"]


def write_tiny_gemma3_vlm(folder: Path, tokenizer_dir: Path, seed: int = 0):
    """A Gemma 3 vision-language checkpoint (Gemma3ForConditionalGeneration): SigLIP tower of 32-pixel
    images in 8-pixel patches (16), pooled 2 x 2 to 4 image tokens; Gemma 3 text (sliding window 4, so
    image tokens cross it). Returns the torch model (float32, eval mode)."""
    import torch
    import transformers

    folder = Path(folder)
    ids = write_tokenizer(folder, tokenizer_dir, GEMMA3_TOKENS, "<end_of_turn>", GEMMA3_TEMPLATE)
    text = {**COMMON, "vocab_size": VOCAB + 64, "num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16,
            "sliding_window": 4, "pad_token_id": 0,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}}}
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8, vision_use_head=False)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       boi_token_index=ids[0], eoi_token_index=ids[1], image_token_index=ids[2])

    def tweak(name, param):
        if name.endswith("mm_input_projection_weight"):  # zeros as initialized: no image would reach the text
            # model; float16 values, which llama.cpp's converter (it stores this one as F16) keeps exactly
            param.copy_((1.0 * torch.randn_like(param)).half().float())

    model = random_model(transformers.Gemma3ForConditionalGeneration, config, seed,
                         ("norm.weight", "norm1.weight", "norm2.weight", "layernorm.weight", ".bias"), tweak)
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "do_resize": True, "size": {"height": 32, "width": 32},
        "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "do_pan_and_scan": False}, indent=2))
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_length": 4,
                                                              "processor_class": "Gemma3Processor"}))
    return model


# Qwen2.5-VL's chat template, cut to what the tests send: an image part becomes the vision block
QWEN_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|im_end|>"]
# the tiny tower: 8-pixel patches merged 2 x 2 (16 pixels a token), windows of 32 pixels (2 x 2 tokens),
# images resized to between 16 x 16 x 4 and 96 x 96 pixels
QWEN_PATCH, QWEN_WINDOW, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 8, 32, 16 * 16 * 4, 96 * 96


CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _write_qwen_vl(folder: Path, tokenizer_dir: Path, seed: int, kind: str, text: dict, vision: dict, noisy: tuple,
                   mean: list, std: list):
    """A Qwen-VL checkpoint of transformers' `kind` ("Qwen2VL", "Qwen2_5_VL", ...) with the tiny tokenizer,
    `text` over the shared text fields and the tiny image processor. Returns the torch model."""
    import transformers

    folder = Path(folder)
    ids = write_tokenizer(folder, tokenizer_dir, QWEN_VL_TOKENS, "<|im_end|>", QWEN_VL_TEMPLATE)
    text = {**COMMON, "vocab_size": VOCAB + 64, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": ids[4],
            "tie_word_embeddings": False, **text}
    config = getattr(transformers, f"{kind}Config")(
        text_config=text, vision_config=vision, vision_start_token_id=ids[0], vision_end_token_id=ids[1],
        image_token_id=ids[2], video_token_id=ids[3], tie_word_embeddings=False)
    model = random_model(getattr(transformers, f"{kind}ForConditionalGeneration"), config, seed, noisy)
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "resample": 3, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "image_mean": mean,
        "image_std": std, "min_pixels": QWEN_MIN_PIXELS, "max_pixels": QWEN_MAX_PIXELS, "patch_size": QWEN_PATCH,
        "temporal_patch_size": 2, "merge_size": 2}, indent=2))
    return model


QWEN2_TEXT = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}


def write_tiny_qwen2_vl(folder: Path, tokenizer_dir: Path, seed: int = 0):
    """A Qwen2-VL checkpoint (Qwen2VLForConditionalGeneration): a LayerNorm tower of 3 blocks (quick-GELU MLPs
    twice as wide) attending to the whole image with 2-D rotary, the 2 x 2 merger; the Qwen2 text model with
    M-RoPE of write_tiny_qwen2_5_vl, same tokens, template and image sizes. Returns the torch model."""
    vision = dict(depth=3, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=QWEN_PATCH,
                  spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu")
    return _write_qwen_vl(folder, tokenizer_dir, seed, "Qwen2VL", QWEN2_TEXT, vision,
                          ("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight", ".bias"), CLIP_MEAN, CLIP_STD)


def write_tiny_qwen2_5_vl(folder: Path, tokenizer_dir: Path, seed: int = 0):
    """A Qwen2.5-VL checkpoint (Qwen2_5_VLForConditionalGeneration): a window-attention tower of 3 blocks
    (the second attends to the whole image), 2-D rotary positions, the 2 x 2 merger to the text width; a
    Qwen2 text model with M-RoPE (sections 2, 3, 3 of its 8 rotary frequencies). Returns the torch model
    (float32, eval mode)."""
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=QWEN_PATCH,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=QWEN_WINDOW, out_hidden_size=64,
                  fullatt_block_indexes=[1], hidden_act="silu")
    return _write_qwen_vl(folder, tokenizer_dir, seed, "Qwen2_5_VL", QWEN2_TEXT, vision,
                          ("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight", ".bias"), CLIP_MEAN, CLIP_STD)


def write_tiny_qwen3_vl(folder: Path, tokenizer_dir: Path, seed: int = 0, moe: bool = False):
    """A Qwen3-VL checkpoint (Qwen3VLForConditionalGeneration): a LayerNorm tower of 3 blocks with learned
    positions (a 4 x 4 table interpolated to each image's grid) and 2-D rotary, deepstack features from its
    first two blocks added after the text model's first two layers; a Qwen3 text model with interleaved
    M-RoPE. Same tokens, template and image sizes as write_tiny_qwen2_5_vl. moe: a Qwen3-VL-MoE
    (Qwen3VLMoeForConditionalGeneration), its text model's layers 4 routed experts of width 48, top 2 (saved
    as transformers 5 holds them: gate_up_proj (E, 2F, D)). Returns the torch model."""
    text = {"head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                                "mrope_interleaved": True}}
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1)
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=QWEN_PATCH,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16,
                  deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh")
    return _write_qwen_vl(folder, tokenizer_dir, seed, "Qwen3VLMoe" if moe else "Qwen3VL", text, vision,
                          ("norm.weight", "norm1.weight", "norm2.weight", ".bias", "mlp.gate.weight"),
                          [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])


def write_tiny_qwen3_5_vl(folder: Path, tokenizer_dir: Path, seed: int = 0, moe: bool = False):
    """A Qwen3.5 checkpoint (Qwen3_5ForConditionalGeneration): Qwen3-VL's tower of write_tiny_qwen3_vl without
    deepstack, before the tiny Qwen3.5 hybrid text model (tiny_models: Gated DeltaNet on layers 0-2, gated
    attention on layer 3) with 32-dim heads, a quarter of them rotary under interleaved M-RoPE (sections 2, 1,
    1). moe: Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration). Returns the torch model."""
    from tiny_models import TINY_CONFIGS

    # (value heads as wide as key heads, as in every released Qwen3.5 and as llama.cpp's qwen35 requires)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
            "mrope_interleaved": True}
    text = {**TINY_CONFIGS["qwen3_5_moe" if moe else "qwen3_5"][1], "head_dim": 32, "linear_value_head_dim": 16,
            "rope_parameters": rope}
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=QWEN_PATCH,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16,
                  hidden_act="gelu_pytorch_tanh")
    return _write_qwen_vl(folder, tokenizer_dir, seed, "Qwen3_5Moe" if moe else "Qwen3_5", text, vision,
                          ("norm.weight", "norm1.weight", "norm2.weight", ".bias", "A_log", "dt_bias"),
                          [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])


# Mistral's chat template, cut to what the tests send: an image part becomes [IMG]
MISTRAL3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}[INST]{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}[IMG]"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}")
MISTRAL3_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]", "[/INST]", "</s>"]
# the tiny tower: 8-pixel patches merged 2 x 2 (16 pixels a token), images fitted within 64 pixels a side
MISTRAL3_PATCH, MISTRAL3_LONGEST_EDGE = 8, 64


def write_tiny_mistral3(folder: Path, tokenizer_dir: Path, seed: int = 0, text_type: str = "mistral",
                        feature_layer: int = -2):
    """A Mistral 3 checkpoint (Mistral3ForConditionalGeneration): a Pixtral tower of 3 blocks (SiLU-gated MLPs,
    2-D rotary) whose second block's output the projector reads (vision_feature_layer -2; -1, the released
    checkpoints' and the only one llama.cpp's pair holds: the last's), the 2 x 2 patch merger and a biased
    GELU MLP; a Mistral text model, or (text_type "ministral3") Ministral 3's with YaRN and its query
    temperature. Returns the torch model (float32, eval mode)."""
    import transformers

    folder = Path(folder)
    ids = write_tokenizer(folder, tokenizer_dir, MISTRAL3_TOKENS, "</s>", MISTRAL3_TEMPLATE)
    rope = ({"rope_type": "default", "rope_theta": 10000.0} if text_type == "mistral"
            else TINY_CONFIGS["ministral3"][1]["rope_parameters"])
    text = {**COMMON, "model_type": text_type, "vocab_size": VOCAB + 64, "pad_token_id": 0, "bos_token_id": 0,
            "eos_token_id": ids[5], "tie_word_embeddings": False, "sliding_window": None, "rope_parameters": rope}
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, patch_size=MISTRAL3_PATCH, image_size=MISTRAL3_LONGEST_EDGE,
                  hidden_act="silu", rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    config = transformers.Mistral3Config(text_config=text, vision_config=vision, image_token_index=ids[0],
                                         spatial_merge_size=2, vision_feature_layer=feature_layer,
                                         multimodal_projector_bias=True, tie_word_embeddings=False)

    def tweak(name, param):
        if "vision_tower" in name and name.endswith("_proj.weight"):  # peaked attention, blocks that change
            param.normal_(0.0, 0.2)  # their input: else the rotary and the feature layer hardly show

    model = random_model(transformers.Mistral3ForConditionalGeneration, config, seed,
                         ("norm.weight", "ln_pre.weight", ".bias"), tweak)
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "PixtralImageProcessor", "do_resize": True, "resample": 3, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "size": {"longest_edge": MISTRAL3_LONGEST_EDGE},
        "patch_size": {"height": MISTRAL3_PATCH, "width": MISTRAL3_PATCH}}, indent=2))
    (folder / "processor_config.json").write_text(json.dumps({
        "processor_class": "PixtralProcessor", "patch_size": MISTRAL3_PATCH, "spatial_merge_size": 2,
        "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}))
    return model

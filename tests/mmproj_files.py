"""Write a tiny HF vision-language checkpoint (tests/tiny_vlm.py) as the pair llama.cpp's converter writes
(for tests): the text model's GGUF (`convert_hf_to_gguf.py DIR`) and the mmproj GGUF (`... --mmproj`).

The text half is the language model written by gguf_families.write_family_gguf (the converter's text
path: SmolVLM's as a `llama`, Gemma 3's as a `gemma3`, Mistral 3's as a `mistral3` whether its text model is
Mistral's or Ministral 3's) with the checkpoint's own vocabulary: the base tokens, its added tokens at their
ids (special ones CONTROL) and [PAD<i>] up to vocab_size, as the converter's get_vocab_base writes a
tokenizer.json's. The mmproj follows MmprojModel and its
SmolVLMModel / Gemma3VisionModel subclasses (conversion/base.py, smolvlm.py, gemma.py): `clip.*` keys,
tensor names from the `gguf` package's MMPROJ name map, all float32 (--outtype f32) except Gemma 3's
input projection (forced to F16), Gemma 3's soft_emb_norm stored as 1 + w, the Pixtral tower's q / k rows
permuted as the text models' (Mistral 3: LlavaVisionModel, llava.py; like the converter, no
v.token_embd.img_break: its MmprojModel.filter_tensors drops the language_model.* embedding that
LlavaVisionModel would take [IMG_BREAK]'s row from; with_img_break adds it).
benchmarks/families_vs_llamacpp.py --mmproj checks both files against the real converter's.

Two ways this writer is kinder than the converter, both noted where they happen: a Gemma 3 checkpoint
saved by transformers 5 names its tower `vision_tower.*` where the converter knows only the hub's
`vision_tower.vision_model.*` (it stops: "Can not map tensor"); and the converter cuts Gemma 3's
token_embd to the tokenizer.json's token count, which on these tiny checkpoints leaves fewer rows than
tokens (a file neither vsurge nor llama.cpp loads): here the embedding stays whole.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np

from gguf_families import write_family_gguf
from gguf_files import _tokenizer_fields, llama_cpp_permute

# the language model's tensors in each VLM checkpoint layout -> the text model's own names
TEXT_PREFIXES = {"model.text_model.": "model.", "language_model.model.": "model.", "model.language_model.": "model.",
                 "language_model.lm_head.": "lm_head.", "lm_head.": "lm_head.",
                 "model.": "model."}  # (last: the hub's Qwen-VL layout, its text model directly under model.)
VISION_PREFIXES = ("visual.", "model.visual.", "model.vision_model.", "model.vision_tower.", "model.connector.",
                   "model.multi_modal_projector.")
PROJECTORS = {"idefics3": "idefics3", "smolvlm": "idefics3", "gemma3": "gemma3", "qwen2_5_vl": "qwen2.5vl_merger",
              "qwen3_vl": "qwen3vl_merger", "qwen3_vl_moe": "qwen3vl_merger", "qwen3_5": "qwen3vl_merger",
              "qwen3_5_moe": "qwen3vl_merger", "mistral3": "pixtral"}
# text GGUF architectures the converter names by the VLM, not by its text model's type (Mistral3Model)
TEXT_ARCH = {"mistral3": "mistral3"}
QWEN_VL = ("qwen2.5vl_merger", "qwen3vl_merger")


def write_pair(hf_dir: Path, text_path: Path, mmproj_path: Path, tokenizer_source: Path) -> None:
    """Both halves of the checkpoint in `hf_dir`; tokenizer_source: a GGUF file with its base vocabulary."""
    write_text_half(hf_dir, text_path, tokenizer_source)
    write_mmproj(hf_dir, mmproj_path)


def _read(hf_dir: Path, name: str) -> dict:
    path = Path(hf_dir) / name
    return json.loads(path.read_text()) if path.exists() else {}


def _state(hf_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    state = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        state.update({k: v.astype(np.float32) for k, v in load_file(f).items()})
    return state


def write_text_half(hf_dir: Path, path: Path, tokenizer_source: Path) -> None:
    """The language model as a text checkpoint of its own (its config the converter's merge of config.json
    and text_config), written by write_family_gguf with the checkpoint's vocabulary."""
    from safetensors.numpy import save_file

    cfg = _read(hf_dir, "config.json")
    text = {**{k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}, **cfg["text_config"]}
    text.pop("architectures", None)
    if cfg["model_type"] in ("qwen3_vl", "qwen3_vl_moe"):  # (gguf_families reads it: Qwen3VLTextModel's deepstack)
        text["deepstack_layers"] = len(cfg["vision_config"].get("deepstack_visual_indexes", []))
    state = {}
    for name, w in _state(hf_dir).items():
        prefix = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
        if prefix is not None and not name.startswith(VISION_PREFIXES):
            state[TEXT_PREFIXES[prefix] + name[len(prefix):]] = w
    half = Path(path).parent / (Path(path).stem + "-hf")
    half.mkdir(parents=True, exist_ok=True)
    (half / "config.json").write_text(json.dumps(text))
    save_file(state, str(half / "model.safetensors"), metadata={"format": "pt"})
    write_family_gguf(path, half, tokenizer_source, arch=TEXT_ARCH.get(cfg["model_type"]),
                      tokenizer=lambda w: _vocabulary(w, tokenizer_source, hf_dir, int(text["vocab_size"])))
    shutil.rmtree(half)


def _vocabulary(writer: gguf.GGUFWriter, source: Path, hf_dir: Path, vocab_size: int) -> None:
    """The converter's _set_vocab_gpt2 on the checkpoint's tokenizer: the base vocabulary (that of `source`),
    then each id up to vocab_size: an added token (CONTROL where special) or [PAD<i>] (UNUSED)."""
    base = _tokenizer_fields(Path(source))
    tokens, types = list(base["tokenizer.ggml.tokens"]), list(base["tokenizer.ggml.token_type"])
    added = {a["id"]: a for a in _read(hf_dir, "tokenizer.json")["added_tokens"]}
    for i in range(len(tokens), vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model(base["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(base["tokenizer.ggml.pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(base["tokenizer.ggml.merges"])
    special = _read(hf_dir, "tokenizer_config.json")  # SpecialVocab: the named tokens' ids
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("unk_token", writer.add_unk_token_id), ("pad_token", writer.add_pad_token_id)):
        if special.get(key) in tokens:
            add(tokens.index(special[key]))
    template = Path(hf_dir) / "chat_template.jinja"
    if template.exists():
        writer.add_chat_template(template.read_text())


def write_mmproj(hf_dir: Path, path: Path) -> None:
    """The vision tower and projector of the checkpoint in `hf_dir` as the converter's mmproj."""
    cfg = _read(hf_dir, "config.json")
    vision, text = cfg["vision_config"], {**cfg, **cfg.get("text_config", {})}
    processor = _read(hf_dir, "processor_config.json")
    pre = {**_read(hf_dir, "preprocessor_config.json"), **processor, **(processor.get("image_processor") or {})}
    projector = PROJECTORS[cfg["model_type"]]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"tiny-{cfg['model_type']}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)  # MmprojModel.set_gguf_parameters
    w.add_vision_projection_dim(text["hidden_size"])
    if projector in QWEN_VL:  # Qwen2VLVisionModel / Qwen3VLVisionModel.__init__: the tower's keys renamed
        side = int(vision.get("num_position_embeddings", 2304) ** 0.5) if projector == "qwen3vl_merger" else 0
        vision = {**vision, "image_size": side * vision["patch_size"] if side else vision.get("image_size", 560),
                  "num_attention_heads": vision["num_heads"], "num_hidden_layers": vision["depth"]}
    w.add_vision_image_size(vision["image_size"])
    w.add_vision_patch_size(vision["patch_size"])
    w.add_vision_embedding_length(vision["hidden_size"])
    w.add_vision_feed_forward_length(vision["intermediate_size"])
    w.add_vision_block_count(vision["num_hidden_layers"])
    w.add_vision_head_count(vision["num_attention_heads"])
    w.add_vision_image_mean(pre["image_mean"])
    w.add_vision_image_std(pre["image_std"])
    w.add_clip_projector_type(projector)
    if projector == "idefics3":  # SmolVLMModel.set_gguf_parameters
        w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-5))
        w.add_vision_projector_scale_factor(cfg.get("scale_factor", 2))
        w.add_vision_use_gelu(True)
        w.add_vision_preproc_image_size(pre.get("size", {}).get("longest_edge", vision["image_size"]))
    elif projector == "qwen2.5vl_merger":  # Qwen2VLVisionModel.set_gguf_parameters
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(vision["fullatt_block_indexes"][0] + 1)
        w.add_vision_attention_layernorm_eps(cfg.get("rms_norm_eps", 1e-6))
        # kinder than the converter: the tiny tower's windows (clip.cpp fixes them at every hub model's 112)
        w.add_uint32("clip.vision.window_size", vision["window_size"])
    elif projector == "qwen3vl_merger":  # Qwen3VLVisionModel.set_gguf_parameters
        w.add_vision_use_gelu(True)
        w.add_vision_spatial_merge_size(vision["spatial_merge_size"])
        w.add_vision_attention_layernorm_eps(cfg.get("text_config", {}).get("rms_norm_eps", 1e-6))
        deep = set(vision.get("deepstack_visual_indexes", []))
        w.add_vision_is_deepstack_layers([i in deep for i in range(vision["num_hidden_layers"])])
    elif projector == "pixtral":  # LlavaVisionModel.set_gguf_parameters (no vision_feature_layer: every block)
        w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-5))
        if vision["hidden_act"] == "silu":
            w.add_vision_use_silu(True)
        else:
            w.add_vision_use_gelu(True)
        if "spatial_merge_size" in cfg:
            w.add_vision_spatial_merge_size(cfg["spatial_merge_size"])
    else:  # Gemma3VisionModel.set_gguf_parameters: the pooling written only where it is not 4
        w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
        w.add_vision_use_gelu(True)
        pool = (vision["image_size"] // vision["patch_size"]) // int(pre.get("image_seq_length", 256) ** 0.5)
        if pool > 0 and pool != 4:
            w.add_vision_projector_scale_factor(pool)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    for name, array in _mmproj_tensors(_state(hf_dir), projector, vision):
        mapped = name if name.startswith(("v.", "mm.")) else names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, f"no mmproj name for {name}"
        if "input_projection" in name:  # Gemma3VisionModel.tensor_force_quant
            w.add_tensor(mapped, array.astype(np.float16))
        else:
            w.add_tensor(mapped, np.ascontiguousarray(array, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _mmproj_tensors(state: dict, projector: str, vision: dict):
    """(HF name as the converter's name map takes it, or the mmproj name it writes, array as stored) of the
    tower and projector."""
    if projector in QWEN_VL:
        yield from _qwen_vl_tensors(state, projector, vision)
        return
    for name, array in state.items():
        if projector == "idefics3":  # SmolVLMModel.filter_tensors
            if not ("vision_tower" in name or "vision_model" in name or "model.connector" in name):
                continue
        elif projector == "pixtral":  # LlavaVisionModel.modify_tensors
            if not name.startswith(("vision_tower.", "multi_modal_projector.")):
                continue
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                array = llama_cpp_permute(array, vision["num_attention_heads"])
        else:  # Gemma3VisionModel.filter_tensors / modify_tensors
            for old, new in (("model.vision_tower.", "vision_tower."), ("model.multi_modal_projector.",
                                                                       "multi_modal_projector.")):
                name = new + name[len(old):] if name.startswith(old) else name
            if not name.startswith(("multi_modal_projector.", "vision_tower.")) or "vision_model.head." in name:
                continue
            if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
                name = "vision_tower.vision_model." + name[len("vision_tower."):]  # (transformers 5's save: see above)
            name = name.replace("_weight", ".weight")
            if "soft_emb_norm.weight" in name:
                array = array + 1.0
        yield name, array


def _qwen_vl_tensors(state: dict, projector: str, vision: dict):
    """Qwen2VLVisionModel / Qwen3VLVisionModel.modify_tensors: the Conv3d split into one kernel per frame;
    Qwen2.5-VL's fused qkv split in three; Qwen3-VL's merger as mm.0 / mm.2 after v.post_ln and each
    deepstack merger under its tower block's index. Kinder than Qwen2VLVisionModel.filter_tensors, which
    keeps only the hub's `visual.*` names: transformers 5 saves them as `model.visual.*`."""
    deep = vision.get("deepstack_visual_indexes", [])
    for name, array in state.items():
        name = "visual." + name[len("model.visual."):] if name.startswith("model.visual.") else name
        if not name.startswith("visual."):
            continue
        if name == "visual.patch_embed.proj.weight":
            yield "v.patch_embd.weight", array[:, :, 0]
            yield "v.patch_embd.weight.1", array[:, :, 1]
        elif name == "visual.patch_embed.proj.bias":
            yield "v.patch_embd.bias", array
        elif ".qkv." in name and projector == "qwen2.5vl_merger":
            for part, piece in zip("qkv", np.split(array, 3, axis=0)):
                yield name.replace("qkv", part), piece
        elif name.startswith("visual.deepstack_merger_list."):
            j, rest = name.split(".", 3)[2:]
            part, leaf = rest.split(".")
            yield f"v.deepstack.{deep[int(j)]}.{part.replace('linear_', '')}.{leaf}", array
        elif name.startswith("visual.merger.") and projector == "qwen3vl_merger":
            part, leaf = name.split(".")[2:]
            yield {"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}[part] + f".{leaf}", array
        else:
            yield name, array


def with_img_break(mmproj: Path, text: Path, out: Path) -> Path:
    """A copy of a pixtral mmproj plus v.token_embd.img_break ([IMG_BREAK]'s row of the text GGUF's embedding),
    as older converters wrote it: clip.cpp requires it, and LlavaVisionModel means to write it, but today's
    converter leaves it out (its MmprojModel.filter_tensors drops the language_model.* embedding first)."""
    from vsurge.loading.gguf import dequantize
    from vsurge.loading.gguf_file import GGUFFile

    mm, tx = gguf.GGUFReader(mmproj), GGUFFile(text)  # (vsurge's: the gguf package's parses a vocabulary slowly)
    row = tx.fields["tokenizer.ggml.tokens"].index("[IMG_BREAK]")
    embd = dequantize(next(t for t in tx.tensors if t.name == "token_embd.weight"), [(row, row + 1)])  # (1, D)
    w = gguf.GGUFWriter(str(out), "clip")
    for key, field in mm.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in mm.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.add_tensor("v.token_embd.img_break", np.asarray(embd[0], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out

"""Loading models and processors from HF directories, GGUF files, or the embedded default."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import jax.numpy as jnp

from ..hardware.devices import compute_dtype, default_dtype, platform
from ..errors import ModelLoadError
from ..tokenizer import Processor
from .default_model import DEFAULT_MODEL_NAME, default_model_path
from ..config import BLOCK_QUANTIZATIONS, QUANTIZATIONS
from ..models.registry import family_for_gguf
from .gguf import GGUFSource, gguf_meta, open_gguf
from ..multimodal import image_config, image_processor_for
from .mmproj import check_mmproj_model, load_pair
from .hf import RenamedSource, SafetensorsSource, load_hf_config, read_hf_config
from .packed import PackedScheme, PackedSource
from .weights import assemble_weights, build_model, check_source

log = logging.getLogger(__name__)


__all__ = ["load", "load_processor", "resolve_model_path", "default_model_path", "DEFAULT_MODEL_NAME"]


def resolve_model_path(path: str | Path | None = "default") -> Path:
    if path is None or str(path) == "default":
        return default_model_path()
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model path {str(p)!r} does not exist (give an HF model directory, a .gguf file or 'default')")
    return p


def load(path: str | Path | None = "default", dtype=None, *, quantization: str | None = None,
         progress: bool = True, load_processor: bool = True, mesh=None, tensor_parallel_size: int | None = None,
         data_parallel_size: int | None = None, expert_parallel: bool = False, activation_passes: int | None = None,
         mmproj: str | Path | None = None):
    """Load `(model, processor)` from an HF directory, a `.gguf` file, or "default".

    dtype: the weights' dtype; default: devices.default_dtype() (bfloat16, except on a CPU without
        native bfloat16 dots: float32). Activations are float32 on CPU (the dots accumulate in
        float32 there) and the weights' dtype on GPU/TPU; dtype="float32" runs everything in
        float32 (what the numerical tests against transformers use). An explicit dtype also
        dequantizes a GGUF file's blocks.
    quantization: None (a GGUF file: its matrices and embedding stay in their block formats where
        `keeps_blocks` says so, the other weights float32; anything else: weights in `dtype`),
        "blocks" (GGUF: keep the blocks, an error where that is not possible), "none" (dequantize
        everything), "int8" (per-channel int8 matrices; faster on CPU, slightly less exact), "fp8"
        (per-channel float8_e4m3fn matrices and head: half of bfloat16's bytes on GPUs with fp8), or
        "int4" / "q8_0" (matrices and embedding quantized at load to GGUF q4_0 / q8_0 blocks, one
        scale per 32 weights, multiplied by the block kernel: on CPU only where it is available),
        "int4_g64", "int4_g128", "int8_g64", "int8_g128" (the same with one scale per 64 / 128
        weights, held in the same blocks). An AWQ / GPTQ checkpoint is read as it is (packed.py).
    progress: show a progress bar while reading weights (one per device when sharded).
    mesh: a jax Mesh (sharding.make_mesh) to load the weights onto, each device reading only its
        shard; or tensor_parallel_size / data_parallel_size to build one over the first devices.
        Without either, the model goes to the default device.
    expert_parallel: a mixture of experts splits whole experts over the tensor-parallel devices
        (vLLM's --enable-expert-parallel) instead of splitting every expert's hidden units.
    activation_passes: how the block kernel multiplies weights held in blocks: 2 (the activations'
        int8 rounding residual too: near-float logits), 1 (llama.cpp's arithmetic: about half the
        integer work); None: 2 below ~1B parameters, 1 above (ops/quantized.activation_passes). The
        choice holds in every step, however busy: a request's arithmetic never depends on the load.
    mmproj: llama.cpp's mmproj GGUF (vision tower and projector) of the vision-language model whose text
        model `path` is (a GGUF file): the pair loads as the one model (loading/mmproj.py).
    """
    if activation_passes not in (None, 1, 2):
        raise ValueError(f"activation_passes must be 1 or 2, got {activation_passes!r}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"unsupported quantization {quantization!r} (supported: {', '.join(QUANTIZATIONS)})")
    p = resolve_model_path(path)
    explicit_dtype = dtype is not None
    dtype = default_dtype() if dtype is None else dtype
    start = time.perf_counter()
    if mmproj is not None:
        check_mmproj_model(p)
    if p.is_dir():
        family, config = load_hf_config(p)
        source, fmt = SafetensorsSource(p), "hf"
        if family.hf_renames:
            source = RenamedSource(source, family.hf_renames)
        source = family.hf_source(source)
        if getattr(family, "accepts_images", False):
            config = image_config(config, p)  # the image processor's normalization, for the tower
        packed = PackedScheme.from_config(read_hf_config(p), str(p / "config.json"))
        if packed:  # AWQ / GPTQ: the packed layers read as float weights, or as blocks
            source = PackedSource(source, packed)
        processor = Processor.from_dir(p, extra_eos_token_ids=config.eos_token_ids) if load_processor else None
        if processor is not None and getattr(family, "accepts_images", False):
            processor.images = image_processor_for(config, p, processor)
    elif p.suffix.lower() == ".gguf" or p.is_file():
        packed = None
        reader, fmt = open_gguf(p), "gguf"
        if mmproj is not None:
            family, config, source, preprocessor = load_pair(reader, p, mmproj)
        else:
            meta = gguf_meta(reader, p)
            family = family_for_gguf(meta)
            config = family.config_from_gguf(meta, meta.where)
            source = GGUFSource(reader, p, family.gguf_config_tensors)
        processor = None
        if load_processor:
            fields = {k: v for k, v in reader.fields.items() if k.startswith("tokenizer.")}
            processor = Processor.from_gguf_metadata(fields, name_or_path=str(p))
            if mmproj is not None:
                processor.images = image_processor_for(config, None, processor, preprocessor)
    else:
        raise ModelLoadError(f"model path {str(p)!r} is neither a directory nor a .gguf file")
    if mesh is None and (tensor_parallel_size or data_parallel_size):
        from ..hardware.sharding import make_mesh

        mesh = make_mesh(tensor_parallel_size or 1, data_parallel_size or 1)
    if expert_parallel:
        if not hasattr(config, "expert_parallel"):
            raise ValueError(f"expert parallelism needs a mixture-of-experts model; {p} is {config.architecture}")
        config = config.replace(expert_parallel=True)
    blocks, stack_dtype = False, None
    if (fmt == "gguf" or packed) and quantization in (None, "blocks"):
        blocks, why = keeps_blocks(explicit_dtype, quantization)
        if quantization == "blocks" and not blocks:
            raise ValueError(f"cannot keep {p}'s weights in blocks: {why}")
        kind = packed.describe() if packed else "GGUF"
        log.info("%s %s: %s", kind, "blocks kept" if blocks else "dequantized at load", why)
        if blocks and not explicit_dtype and fmt == "gguf":
            dtype = jnp.float32  # what is not in blocks (norms, biases, float tensors) is small ...
            stack_dtype = default_dtype()  # ... but expert stacks are not: bfloat16 where the CPU multiplies it
            # natively, half the bytes every decode step reads (a Q8_0 weight rounds to 8 significant bits)
    elif quantization == "blocks":
        raise ValueError("quantization='blocks' keeps a GGUF file's or an AWQ/GPTQ checkpoint's blocks; "
                         "use int4 or int8 for other checkpoints")
    elif packed and quantization != "none":
        raise ValueError(f"{p} is quantized already ({packed.describe()}); "
                         f"quantization={quantization!r} would quantize it twice")
    if quantization in ("blocks", "none"):
        quantization = None
    if mesh is None:
        weights = assemble_weights(family, config, source, dtype, fmt, progress=progress, blocks=blocks,
                                   stack_dtype=stack_dtype)
        model = build_model(family, config, weights, dtype, compute_dtype(dtype), stack_dtype,
                            quantizer=PLACED_QUANTIZERS.get(quantization)).prepare_mixed_dtypes()
    else:
        from ..hardware.sharding import tensor_parallel_size as tp_of
        from .sharded import load_sharded

        check_source(family, config, source, fmt)
        model_config = config.for_tensor_parallel(tp_of(mesh))
        weights = load_sharded(family, config, model_config, source, dtype, fmt, mesh, progress=progress,
                               blocks=blocks, stack_dtype=stack_dtype)
        model = build_model(family, model_config, weights, dtype, compute_dtype(dtype), stack_dtype)
    if quantization:
        if quantization == "fp8" and platform() == "cpu":
            log.warning("fp8 weights on CPU are converted at every step (XLA:CPU has no fp8 arithmetic); "
                        "int4 / q8_0 blocks are the CPU's quantized weights")
        if quantization in BLOCK_QUANTIZATIONS:
            from .. import kernels

            if not kernels.available():
                log.warning("%s weights without the block kernel (%s): every step dequantizes them", quantization,
                            kernels.unavailable_reason())
        model.quantize(quantization)
    if model.block_formats():
        from ..ops.quantized import activation_passes as passes_for

        model.use_activation_passes(activation_passes or passes_for(config))
    if platform() == "cpu":
        from flax import nnx

        from . import huge_pages

        huge_pages.in_background(nnx.state(model))  # decode streams the weights: fewer TLB misses
    log.info("loaded %s%s (%s, %.1fM params, %.1f MiB of weights) in %.1fs", p,
             f" with mmproj {mmproj}" if mmproj is not None else "", config.architecture,
             model.num_params / 1e6, model.weight_bytes / 2**20, time.perf_counter() - start)
    return model, processor


def _placed_quantizers():
    from ..ops.linear import quantize_fp8, quantize_int8

    return {"int8": quantize_int8, "fp8": quantize_fp8}


PLACED_QUANTIZERS = _placed_quantizers()  # quantizations applied to each layer matrix as it is placed


def keeps_blocks(explicit_dtype: bool, quantization: str | None = None) -> tuple[bool, str]:
    """(whether a GGUF file's blocks stay as they are, why). They do where the block kernel runs:
    on CPU with vsurge's C++ kernel loaded, unless a dtype was asked for. Elsewhere they are
    dequantized at load: the kernel's fallback dequantizes every weight at every step (~1 s per
    decode step for the default model on a CPU), and accelerators lack the kernel."""
    from .. import kernels

    if explicit_dtype and quantization != "blocks":
        return False, "a dtype was given (the weights are dequantized to it)"
    if platform() != "cpu":
        return False, f"the block kernel runs on CPU, this is {platform()}"
    if not kernels.available():
        return False, f"the block kernel is not available ({kernels.unavailable_reason()})"
    return True, f"multiplied by the {kernels.variant()} kernel (CPU ISA {kernels.cpu_isa()})"


def load_processor(path: str | Path | None = "default") -> Processor:
    """Only the processor (tokenizer + chat template) of a model: no weights are read.

    For tokenizer work (grammar compilation, tests, benchmarks) where loading weights would waste seconds."""
    p = resolve_model_path(path)
    if p.is_dir():
        return Processor.from_dir(p, extra_eos_token_ids=load_hf_config(p)[1].eos_token_ids)
    reader = open_gguf(p)
    fields = {k: v for k, v in reader.fields.items() if k.startswith("tokenizer.")}
    return Processor.from_gguf_metadata(fields, name_or_path=str(p))

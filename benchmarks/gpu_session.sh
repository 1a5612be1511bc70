#!/usr/bin/env bash
# docs/performance.md's GPU column on a borrowed one-GPU machine (this workplace's `run` tool), in one call:
#
#   bash benchmarks/gpu_session.sh PARTS_DIR SECONDS [CODE_DIR] [serve|roofline]
#
# (roofline: benchmarks/roofline.py, both models at 1/16/64/256 streams, then the 8B shape with
# JAX's Pallas decode kernel, instead of the serving table.)
# run from the repository root there. Why the parts: the default model file (98 MB GGUF) is over
# what one call may carry (64 MiB), so it travels in two calls. PARTS_DIR holds head.bin (the
# file's bytes before its tensor data: metadata, tokenizer, tensor table) and a.bin or b.bin (the
# two halves of the tensor data); the machine keeps every part it was given in /tmp while it stays
# warm (30 s between calls), so the second call assembles the real file and checks its sha256.
# A half missing there (a fresh machine) becomes random weights of the same types and shapes and
# the log says WEIGHTS: NOT THE REAL ONES: the timings hold (same programs, same shapes), the text
# is meaningless. The packages the machine lacks travel as wheels in .whl/ (flax in .whl/alt/,
# used only if the machine's own flax fails to import vsurge); vsurge runs from CODE_DIR/src
# (default: the working tree) on PYTHONPATH. SECONDS bounds the whole script.
#
# Here, before the calls (.whl, .gpu1, .gpu2, .snap listed in .git/info/exclude; pip download
# as the device notes say, for cp312 manylinux: gguf fastapi starlette uvicorn pydantic
# pydantic_core annotated-types typing-inspection llguidance opentelemetry-api typing_extensions,
# flax into .whl/alt):
#   python benchmarks/model_parts.py split .gpu1 .gpu2
#   rm -rf .snap && mkdir .snap && git archive HEAD | tar -x -C .snap && git rev-parse HEAD >.snap/COMMIT
# then `run` with carry [.whl, .gpu1, .snap]: bash .snap/benchmarks/gpu_session.sh .gpu1 200 .snap
# and at once after it, carry [.whl, .gpu2, .snap]: bash .snap/benchmarks/gpu_session.sh .gpu2 300 .snap
set -u
PARTS=$1
BUDGET=${2:-300}
CODE=$(cd "${3:-.}" && pwd)
START=$(date +%s)
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
left() { echo $((BUDGET - ($(date +%s) - START))); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VSURGE_COMPILATION_CACHE=/tmp/xla-cache JAX_COMPILATION_CACHE_DIR=/tmp/xla-cache

echo "== $(date -u +%FT%TZ) code $(cat "$CODE/COMMIT" 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

echo "== wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=$CODE/src:/tmp/model-site:/tmp/site

echo "== model parts: this call brought $(ls "$PARTS" | tr '\n' ' ')"
echo "   already on this machine: $(ls /tmp/vsurge-parts 2>/dev/null | tr '\n' ' ')"
python3 "$CODE/benchmarks/model_parts.py" assemble "$PARTS"   # -> /tmp/vsurge-weights says which weights

echo "== import check"
IMPORTS='import jax, flax, vsurge, vsurge.cli, vsurge.server.app, vsurge.loading.gguf
print("python", __import__("sys").version.split()[0], "jax", jax.__version__, "flax", flax.__version__, jax.devices())'
if ! python3 -c "$IMPORTS"; then
    echo "vsurge does not import with this machine's flax: trying the carried one"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-flax \
        .whl/alt/*.whl || exit 1
    export PYTHONPATH=$CODE/src:/tmp/site-flax:/tmp/model-site:/tmp/site
    python3 -c "$IMPORTS" || { echo "import check failed"; exit 1; }
fi

if [ "${4:-serve}" = roofline ]; then  # the 4th argument: benchmarks/roofline.py instead of the serving table
    echo "== roofline, XLA paged attention ($(left) s left)"
    timeout --signal=INT $(($(left) / 2)) python3 "$CODE/benchmarks/roofline.py" --streams 1,16,64,256
    echo "== roofline, JAX's Triton decode kernel (--attention-backend gpu), 8B shape ($(left) s left)"
    timeout --signal=INT $(($(left) - 10)) \
        python3 "$CODE/benchmarks/roofline.py" --models 8b --streams 1,64 --attention-backend gpu
    echo "== done in $(($(date +%s) - START)) s"
    exit 0
fi

echo "== scale_accelerator ($(left) s left)"
timeout --signal=INT $(($(left) > 40 ? $(left) - 10 : 30)) \
    python3 "$CODE/benchmarks/scale_accelerator.py" --skip-tests --concurrency 1,16,32 --server-log "$OUT/server.log"
echo "scale_accelerator exit $?"
cat /tmp/vsurge-weights

if grep -q "real default model" /tmp/vsurge-weights && [ "$(left)" -gt 100 ]; then
    echo "== tests/loading/test_default_model.py on the GPU, float32 against transformers ($(left) s left)"
    # JAX's default float32 matmul precision on GPU fails the logits test (0.083 > 2e-3); highest passes
    (cd "$CODE" && JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout $(($(left) - 10)) \
        python3 -m pytest -q -p no:cacheprovider tests/loading/test_default_model.py)
    echo "tests exit $?"
fi
echo "== done in $(($(date +%s) - START)) s"

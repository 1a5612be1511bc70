#!/usr/bin/env bash
# docs/tpu.md's tables on a borrowed TPU (this workplace's `run` tool: one v5e chip, no TCP, 64 MiB a call),
# run from the repository root there:
#
#   bash benchmarks/tpu.sh STAGES SECONDS [DIR ...]
#
# STAGES, comma-separated, in this order (int8, prefill, default and shapes: the roofline's parts alone):
#   roofline    benchmarks/roofline.py: the 8B shape with int8 weights at 1 / 64 streams; 1B and 3B prefill at
#               2048 tokens; the default model at 1 / 16 / 64; the 1B shape at 1 / 16 / 64 / 256 and the 3B
#               shape at 1 / 64 / 256 (random bfloat16 weights, 512-token prompts, 8 decode steps a call)
#   (inprocess and server: serving's two halves alone, server with a third start from vsurge's program store;
#   TRACE=1 in the environment: the default and hybrid stages write perfetto traces of their decode calls to
#   $OUT/trace, flattened to $OUT/trace-NAME.json.gz)
#   probe       benchmarks/compile_probe.py: a mixed program of the default model compiled alone under the profiler
#               (XLA's passes: benchmarks/host_trace_summary.py on the trace), and a decode program
#   serving     benchmarks/tpu_serving.py: vSurge in-process (1B shape, default model; 1 and 64 concurrent
#               512-token prompts, 128 greedy tokens) and `vsurge serve --uds` + `vsurge bench serve --uds` on the
#               default model under the same load; the server's ready time cold and from the compilation cache
#   agreement   benchmarks/tpu_agreement.py check: the real default model's float32 logits against transformers'
#               and its bfloat16 greedy tokens against the CPU's (references made here, below)
#   attention   benchmarks/tpu_attention.py: JAX's ragged kernel (what the tpu backend runs) and ejkernel's v3
#               kernel on the same decode rows (needs the ejkernel wheels)
#   asserved    benchmarks/tpu_serving.py in-process on the default model with what `vsurge serve` adds (the
#               host tier, the model's sampling defaults), then without: the server's one-stream first token
#   wide        benchmarks/roofline.py: the 1B shape at 256 streams with 4 queries a kernel block on decode steps
#               (8 is the default), a perfetto trace of its decode calls to $OUT
#   hybrid      benchmarks/roofline.py --models hybrid: a ~0.5B Qwen3.5-shaped hybrid (Gated DeltaNet) against
#               the dense model of its size, 1 and 32 streams, against the roofline (states read and written);
#               HYBRID=hybrid-alone and HYBRID_STREAMS=32 in the environment: the hybrid alone, those streams;
#               first benchmarks/tpu_gated_delta.py: the Pallas delta kernel against XLA's gather/step/scatter
#   esurge      benchmarks/esurge_side_by_side.py: EasyDeL's eSurge on the 1B shape, 64 concurrent 512-token
#               prompts, 128 tokens, 64 tokens a step (at its default 768 its 7 buckets compile for longer than
#               a call's 10 minutes) (needs a DIR holding its wheels: benchmarks/esurge_install.sh installs them
#               and the machine's index's into /tmp/site-esurge, which only this stage reads)
#   images      benchmarks/images.py --uds: `vsurge serve` on a random SmolVLM-256M-shaped checkpoint, 8
#               concurrent one-image requests against text of the same token count (needs a DIR holding the
#               checkpoint's skeleton: benchmarks/model_skeleton.py describe)
# SECONDS bounds the whole script (each stage gets what is left, the roofline's steps a share). Every DIR may
# hold wheels (*.whl: installed into /tmp/site; the machine lacks fastapi, uvicorn, gguf, ...), parts of the
# default model (*.bin: benchmarks/model_parts.py) and the agreement references (*.npz). The machine keeps
# what it was given while it stays warm, so a later call needs only what is new. Everything printed also
# goes to $OUT/tpu.log, the server's log to $OUT/serve.log.
#
# Here, before the calls (folders listed in .git/info/exclude; wheels as ../shared/tpu/README.md says):
#   python benchmarks/model_parts.py split .tpu-a .tpu-b
#   python benchmarks/tpu_agreement.py reference .tpu-ref/agreement.npz
#   call 1, carry [.tpu/whl, .tpu-a]:   bash benchmarks/tpu.sh roofline 570 .tpu/whl .tpu-a
#   call 2, carry [.tpu-b, .tpu-ref]:   bash benchmarks/tpu.sh agreement,serving 570 .tpu-b .tpu-ref
# (the file's halves and the wheels do not fit one call; without part b the weights are random of the same
# shapes, which the timings do not mind and the agreement stage says.)
set -u
STAGES=${1:?stages}
BUDGET=${2:-570}
shift 2
START=$(date +%s)
OUT=${OUT:-/tmp/tpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/tpu.log") 2>&1
left() { echo $((BUDGET - ($(date +%s) - START))); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VSURGE_COMPILATION_CACHE=/tmp/xla-cache JAX_COMPILATION_CACHE_DIR=/tmp/xla-cache
CODE=$(pwd)

echo "== $(date -u +%FT%TZ) code $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)') stages $STAGES, $BUDGET s"
mkdir -p /tmp/site /tmp/vsurge-refs
for dir in "$@"; do
    wheels=$(ls "$dir"/*.whl 2>/dev/null)
    if [ -n "$wheels" ]; then
        echo "== wheels from $dir"
        python3 -m pip install -q --isolated --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site $wheels 2>&1 | grep -v "already exists" | tail -3
    fi
    cp "$dir"/*.npz /tmp/vsurge-refs/ 2>/dev/null
    if [ -f "$dir/skeleton.json" ] && [ ! -d /tmp/vsurge-vlm ]; then
        python3 benchmarks/model_skeleton.py fill "$dir" /tmp/vsurge-vlm
    fi
done
if [ ! -d /tmp/site-flax ]; then  # the machine's own index has flax (not its default path)
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
        --index-url file:///opt/pypi/simple --target /tmp/site-flax flax 2>&1 | tail -3
fi
MACHINE_PYTHONPATH=${PYTHONPATH:-}  # the machine's own (its JAX): eSurge's set goes after it, vsurge's apart
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$CODE/src:$CODE/benchmarks:/tmp/model-site:/tmp/site:/tmp/site-flax

echo "== the default model's file"
PARTS=$(for dir in "$@"; do ls "$dir"/*.bin >/dev/null 2>&1 && echo "$dir"; done | head -1)
python3 benchmarks/model_parts.py assemble "${PARTS:-/nonexistent}" || exit 1
python3 -c 'import jax, flax, vsurge, vsurge.server.app
print("jax", jax.__version__, "flax", flax.__version__, jax.devices())' || exit 1
python3 -c 'import time; began = time.time(); import jax; jax.devices()  # what every process pays before its work
print(f"== the TPU runtime opened in {time.time() - began:.1f} s (import jax, jax.devices())")'

step() {  # step SHARE_OF_WHAT_IS_LEFT_PERCENT TITLE COMMAND...
    local share=$1 title=$2
    shift 2
    local t=$(($(left) * share / 100))
    if [ "$t" -lt 40 ]; then echo "== skipped (time): $title"; return; fi
    echo "== $title ($t s of $(left) s left)"
    timeout --signal=INT "$t" "$@"
    echo "== exit $? ($title)"
}

for stage in ${STAGES//,/ }; do
    case $stage in
    roofline|int8|prefill|default|shapes)
        R="python3 benchmarks/roofline.py --decode-steps 8"
        case $stage in roofline|int8) step 45 "8B shape, int8 weights" \
            $R --models 8b --quantization int8 --streams 1,64 --decode-steps 4 --reps 8 ;; esac
        case $stage in roofline|prefill) step 70 "prefill, 2048-token prompts" \
            $R --models 1b,3b --streams 1 --prompt-len 2048 --prefill-tokens 2048 ;; esac
        case $stage in roofline|default) step 60 "default model" $R --models default --streams 1,16,64 \
            ${TRACE:+--trace "$OUT/trace"} ;; esac
        case $stage in roofline|shapes) step 50 "1B shape" $R --models 1b --streams 1,16,64,256
                                        step 95 "3B shape" $R --models 3b --streams 1,64,256 ;; esac
        ;;
    serving)
        step 95 "vSurge in-process and serve --uds" python3 benchmarks/tpu_serving.py --models 1b,default \
            --concurrency 1,64 --serve --out "$OUT"
        ;;
    inprocess)
        step 95 "vSurge in-process" python3 benchmarks/tpu_serving.py --models 1b,default --concurrency 1,64 \
            --out "$OUT"
        ;;
    server)
        step 95 "serve --uds" python3 benchmarks/tpu_serving.py --models "" --concurrency 1,64 --serve \
            --program-store --out "$OUT"
        ;;
    served)
        step 95 "serve --uds, cold and from the cache" python3 benchmarks/tpu_serving.py --models "" \
            --concurrency 1,8 --serve --out "$OUT"
        ;;
    probe)
        step 50 "compile probe: a mixed program, traced" python3 benchmarks/compile_probe.py --skip-engine \
            --only mixed --programs 1 --trace "$OUT/trace"
        step 95 "compile probe: a decode program" python3 benchmarks/compile_probe.py --skip-engine \
            --only decode --programs 1
        ;;
    agreement)
        step 60 "the real default model against the CPU's references" \
            python3 benchmarks/tpu_agreement.py check /tmp/vsurge-refs/agreement.npz
        ;;
    attention)
        step 30 "JAX's ragged kernel" python3 benchmarks/tpu_attention.py --shapes 1b,3b,default --rows 16,64,256
        step 95 "ejkernel's v3 kernel" python3 benchmarks/tpu_attention.py --shapes 1b,3b,default --rows 16,64,256 \
            --kernel ejkernel-v3
        ;;
    asserved)
        step 50 "vSurge in-process as served (host tier, the model's sampling defaults)" \
            python3 benchmarks/tpu_serving.py --models default --concurrency 1,8 --as-served --out "$OUT"
        step 95 "vSurge in-process, plain" python3 benchmarks/tpu_serving.py --models default --concurrency 1,8 \
            --out "$OUT"
        ;;
    wide)
        step 95 "1B shape, 256 streams, 4 queries a block" python3 benchmarks/roofline.py --decode-steps 8 \
            --models 1b --streams 256 --decode-queries 4 --trace "$OUT/trace"
        ;;
    hybrid)
        step 15 "the gated delta decode kernel against XLA's form" python3 benchmarks/tpu_gated_delta.py
        step 95 "hybrid against dense" python3 benchmarks/roofline.py --decode-steps 8 --models "${HYBRID:-hybrid}" \
            --streams "${HYBRID_STREAMS:-1,32}" --prompt-len 512 ${TRACE:+--trace "$OUT/trace"}
        ;;
    esurge)
        EDL=$(for dir in "$@"; do ls "$dir"/easydel-*.whl >/dev/null 2>&1 && echo "$dir"; done | head -1)
        if [ -n "$EDL" ]; then
            bash benchmarks/esurge_install.sh "$EDL" /tmp/site-esurge
            ESURGE_PATH=${MACHINE_PYTHONPATH:+$MACHINE_PYTHONPATH:}/tmp/site-esurge
            step 95 "EasyDeL eSurge, 1B shape" env PYTHONPATH="$ESURGE_PATH" \
                python3 benchmarks/esurge_side_by_side.py --shape 1b --streams 64 --max-batched-tokens 64 --no-warmup
        else
            echo "== skipped: esurge (no DIR held easydel's wheels)"
        fi
        ;;
    images)
        if [ -d /tmp/vsurge-vlm ]; then
            step 95 "images against text" python3 benchmarks/images.py --uds --warm --model /tmp/vsurge-vlm
            cp /tmp/serve-bench-*.log "$OUT/" 2>/dev/null
        else
            echo "== skipped: images (no DIR held the checkpoint's skeleton)"
        fi
        ;;
    *) echo "unknown stage $stage" ;;
    esac
done
for trace in "$OUT"/trace/*/plugins/profile/*/*.trace.json.gz; do  # the tool brings back 16 folders deep at most
    [ -f "$trace" ] && mv "$trace" "$OUT/trace-$(basename "$(dirname "$(dirname "$(dirname "$(dirname "$trace")")")")").json.gz"
done
rm -rf "$OUT/trace"
echo "== done in $(($(date +%s) - START)) s"

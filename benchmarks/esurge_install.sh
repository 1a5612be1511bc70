#!/bin/bash
# EasyDeL eSurge's minimal set on the TPU machine, into SITE (put it at the END of PYTHONPATH), for
# benchmarks/esurge_side_by_side.py: the machine's own index (file:///opt/pypi/simple), torch's CPU build from
# /opt/wheels (easydel.modules imports it), and the wheels in WHEELS (not in the index, or pinned to another
# version there: easydel 0.3.0, eformer, ejkernel 0.0.78, transformers 5.5.4, flax 0.12.3 (0.12.8's GraphDef
# hashing fails eSurge's compile), fastapi 0.140 (later ones need opentelemetry), chex, plum-dispatch, ...).
# Here: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 ... -d .tpu-edl <those>
#
#   bash benchmarks/esurge_install.sh WHEELS [SITE]
# One pip call: two --target installs would clobber each other's shared google/ folder.
set -e
WHEELS=${1:?a folder of wheels}
S=${2:-/tmp/site}
[ -d "$S/easydel" ] && exit 0
env PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-deps --no-compile --no-cache-dir \
  --only-binary=:all: --upgrade --target "$S" --index-url file:///opt/pypi/simple --find-links /opt/wheels \
  absl-py annotated-doc annotated-types anyio beartype cffi charset-normalizer cryptography einops filelock \
  fsspec google-api-core google-auth googleapis-common-protos h11 httpcore httpx huggingface-hub==1.33.0 \
  jaxtyping jsonschema jsonschema-specifications mergedeep msgpack msgspec optax pillow protobuf \
  pydantic==2.13.5 pydantic-core==2.46.5 pyzmq ray referencing regex rich rpds-py safetensors tblib tensorstore \
  tokenizers==0.22.2 toolz tqdm treescope typing-extensions==4.16.0 typing-inspection click uvicorn wadler-lindig \
  torch==2.13.0+cpu "$WHEELS"/*.whl

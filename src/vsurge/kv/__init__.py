"""Key/value caches. Each is a pytree with one method the model calls per layer:

    out, cache = cache.attend(layer, q, k, v, positions)

so the model never knows how keys and values are stored. `page_manager` (which
page belongs to whom) is pure Python and imports no JAX.
"""

# The KV cache's storage dtypes (--kv-cache-dtype): quant.py stores them; here, apart from quant.py
# (which imports JAX), so engine/engine_config.py and the CLI can check the name without JAX.
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "fp8")
# hybrid models' recurrent states (--state-dtype; recurrent.py state_dtype)
STATE_DTYPES = ("auto", "float32", "bfloat16")
# the attention backends (--attention-backend; backends/ holds them): each owns its page layout, writes and kernels
ATTENTION_BACKENDS = ("auto", "cpu", "xla", "gpu", "tpu")

"""Key/value caches. Each is a pytree with one method the model calls per layer:

    out, cache = cache.attend(layer, q, k, v, positions)

so the model never knows how keys and values are stored. `page_manager` (which
page belongs to whom) is pure Python and imports no JAX.
"""

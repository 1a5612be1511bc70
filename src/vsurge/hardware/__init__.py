"""The devices vsurge runs on: their platform and the dtypes that suit it (devices.py), meshes over
them with where each weight and KV-cache array lives (sharding.py), and JAX's persistent cache of
what was compiled for them (compilation_cache.py)."""

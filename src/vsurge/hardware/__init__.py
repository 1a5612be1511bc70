"""The devices vsurge runs on: their platform and the dtypes that suit it (devices.py), and meshes over
them with where each weight and KV-cache array lives (sharding.py)."""

"""The seed API's compatibility surface (EasyDeL's vEngine, oEngine, vDriver, oDriver and the
seed-only methods of vSurge), on top of vsurge's engine: nothing under engine/ or vinference/
imports from here. The seed's engine keywords become an EngineConfig in one place,
engine_kwargs.py; docs/seed_api.md lists where the seed's names behave otherwise than its
documents say, and why."""

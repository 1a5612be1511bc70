"""The seed API's compatibility surface (EasyDeL's vInference, vEngine, oEngine, vDriver, oDriver,
their abstract classes and the seed-only methods of vSurge), on top of vsurge's engine: only the
package root imports from here, to re-export the seed's names (tests/test_structure.py). The seed's
engine keywords become an EngineConfig in one place, engine_kwargs.py; docs/seed_api.md lists where
the seed's names behave otherwise than its documents say, and why."""

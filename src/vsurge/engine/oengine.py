"""Moved: the page pool helpers are in engine/pools.py, the oEngine class (the seed's) in
seed/engines.py. Kept so `from vsurge.engine.oengine import pages_that_fit` goes on working."""

from .pools import make_page_pool, pages_that_fit  # noqa: F401

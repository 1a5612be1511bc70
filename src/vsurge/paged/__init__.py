"""Paged KV cache: page manager, scheduler, paged attention."""

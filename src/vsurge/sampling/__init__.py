"""How a request samples: SamplingParams, the one declaration of every sampling field (params.py), and
what the fields a request leaves unset default to (defaults.py). Pure Python: no JAX."""

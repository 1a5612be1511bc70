"""The model families, one module each: a module here that defines a class declaring `hf_model_types` or
`gguf_architectures` (parts/base.py) is a family, found by models/registry.py; nothing else lists them."""

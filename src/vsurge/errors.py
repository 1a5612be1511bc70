"""Exceptions that name what went wrong, so users can fix it without reading code."""


class VsurgeError(Exception):
    """Base class of vsurge's own errors."""


class ModelLoadError(VsurgeError, ValueError):
    """A model could not be loaded: missing file, bad shape, unknown key."""


class UnsupportedModelError(ModelLoadError):
    """The architecture, an option of it, or a quantization type is not supported."""

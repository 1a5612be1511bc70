"""Pure JAX building blocks of the model: no state, no engine knowledge."""

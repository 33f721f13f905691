"""medjax: fault-tolerant multi-modal training in JAX."""

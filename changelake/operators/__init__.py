"""Stateful changelog operators: pure batch-at-a-time kernels plus thin Spark bindings."""

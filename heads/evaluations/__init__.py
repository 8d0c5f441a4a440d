"""Evaluations that test what heads do: causal checks, ACT calibration, KV-cache and pruning
evaluations."""

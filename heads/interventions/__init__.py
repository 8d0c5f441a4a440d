"""Interventions on a model's heads: masking, ACT, structural and KV-cache pruning."""

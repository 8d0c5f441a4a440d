"""Model loading, the hooked wrapper, capture of attention statistics and states, probes."""

from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel, load_model
from headhunt.probes.loading import DEFAULT_MODEL, REGISTRY

__all__ = [
    "DEFAULT_MODEL",
    "REGISTRY",
    "AttentionCall",
    "AttentionHook",
    "HookedModel",
    "load_model",
]

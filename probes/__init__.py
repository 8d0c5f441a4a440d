"""Model loading, the hooked wrapper, capture of attention statistics and states, probes."""

from importlib import import_module
from typing import Any

# Lazy attributes: importing a torch-free module of the package (``headhunt.probes.configs``,
# the probe method's capture and fitting configs, read by the CLI's --help and the dashboard)
# loads no torch.
_EXPORTS = {
    "AttentionCall": "headhunt.probes.attention",
    "AttentionHook": "headhunt.probes.attention",
    "HookedModel": "headhunt.probes.hooked",
    "load_model": "headhunt.probes.hooked",
    "DEFAULT_MODEL": "headhunt.probes.loading",
    "REGISTRY": "headhunt.probes.loading",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'headhunt.probes' has no attribute {name!r}")


__all__ = [
    "DEFAULT_MODEL",
    "REGISTRY",
    "AttentionCall",
    "AttentionHook",
    "HookedModel",
    "load_model",
]

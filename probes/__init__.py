"""Model loading, the hooked wrapper, capture of attention statistics and states, probes."""

from headhunt.lazy import lazy_attributes

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


__getattr__ = lazy_attributes(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

"""The built-in format families, in the order the registry lists them (docs, error messages, UI choices)."""

from __future__ import annotations


def register_builtin(registry) -> None:
    """Register kvviz's own families (each module's FAMILY) into `registry`."""
    from . import ds_mla, floats, fp4, ggml, ints, tq_paper, turboquant, ultraquant, vllm

    for module in (floats, ints, fp4, ggml, tq_paper, vllm, turboquant, ultraquant, ds_mla):
        registry.register(module.FAMILY)

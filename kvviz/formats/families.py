"""The built-in format families, registered into `family.REGISTRY` in the order the registry lists them (docs,
error messages, UI choices). kvviz/formats/__init__.py imports this module first, so the parser and every other
module of the package see the built-in families however the package is imported."""

from __future__ import annotations

from . import ds_mla, floats, fp4, ggml, ints, tq_paper, turboquant, ultraquant, vllm
from .family import REGISTRY

BUILTIN = (floats, ints, fp4, ggml, tq_paper, vllm, turboquant, ultraquant, ds_mla)

for _module in BUILTIN:
    REGISTRY.register(_module.FAMILY)

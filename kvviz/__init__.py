"""kvviz: a KV-cache quantization playground.

The public API is re-exported here; everything else is private to its module.
"""

from .formats import FORMAT_NAMES, PRESETS, Format, KVSpec, QTensor, get_format, parse_kv

"""kvviz: a KV-cache quantization playground.

The public API is re-exported here; everything else is private to its module.
"""

"""Any model description -> the plain dict of its text model's config.json fields.

Accepted: a preset name (kvviz.memory.MODEL_PRESETS), a transformers `PretrainedConfig`, a config.json as a dict,
a path to a config.json (or to a directory holding one), or a Hugging Face hub id when the network allows.
Multimodal configs are read for their text model (`text_config`). `layer_shapes` and `state_shapes` take any of
these and apply kvviz.memory.layers' rules to its fields.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import hf_hub_download
from huggingface_hub.utils import HfHubHTTPError

from .layers import LAYOUTS, LayerShape, shapes_of, states_of
from .presets import MODEL_PRESETS, ModelPreset

MAX_CONFIG_BYTES = 1_000_000  # a config.json is a few KB; refuse anything past 1 MB
HUB_TIMEOUT_S = 5  # seconds: an offline machine must answer at once, not after a long retry

_REQUIRED = ("num_hidden_layers", "num_attention_heads")  # what every decoder config has


def _text_part(cfg: dict, where: str) -> dict:
    """The text model's fields: `text_config` of a multimodal config, else the dict itself.

    ValueError naming what is missing for a vision-only or encoder config, or a JSON that is no model config.
    """
    for key in ("text_config", "llm_config", "language_config"):
        if isinstance(cfg.get(key), dict):
            cfg = cfg[key]
            break
    else:
        if "vision_config" in cfg or "audio_config" in cfg:
            raise ValueError(f"{where} has a vision/audio config but no text_config: kvviz sizes the text decoder's "
                             "KV cache. Give the config of a model with a language model.")
    if ("image_size" in cfg or "patch_size" in cfg) and "vocab_size" not in cfg:
        raise ValueError(f"{where} is a vision encoder's config (image_size, no vocab_size): it has no KV cache. "
                         "Give the config of a causal language model.")
    archs = " ".join(str(a) for a in cfg.get("architectures") or [])
    if cfg.get("is_encoder_decoder") or any(t in archs for t in ("MaskedLM", "ForSequenceClassification")):
        raise ValueError(f"{where} is an encoder model's config ({archs or 'is_encoder_decoder'}): kvviz sizes "
                         "decoder-only language models.")
    layer_lists = ("layers_block_type", "hybrid_override_pattern")  # Nemotron-H counts its layers by these
    missing = [k for k in _REQUIRED if k not in cfg and not (k == "num_hidden_layers" and any(
        f in cfg for f in layer_lists))]
    if missing:
        raise ValueError(f"{where} has no {' and no '.join(missing)}: it is not a text decoder's config.json. Give "
                         "the config of a causal language model (or its multimodal wrapper with a text_config).")
    return cfg


def read_config_file(path) -> dict:
    """The dict in a config.json file (or a directory holding one). ValueError: missing, too big, not JSON."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"No config file at {str(p)!r}: give the path of a model's config.json.")
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"{p.name} is {size:,} bytes: a config.json is a few KB (limit 1 MB). "
                             "Give the model's config.json, not its weights.")
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"Cannot read {str(p)!r} ({err.__class__.__name__}: {err}); check the file.") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{p.name} is not valid JSON ({err.msg} at line {err.lineno}): give a config.json.") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p.name} holds a JSON {type(data).__name__}, not an object: give a model's config.json.")
    return data


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.endswith(".json") and not Path(text).exists()


def fetch_hub_config(repo_id: str) -> dict:
    """config.json of `repo_id` from the Hugging Face hub. ValueError naming the id when it cannot be reached.

    Fails fast offline: honours HF_HUB_OFFLINE, and waits at most HUB_TIMEOUT_S seconds for the network.
    """
    unreachable = (f"Cannot reach the Hugging Face hub for {repo_id!r}: this machine is offline or the id does not "
                   "exist. Download its config.json and pass the file instead.")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ValueError(unreachable + " (HF_HUB_OFFLINE is set)")
    # huggingface_hub retries an unreachable host for about 40 s: probe it once first, with a short timeout
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((host.hostname, host.port or 443), timeout=HUB_TIMEOUT_S).close()
    except OSError as err:  # no DNS, refused, timed out
        raise ValueError(f"{unreachable} ({err.__class__.__name__}: {err})") from None
    try:
        path = hf_hub_download(repo_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
    except (HfHubHTTPError, OSError, ValueError) as err:  # OSError covers connection errors and timeouts
        raise ValueError(f"{unreachable} ({err.__class__.__name__})") from None
    return read_config_file(path)


def config_dict(config) -> tuple[str, dict]:
    """(a display name, the text model's config fields as a plain dict) for any accepted `config`."""
    if isinstance(config, ModelPreset):
        return config.name, _text_part(dict(config.config), f"preset {config.name!r}")
    if isinstance(config, dict):
        return str(config.get("_name_or_path") or config.get("model_type") or "config"), _text_part(config, "the config")
    if hasattr(config, "to_dict") and hasattr(config, "model_type"):  # a transformers PretrainedConfig
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        return getattr(config, "name_or_path", "") or config.model_type, _text_part(text.to_dict(), "the config")
    if isinstance(config, os.PathLike):
        return Path(config).stem, _text_part(read_config_file(config), str(config))
    if not isinstance(config, str) or not config.strip():
        raise ValueError(f"Give a model as a preset name, a config.json path or dict, a transformers config or a "
                         f"hub id; got {type(config).__name__} {config!r}.")
    name = config.strip()
    if name.lower() in MODEL_PRESETS:
        return config_dict(MODEL_PRESETS[name.lower()])
    if name.endswith(".json") or Path(name).exists():
        return Path(name).parent.name or Path(name).stem, _text_part(read_config_file(name), name)
    if _looks_like_hub_id(name):
        return name, _text_part(fetch_hub_config(name), name)
    raise ValueError(f"Unknown model {name!r}: not a preset ({', '.join(MODEL_PRESETS)}), not a file, not a hub id "
                     "(owner/name).")


def layer_shapes(config, layout: str = "transformers") -> list[LayerShape]:
    """One LayerShape per decoder layer of `config` (anything kvviz.memory accepts: preset, dict, path, ...)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
    return shapes_of(config_dict(config)[1], layout)


def state_shapes(config, layout: str = "engine") -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """(layer index, conv state shape, recurrent state shape) per layer with a fixed-size state, for batch 1, of
    any accepted `config` (kvviz.memory.layers.states_of)."""
    return states_of(config_dict(config)[1], layout)

"""Parameter count of a model from its config.json alone, before any weight is downloaded.

The model is built on PyTorch's meta device (shapes, no storage; milliseconds even for billions of parameters)
from transformers' own class for the config's `model_type`, and its tensors' sizes are summed. Remote code is
never run (trust_remote_code=False): a config whose architecture transformers does not ship is refused.

    count_params(json.load(open("config.json")))   # SmolLM2-135M-Instruct's config: 134,515,008
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def count_params(config: dict) -> int:
    """Parameters of the model `config` (a config.json as a dict), tied embeddings counted once.

    Raises ValueError when transformers does not know the architecture (it would need remote code, which kvviz
    never trusts) or the config is incomplete.
    """
    fields = dict(config)
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise ValueError("The config has no model_type, so its architecture (and size) cannot be read from it.")
    try:
        cfg = AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError):  # transformers' message lists every known model_type: too long to show
        remote = " It ships its own code (auto_map), which kvviz never runs." if "auto_map" in fields else ""
        raise ValueError(f"transformers does not know the architecture {model_type!r}.{remote} "
                         "Pick a model whose architecture transformers ships.") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"Could not build {model_type!r} from its config to count its parameters ({err}).") from None
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() already yields a tied tensor once; the id set makes sure
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total

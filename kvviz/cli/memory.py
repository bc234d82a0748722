"""`python -m kvviz memory`: KV-cache bytes per format for a model, layer kind by layer kind, and what fits on a GPU
(kvviz.memory).

    python -m kvviz memory --model llama-3.1-70b --context 32768 --formats fp16,fp8,k8v4,mxfp4 --gpu h100-80gb
    python -m kvviz memory --config path/to/config.json --context 131072 --gpu h200 --params 27.4
"""

from __future__ import annotations

import argparse

from kvviz import memory

HELP = "KV-cache bytes per format for a model, and what fits on a GPU"


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    shape = p.add_argument_group("model (one of: a preset, a config.json, a hub id, or custom dimensions)")
    shape.add_argument("--model", help=f"model preset: {', '.join(memory.MODEL_PRESETS)}")
    shape.add_argument("--config", metavar="PATH", help="a model's config.json (or a directory holding one)")
    shape.add_argument("--hf-id", metavar="ID", help="a Hugging Face hub id, e.g. Qwen/Qwen3-8B (needs the network)")
    shape.add_argument("--layers", type=_positive_int, help="custom: number of layers")
    shape.add_argument("--kv-heads", type=_positive_int, help="custom: KV heads per layer")
    shape.add_argument("--head-dim", type=_positive_int, help="custom: head dimension")
    shape.add_argument("--params", type=_positive_float,
                       help="parameters in billions (for --gpu; needed with --config, --hf-id or custom dimensions)")
    p.add_argument("--context", type=_positive_int, required=True, help="tokens per sequence, e.g. 32768")
    p.add_argument("--formats", default="fp16,fp8,k8v4,mxfp4",
                   help="comma-separated KV specs, pairs or presets (default: %(default)s)")
    p.add_argument("--layout", choices=memory.LAYOUTS, default="engine",
                   help="engine: as vLLM/SGLang allocate (sliding layers hold the window, MLA its latent); "
                        "transformers: as transformers' caches and kvviz's hold it (window - 1); decompressed: "
                        "MLA as per-head K and V (default: %(default)s)")
    gpu = p.add_argument_group("GPU fit")
    gpu.add_argument("--gpu", help=f"GPU preset: {', '.join(memory.GPU_PRESETS)}")
    gpu.add_argument("--gpus", type=_positive_int, default=1, help="number of GPUs the model is sharded over")
    gpu.add_argument("--weight-bits", type=_positive_float, default=16,
                     help="bits per weight: 16 (bf16, default), 8, 4")
    gpu.add_argument("--reserve", type=float, default=0.1,
                     help="fraction of GPU memory kept for activations and the runtime (default 0.1)")


def _model_from_args(args: argparse.Namespace) -> memory.ModelPreset:
    custom = {"--layers": args.layers, "--kv-heads": args.kv_heads, "--head-dim": args.head_dim}
    given = [flag for flag, value in custom.items() if value is not None]
    sources = {"--model": args.model, "--config": args.config, "--hf-id": args.hf_id}
    named = [flag for flag, value in sources.items() if value is not None]
    if len(named) > 1 or (named and given):
        drop = ", ".join((named[1:] if len(named) > 1 else []) + given)
        raise ValueError(f"give one of --model, --config, --hf-id or custom dimensions, not both (drop {drop}).")
    if args.params is not None and args.params > 1e5:
        raise ValueError(f"--params is in billions: {args.params:g} billion is {args.params / 1e3:g} trillion "
                         f"parameters. For a 270M model write --params 0.27.")
    params = None if args.params is None else args.params * 1e9
    if named:
        if args.model is not None:
            if args.params is not None:
                raise ValueError("give either --model or --params, not both (drop --params): a preset knows its size.")
            return memory.get_model_preset(args.model)
        model = memory.resolve_model(args.config if args.config is not None else args.hf_id, params)
    else:
        missing = [flag for flag, value in custom.items() if value is None]
        if missing:
            raise ValueError("give --model, --config, --hf-id, or all of --layers, --kv-heads and --head-dim "
                             f"(missing {', '.join(missing)}).")
        model = memory.ModelPreset.from_dims("custom", args.layers, args.kv_heads, args.head_dim, params)
    if args.gpu is not None and model.params is None:
        raise ValueError("--gpu needs --params (parameters in billions) to count the weights of this model.")
    return model


def _columns(table: list[list[str]]) -> list[str]:
    """Rows of cells as aligned text: the first column left, the others right."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
            for r in table]


def _heads(heads: int, dim: int) -> str:
    return f"{heads}x{dim}" if heads else "-"


def _breakdown(model, specs: list[str], context: int, layout: str) -> list[str]:
    """Per layer kind: how many layers, tokens each holds at `context`, K and V per token, GB per format."""
    per_format = [memory.layer_breakdown(model, context, 1, spec, layout=layout) for spec in specs]
    table = [["layers", "count", "tokens each", "K heads x dim", "V heads x dim", *[f"{s} GB" for s in specs]]]
    for i, row in enumerate(per_format[0]):
        kind = row["kind"] + (f" ({row['window']:,})" if row["window"] else "")
        table.append([kind, str(row["layers"]), f"{row['tokens']:,}", _heads(row["k_heads"], row["k_dim"]),
                      _heads(row["v_heads"], row["v_dim"]), *[f"{rows[i]['bytes'] / memory.GB:.2f}" for rows in per_format]])
    return _columns(table)


def run(args: argparse.Namespace) -> int:
    model = _model_from_args(args)
    fit = dict(gpus=args.gpus, weight_bytes_per_param=args.weight_bits / 8, reserve_fraction=args.reserve)
    gpu = None if args.gpu is None else memory.get_gpu_preset(args.gpu)
    rows = memory.memory_table(model, args.formats, args.context, gpu, layout=args.layout, **fit)
    print(f"{model.name}: {model.layers} layers; {args.context:,} tokens per sequence; {args.layout} layout")
    for line in _breakdown(model, [r["format"] for r in rows], args.context, args.layout):
        print("  " + line)
    if rows[0]["state_bytes"]:
        print(f"  + fixed recurrent state: {rows[0]['state_bytes'] / 1e6:,.1f} MB per sequence")
    header = ["format", "K/V bits/value", "GB/sequence", "vs fp16"]
    if gpu is not None:
        budget = memory.kv_budget_bytes(model, gpu, **fit)
        weights_gb = model.params * fit["weight_bytes_per_param"] / memory.GB
        print(f"{args.gpus} x {gpu.name} ({gpu.memory_gb:g} GB each): weights {weights_gb:.1f} GB at "
              f"{args.weight_bits:g} bits, {args.reserve:.0%} reserved, {max(budget, 0) / memory.GB:.1f} GB for the KV cache")
        if budget <= 0:
            print("The weights do not fit: try more --gpus or fewer --weight-bits.")
        header += ["longest context", f"batch @ {args.context:,}"]
    table = [header]
    bits = lambda b: "-" if b is None else f"{b:g}"  # noqa: E731
    for row in rows:
        line = [row["format"], f"{bits(row['k_bits'])}/{bits(row['v_bits'])}", f"{row['gb']:.2f}",
                "-" if row["tokens_vs_fp16"] is None else f"{row['tokens_vs_fp16']:.2f}x"]
        if gpu is not None:
            longest = "unbounded" if row["max_context"] >= memory.CONTEXT_CAP else f"{row['max_context']:,}"
            line += [longest + ("*" if row["beyond_model_context"] else ""), f"{row['max_batch']:,}"]
        table.append(line)
    print()
    for line in _columns(table):
        print(line)
    if any(row["beyond_model_context"] for row in rows):
        print(f"\n* beyond the model's {model.max_context:,}-token trained context: the cache fits, the model was not "
              "trained that long.")
    print("\nGB = 10^9 bytes; bits/value include scales; vs fp16 = how many times the tokens of fp16 fit in the "
          "same memory.")
    return 0

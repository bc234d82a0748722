#!/usr/bin/env bash
# One command for a CUDA machine: the kernel tests, the decode benchmark at the README's sizes, and one generation
# per format on the bundled model through the fused Triton backend. Writes one markdown table with the card and
# the date to $OUT/gpu_check.md (default: ./gpu_check.md) and prints it. Budget: at most 8 minutes on an H100/H200.
#
#   bash benchmarks/gpu_check.sh            # needs CUDA, and the set-up of `make test` (.venv) or an equivalent env
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-.}
mkdir -p "$OUT"
report="$OUT/gpu_check.md"

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible to torch; nothing to check (the CPU suite is 'make test')." >&2
  exit 2
fi

card=$($PY -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}')")
{
  echo "# GPU check: $card, $(date -u +%Y-%m-%d)"
  echo
  echo "torch $($PY -c 'import torch; print(torch.__version__)'), triton $($PY -c 'import triton; print(triton.__version__)'), CUDA $($PY -c 'import torch; print(torch.version.cuda)')"
  echo
  echo "## Kernel tests (compiled, not interpreted)"
  echo
  echo '```text'
  TRITON_INTERPRET=0 timeout 240 $PY -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_e2e.py 2>&1 | tail -n 5
  echo '```'
  echo
  echo "## Decode attention (benchmarks/bench_decode.py, README sizes)"
  echo
  echo '```text'
  timeout 240 $PY benchmarks/bench_decode.py 2>&1 | tail -n 80
  echo '```'
  echo
  echo "## One generation per format on the bundled model, KVVIZ_BACKEND=triton"
  echo
  KVVIZ_BACKEND=triton timeout 120 $PY - <<'PY' 2>&1
import time, torch, kvviz
from kvviz.formats import FORMAT_NAMES
model, tok = kvviz.load_model()
model.to("cuda")
enc = tok("The Eiffel Tower is", return_tensors="pt").to("cuda")
print("| spec | tokens/s | text |\n|---|---:|---|")
for spec in ["fp16", "fp8_e4m3", "int8", "int4", "k8v4", "kivi2", "mxfp4", "nvfp4"]:
    try:
        cache = kvviz.QuantizedKVCache(model.config, spec)
        t0 = time.perf_counter()
        out = model.generate(**enc, cache=cache, max_new_tokens=32, do_sample=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).replace("|", "/").replace("\n", " ")
        print(f"| `{spec}` | {32 / dt:.1f} | {text[:60]} |")
    except Exception as err:  # report every format, even one that fails, in the one table
        print(f"| `{spec}` | failed | {type(err).__name__}: {str(err)[:80]} |")
PY
} | tee "$report"
echo "gpu_check: wrote $report" >&2

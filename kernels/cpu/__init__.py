"""The CPU kernels (numba): each launcher here beside its jit code in kernels/cpu/jit/ under the same name.

    decode.py  decode_attention_cpu: fused decode attention over the packed buffers (jit/decode.py, which builds on
               jit/fields.py, jit/rows.py and jit/flat.py; jit/contract.py holds the codes both sides share)
    pack.py    quant_pack_cpu: quantize new tokens and write them into the packed buffers (jit/pack.py; the
               engines' stores: jit/pack_engines.py)
    step.py    DecodeStep: one cache layer's decode step, the new token's append and the attention, in one call
               (jit/step.py, which strings jit/pack.py and jit/decode.py together); warm_up() compiles them all
    logits.py  lse_rows, probs_rows, dot_rows: float64 log-sum-exp, softmax and P . z of fp32 logit rows, the KL of
               kvviz's position pass over a large vocabulary (jit/logits.py); warm_up() compiles them (the app's
               launch warm-up calls it), else the first use does
    mirror.py  MirrorAppend: a batched-rows cache's decode token packed and read back into the rows' mirror, exactly
               as kvviz.formats decodes it, in one call (jit/mirror.py; kvviz.cache.row_stack); compiled on first use

numba is optional: each launcher imports its jit code lazily and falls back (the reference, kvviz.formats).
"""

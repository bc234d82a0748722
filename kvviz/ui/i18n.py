"""kvviz.ui.i18n: the playground's English and Korean strings, and the switch that relabels the page.

Strings live in two flat dicts keyed alike (a test checks that they are). Tabs register each translatable component
with a `Translator` as they build it: `tr(gr.Button(t("run", "en")), value="run")`. The language radio's change
event then returns `tr.updates(lang)`, one `gr.update` per registered component, so switching language is one
round trip and touches no per-user state on the server.

Results follow the page's language too: the language radio (`Translator.language_input()`) is the last input of
every model endpoint, so an API caller may ask for Korean ("한국어") and gets English by default. Table headers,
figure titles, status lines and summaries are translated (`t("key", lang).format(...)`); format names, numbers and
the library's own error messages stay as they are. (Not a gr.State: a State makes every page hold a heartbeat
connection open.)
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from .checks import LANGUAGES  # noqa: F401 (the radio's choices, kept beside the check of its value)

EN: dict[str, str] = {
    "title": "# kvviz: KV-cache quantization playground",
    "subtitle": ("Quantize a real language model's KV cache and see what it does: to the keys and values themselves, "
                 "to memory, and to the text the model writes. Pick a lesson below or open a tab."),
    "language": "Language",
    "lessons": "### Nine lessons, one click each",
    "lesson1": "1 · K has outlier channels, V doesn't",
    "lesson2": "2 · Per-tensor scales fail, per-token/channel don't",
    "lesson3": "3 · K is sensitive, V tolerant (k8v4 vs k4v8)",
    "lesson4": "4 · E4M3 beats E5M2 for KV",
    "lesson5": "5 · Per-tensor int4 loses the needle; per-token int4 loses fewer",
    "lesson6": "6 · Scales eat into the savings",
    "lesson7": "7 · Fused dequantization beats unfused",
    "lesson8": "8 · A few layers carry the damage: keep them precise",
    "lesson_note1": ("**Lesson 1.** Read the *K beside V* chart: a few post-RoPE K channels (marked ▼) reach several "
                     "times the others, while V's channels stay level. The heatmap shows the same channels lit up "
                     "layer after layer."),
    "lesson_note2": ("**Lesson 2.** Compare the four maps at the bottom, on one colour scale: with one scale per tensor "
                     "the outlier channels stretch the scale and the error spreads everywhere; one scale per channel "
                     "or per token confines it; a Hadamard rotation first brings per-tensor back down. The *format "
                     "anatomy* below follows one token through int4/tensor: the outlier channels (▼, listed first) "
                     "set the one scale, and the other channels' codes crowd into a few levels around zero."),
    "lesson_note3": ("**Lesson 3.** k8v4 and k4v8 hold the same bytes. Compare their KL and top-1: 4-bit K hurts far "
                     "more than 4-bit V, because K's errors move the attention weights while V's average out."),
    "lesson_note4": ("**Lesson 4.** In the per-layer chart fp8_e4m3 sits below fp8_e5m2: K and V span a modest range, "
                     "so E4M3's extra mantissa bit is worth more than E5M2's extra exponent range. *E4M3's range "
                     "still matters under a static scale:* vLLM and SGLang store FP8 with a scale of 1.0 unless given "
                     "calibrated scales (`fp8_e4m3/unit` here), so any |K| above 448 saturates. Measured on 512 "
                     "tokens of WikiText-2 (benchmarks/fp8_unit_scale.py): SmolLM2's largest post-RoPE |K| is 26.5, "
                     "17× under 448, Gemma 3 270M's 97.4, 4.6× under; neither saturates, and a unit scale's K error "
                     "(2.6%) equals a calibrated scale's. Qwen2-style models carry a large k_proj bias: on kvviz's tiny "
                     "Qwen2 with a bias of 600 and -700 on one channel of each of its two heads, |K| reaches 701, 6.4% of K saturates under a "
                     "unit scale, and K's relative error is 24% against 2.4% with a calibrated scale."),
    "lesson_note5": ("**Lesson 5.** The needle chart plots retrieval against where a number sits in the context: 3 "
                     "needles at each of 5 depths, each in its own stretch of WikiText-2, so each point is a rate "
                     "(0, 33, 67 or 100%). SmolLM2 at 352 tokens: the exact cache finds 15 of 15, per-token int4 15 "
                     "(100%), per-tensor int4 7 (47%): one scale for the whole tensor, stretched by K's outlier "
                     "channels, leaves too few levels for the rest, and the answer comes back wrong. Longer contexts "
                     "(the slider) press the 4-bit formats harder and take longer: each needle is one more prefill."),
    "lesson_models5": ("**Across models:** Gemma 3 270M runs this lesson at 256 tokens, where its outlier channels "
                       "(about 30× the median in layers 5 and 11) already decide it: the exact cache finds 15 of 15, "
                       "per-token int4 8 (53%), per-tensor int4 none. On Gemma even one scale per token is too "
                       "coarse for K; per-tensor is worse on both models."),
    "lesson_note6": ("**Lesson 6.** SmolLM2 has head_dim 64. Read the bits/value column: int4 with one fp16 scale per "
                     "64 values costs 4.25 bits, per 16 values 5, per 8 values 6. Short groups eat the savings."),
    "lesson_note7": ("**Lesson 7.** The Compare tab's *fused against unfused* view decodes one 1,024-token WikiText-2 "
                     "prompt through DynamicCache, and through int4 and k8v4 twice each, on this machine, now. First "
                     "read *read per step*: the fused kernel (on the CPU, kvviz's numba kernel) reads only the packed "
                     "bytes; the unfused reference dequantizes the whole history at every step, writing a "
                     "full-precision copy and reading it back, so it moves more bytes than even the exact cache (on "
                     "SmolLM2: 6.0 MiB for int4 fused, 45.4 MiB for DynamicCache, 96.8 MiB for int4 unfused). Then "
                     "*tokens/s*: fused should decode faster than unfused, whose extra work grows with the history it "
                     "copies at every step (try a longer prompt). Against DynamicCache it depends on "
                     "the machine and how busy it is (docs/benchmarks.md gives measured runs). The status line "
                     "says whether fused and unfused wrote the same tokens and whether the fused path really ran: without numba "
                     "the rows say NOT fused."),
    "lesson_on_model": "_This lesson runs on `{model}`, the model picked in the tabs; pick another to compare._",
    "lesson_models1": ("**Across models** (largest K channel / median channel, 256 WikiText-2 tokens): Gemma 3 270M's "
                       "reaches about 28-34× in its full-attention layers 5 and 11 (the lesson opens layer 11 there) "
                       "against 4-19× in its sliding-window layers; SmolLM2's stays at 3.5-7.3×: the lesson opens "
                       "its layer 17 (5×; its layer 0 has none)."),
    "lesson_models2": ("**Across models:** the larger the outlier channel, the more one per-tensor scale loses. On "
                       "Gemma 3 270M, look at the full-attention layers 5 and 11 (K's largest channel about 28-34× "
                       "the median), where the per-tensor map stands out most; SmolLM2's channels reach 3.5-7.3×."),
    "lesson_models3": ("**Across models:** k8v4 holds 6.25 bits per value at SmolLM2's head_dim 64 (0.39× a 16-bit "
                       "cache) and 6.06 at Gemma 3 270M's head_dim 256 (0.38×): the fp16 scale per head_dim row "
                       "costs less on longer rows. The Compare table gives both byte ratios."),
    "lesson_models6": ("**Across models:** Gemma 3 270M has head_dim 256, so int4 with one fp16 scale per row costs "
                       "4.06 bits (SmolLM2: 4.25 at head_dim 64); groups of 16 and 8 cost 5 and 6 bits on both. The "
                       "lesson opens the Memory tab on the picked model when it has a preset there."),
    "lesson_note8": ("**Lesson 8.** The map quantizes one layer's K or V at a time to vLLM's `int4_per_token_head` "
                     "(asymmetric int4 per token and head after a Hadamard rotation), on 64 tokens of WikiText-2. "
                     "On SmolLM2 the rotation flattens the map: layer 1's K tops it at KL 0.0038 nats/token, 8× the "
                     "median tensor's, then layers 2 and 10 (0.0027). Then the plan search over that dtype and fp16 "
                     "(budget 0.03): every layer in `int4_per_token_head` costs KL 0.046; keeping layers 1-3 and 10 in "
                     "fp16 brings it to 0.027 for 0.38× an fp16 cache instead of 0.28×. Layer 1 alone reads 0.053, "
                     "above the start: one layer's damage does not simply add to the others', which is why the search "
                     "measures every plan on its path. Because the candidates are an engine dtype and fp16, the plan "
                     "is one vLLM serves: *Serving it* gives `--kv-cache-dtype int4_per_token_head "
                     "--kv-cache-dtype-skip-layers 1 2 3 10`. The map and the search each take about 5 seconds on an "
                     "idle 2-core CPU (longer when the machine is shared)."),
    "lesson_models8": ("**Across models:** on Gemma 3 270M the full-attention layers 5 and 11 top the map (K's KL "
                       "0.036 and 0.034, 27× and 25× the median tensor's; their largest K channel 30× and 33× the "
                       "median). The search (budget 0.11) still starts with sliding-window layer 4: at 4,096 tokens a "
                       "sliding layer holds only its 512-token window, so keeping it in fp16 costs a tenth of what a "
                       "full layer does. Every layer in `int4_per_token_head` costs KL 0.17; layer 4 in fp16 brings "
                       "it to 0.100: `--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers 4`."),
    "tab_compare": "Compare",
    "tab_outliers": "K outliers",
    "tab_errors": "Quantization error",
    "tab_memory": "Memory",
    "tab_export": "Export",
    "tab_sensitivity": "Sensitivity",
    "prompt": "Prompt",
    "model": "Model",
    "prompt_ph": "Type a prompt, or pick an example below.",
    "layer": "Layer",
    "head": "KV head",
    "run": "Run",
    # Compare
    "compare_intro": (
        "**What you see:** the same model answering the same prompt, once per KV-cache format, side by side. "
        "The unquantized cache is the baseline; the first word where a format's text leaves the baseline is "
        "<mark>highlighted</mark>. KL and top-1 are measured teacher-forced on the baseline's tokens, so they compare "
        "like with like even after the texts part ways. Try k8v4 against k4v8: the same bytes, but K is the "
        "sensitive half."),
    "specs": "Formats to compare (the unquantized baseline always runs)",
    "custom_specs": "More formats (custom)",
    "custom_specs_info": ("One K/V spec per line, e.g. k=int8,v=int4 or fp8_e5m2 or int4/channel/g32/asym, or a "
                          "per-layer plan such as int4; 0,27=fp16"),
    "max_new_tokens": "Max new tokens",
    "with_ppl": "Also measure perplexity on WikiText-2 (adds seconds per format)",
    "outputs": "Generated text (first divergence from the baseline highlighted)",
    "metrics": "Metrics per format",
    "needle_intro": ("**Needle in a haystack:** hide a number at several depths of a long context, a few times at "
                     "each depth, and ask for it back through each format's cache. Coarse scales lose it first."),
    # Compare: the engine view (kvviz/ui/engines.py)
    "engine_title": "kvviz against the engines: llama.cpp's (and vLLM's, when configured) cache types measured inside them",
    "engine_intro": ("**What you see:** llama.cpp's own KV cache types run inside llama.cpp (in a worker process of "
                     "the app, on the model's GGUF file) and in kvviz's simulation, on the same tokens of WikiText-2. "
                     "Each side's KLD is taken against its own unquantized run, with llama.cpp's `--kl-divergence` "
                     "statistics."),
    "engine_vllm_note": ("**vLLM too:** this app was started with vLLM servers (KVVIZ_VLLM_URLS), so each run also "
                         "measures vLLM's KV cache dtypes on the same tokens, beside kvviz's simulation of each dtype "
                         "measured the same way (top-20 log-probs, the rest lumped). The verdict column says whether "
                         "the engine's KLD is within 1.5x of the simulation's (*within the format's expected range*) "
                         "or above it (*the engine loses more than the format explains*: the signature of engine "
                         "bugs such as scales never passed to the kernel)."),
    "engine_pairs": "llama.cpp cache types (-ctk / -ctv; a pair is k=K,v=V)",
    "engine_tokens": "Tokens of WikiText-2 (more: slower, steadier figures)",
    "engine_rotate": "Rotate K/V in llama.cpp (Hadamard, its default; kvviz's formats are unrotated)",
    "engine_run": "Run kvviz and llama.cpp",
    "engine_table": ("Mean KLD (nats/token), 99th percentile, and top-token agreement, per format; then kvviz's "
                     "simulation of llama.cpp and its ratio to llama.cpp's mean KLD"),
    "engine_why": (
        "**Why kvviz's bare format differs from llama.cpp** (see docs/engines.md). kvviz's `q4_0` or "
        "`k=q8_0,v=q4_0` stores exactly llama.cpp's blocks, but llama.cpp does more around the storage: *8-bit "
        "matmul inputs:* every quantized weight multiplies its input rounded to 8 bits (q8_1 for the GGUF's Q4_1), "
        "so a small KV error flips some roundings in every later layer; that is q8_0's floor (on SmolLM2 at 512 "
        "tokens kvviz's bare q8_0 reads 0.00026, llama.cpp 0.0034). *Rotation:* unless told not to, llama.cpp "
        "multiplies a quantized K and V by a Hadamard matrix, which lowers q4_0's KLD. *Channel order:* for "
        "Llama-family GGUFs its cache blocks of 32 group other K channels than transformers' order. The column "
        "\"kvviz's llama.cpp simulation\" does all three (and llama.cpp's flash attention) on the same weights and "
        "tokens, with the rotation setting above; it is not bit-exact, so the ratio scatters around 1 (within 20% "
        "on the bundled models at 512 tokens; fewer tokens scatter more)."),
    # Compare: fused against unfused decode (kvviz/ui/fused.py)
    "fused_title": "Fused against unfused decode: tokens/s and bytes read per step (lesson 7)",
    "fused_intro": ("**What you see:** the same greedy decode after a WikiText-2 prompt, through the exact cache "
                    "(DynamicCache) and through each format twice, on this machine, now. *Fused*: the attention "
                    "kernel reads the packed codes and scales in place (on the CPU kvviz's numba kernel, on a GPU "
                    "Triton's). *Unfused*: the reference dequantizes the whole history to full precision at every "
                    "step, then runs SDPA on the copy. *Bytes read per step* counts K/V at the last step: the exact "
                    "cache's values; fused, the packed bytes; unfused, the packed bytes plus the full-precision copy "
                    "written and read again (2x the exact cache; the reference's other temporaries are not counted). "
                    "Every run starts from the same prefill and times its steps one by one, in two rounds; each run's median "
                    "step is kept (a busy moment slows a few steps, not the figure)."),
    "fused_specs": "Formats (each decodes twice: fused and unfused)",
    "fused_context": "Prompt tokens (WikiText-2)",
    "fused_new": "Decode tokens timed",
    "fused_run": "Time fused against unfused",
    "fused_table": "tokens/s and K/V bytes read per decode step, per cache and decode path",
    "fused_h_format": "cache",
    "fused_h_path": "decode path",
    "fused_h_tps": "tokens/s",
    "fused_h_vs": "× DynamicCache",
    "fused_h_mib": "read per step (MiB)",
    "fused_c_tps": "decode speed (tokens/s)",
    "fused_c_mib": "K/V read per step (MiB)",
    "fused_fig": "Fused against unfused decode on {model}, {n}-token prompt",
    "fused_fig_x": "cache · decode path",
    "fused_fused": "fused",
    "fused_unfused": "unfused",
    "fused_path_exact": "exact: SDPA over the model-dtype K/V",
    "fused_path_fused": "fused: the {backend} kernel reads the packed bytes",
    "fused_path_unfused": "unfused: dequantize the history, then SDPA",
    "fused_path_fallback": "NOT fused: the reference ran ({why})",
    "fused_why_unavailable": "the fused path does not run here",
    "fused_why_no_branch": "no fused branch for this format",
    "fused_why_lossless": "a lossless cast: the reference reads DynamicCache's very values",
    "fused_done": ("Done in {s:.0f} s. `{model}`: a {n}-token WikiText-2 prompt, then greedy decode, median step of "
                   "{rounds} rounds x {steps} timed steps; fused backend `{backend}`."),
    "fused_cut": "The prompt was cut from {asked} to {n} tokens to fit this model's positions.",
    "fused_same": "Fused and unfused generated the same {n} tokens for {formats}.",
    "fused_differ": ("**Fused and unfused generated different tokens** for {formats}: the kernel sums in float32 in "
                     "another order than SDPA, and a near-tie between two tokens can flip."),
    "fused_unavailable": ("**The fused path does not run here** (backend `{backend}`: numba missing or failed to "
                          "compile, or no GPU for Triton), so the rows marked NOT fused were decoded by the unfused "
                          "reference: they are not a measurement of fused decode. Install numba (`pip install "
                          "numba`) and restart the app."),
    "fused_no_branch": "{formats}: the fused path has no branch for this format, so its \"fused\" row ran the reference.",
    "fused_lossless": ("{formats}: a lossless cast of the model's own dtype, so its \"fused\" row ran the reference, "
                       "which hands attention DynamicCache's very values."),
    "fused_ctx_fig": "Decode speed against context on {model}: where the smaller cache overtakes the exact one",
    "fused_ctx_x": "context (tokens)",
    "fused_ctx_recorded": ("**Speed against context** (the curves): a decode step reads the weights and the whole "
                           "cache, so the exact cache slows as the context grows while a 4-bit cache reads about a "
                           "seventh of its bytes; the dashed lines are each format's ceiling, the exact cache's "
                           "speed times (weights + its K/V bytes) / (weights + the format's bytes), what the format "
                           "would reach if it cost nothing beyond its bytes. Lines: recorded with `{command}` on "
                           "{machine}, {date}. Diamonds: this run, on this machine now."),
    "fused_ctx_none": ("**Speed against context**: no recorded run for `{model}` (only the bundled models have one; "
                       "make one with `python -m kvviz bench --contexts 1024,2048,4096,8192 --model ...`). The "
                       "diamonds are this run."),
    "needle_title": "Needle in a haystack: long-context retrieval (lesson 5)",
    "needle_run": "Run needle test",
    "needle_context": "Context length (tokens)",
    # Outliers
    "outliers_intro": (
        "**What you see:** the largest |value| each channel of the keys (K) and values (V) reaches over your prompt, "
        "for one layer and KV head. After RoPE a few K channels carry magnitudes many times the rest; V has no "
        "such channels. A Hadamard rotation mixes channels and spreads those outliers out."),
    "outliers_why": (
        "**Why it matters.** A scale shared by a whole tensor must stretch to fit the outlier channels, so every "
        "other channel is left with a handful of levels. One scale per channel (KIVI's per-channel K) gives each "
        "outlier channel its own range; a Hadamard rotation flattens the outliers before quantizing. V has no "
        "outlier channels and is read as a weighted average over tokens, where errors partly cancel, so one scale "
        "per token (over head_dim) suits it."),
    # Errors
    "errors_intro": (
        "**What you see:** where quantization error lands. The heatmap is |x − x̂| per token and channel for one "
        "format, layer and head; the line chart is each layer's relative error for every format you pick; the "
        "four maps below quantize the same tensor with one scale per token, per channel, per tensor, and per "
        "tensor after a Hadamard rotation, on one colour scale."),
    "error_format": "Format for the heatmaps",
    "error_formats": "Formats for the per-layer chart",
    "which": "Tensor",
    "anatomy_title": "Format anatomy: one token through the quantizer",
    "anatomy_intro": (
        "**What you see:** one token of one KV head of the real K (post-RoPE) or V, element by element: the input, "
        "the value the codes quantize (its rotation for rotated formats), each element's stored code and bits, the "
        "scale or norm as stored, the reconstruction and its error. Hover an element for its arithmetic. Layer, "
        "head and prompt are the tab's; ▼ marks the head's outlier channels."),
    "anatomy_format": "Format (any spec, pair or engine dtype)",
    "anatomy_side": "K or V",
    "anatomy_token": "Token (index in the prompt)",
    "anatomy_run": "Show the anatomy",
    "f_anatomy": "{fmt} on {side} of token {token} ('{text}'), {where}",
    "f_rotated_hist": "{fmt}: rotated coordinates of every token against the codebook's Gaussian ({where})",
    "r_anatomy_head": ("**`{fmt}`** on {side}, layer {layer}, KV head {head}, token {token} (`{text}`): "
                       "{bpv:g} bits per value; this token's relative error {err:.2%}. The codes quantize the "
                       "{domain}."),
    "r_anatomy_rotation": "**Rotation:** {rotation}.",
    "r_anatomy_codebook": "**Codebook** ({n} centroids, unit-vector coordinates): {codebook}. **Norm** {norm:.5g}.",
    "r_anatomy_scales": "**Stored beside the codes**\n\n| number | value | dtype | stored bits | elements |",
    "r_anatomy_more": "…and {n} more.",
    "r_anatomy_no_scale": "**No scale:** each code is the value itself, cast to the format's bits.",
    "r_anatomy_steps": ("**Step by step** (outlier channels first)\n\n| element | input | quantized value | code "
                        "(bits) | arithmetic | read back | error |"),
    "r_anatomy_no_codebook": "This format has no codebook: the histogram is for TurboQuant formats.",
    # Memory
    "memory_intro": (
        "**What you see:** KV-cache memory against context length for a real model's shape, one line per format, "
        "with dashed lines at what each GPU has left beside the weights. Scale storage is counted: at head_dim 64 "
        "with short groups, it takes a visible bite out of the savings."),
    "model_preset": "Model",
    "memory_config_source": "Or: a config.json, or a hub id (these win over Model)",
    "memory_config_file": "Upload a model's config.json (at most 1 MB)",
    "memory_hf_id": "Hugging Face hub id",
    "memory_hf_id_info": "e.g. Qwen/Qwen3-8B; works only when this app has network access",
    "memory_layout": "Layout",
    "memory_layout_info": ("engine: as vLLM/SGLang allocate (sliding layers hold the window, MLA its latent); "
                           "transformers: as transformers' caches hold it (window - 1); decompressed: MLA per head"),
    "memory_breakdown": "Per layer kind at the longest context: how many layers, the tokens each holds, GB per format",
    "custom_dims": "Custom model dimensions (used when Model is 'custom')",
    "layers": "Layers",
    "kv_heads": "KV heads",
    "head_dim": "Head dim",
    "params_b": "Parameters (billions)",
    "gpus": "GPUs (dashed lines, and the table's columns)",
    "batch": "Batch size",
    "ctx_min": "Shortest context (tokens)",
    "ctx_max": "Longest context (tokens)",
    "memory_formats": "Formats",
    "fit_table": ("Per GPU: the longest context that fits at this batch size · the largest batch that fits at the "
                  "longest context above"),
    # Export
    "export_intro": (
        "**What you see:** the flags and code that serve the model with this KV-cache format in vLLM and SGLang, "
        "and per-layer scales calibrated on your prompts as SGLang's scale file. A format an engine does not "
        "support is marked as such, never mapped to a different one."),
    "export_format": "Format",
    "model_id": "Model id or path for the commands",
    "support_table": "Which engine supports which format",
    "calib_prompts": "Calibration prompts (one per line)",
    "calib_file": "SGLang scale file (calibrated on your prompts)",
    "scale_upload": "Check a scale file (JSON)",
    "check": "Check file",
    "model_info_any": "Pick a listed model, or type any Hugging Face hub id (owner/name); its size is checked first",
    # Results (callbacks fill the {fields})
    "r_baseline": "exact (baseline)",
    "r_none": "none",
    "r_outlier_count": "the strongest {shown} of {total}",
    "r_skipped": "**Skipped** (this model's shape cannot hold them):",
    "r_metrics_later": "Metrics appear when generation ends.",
    "r_prefill": "Prefilling {n} prompt tokens on `{model}`, then decoding {formats} formats + baseline as one batch…",
    "r_token": "Token {i} of {n} (`{model}`)…",
    "r_ppl_running": "Measuring perplexity on WikiText-2 through every format's cache…",
    "r_meta": "KL {kl:.4f} · top-1 {top1:.0f}% · {vs16} of 16-bit bytes",
    "r_meta_base": "{n} prompt tokens · unquantized {dtype} K/V",
    "r_done": ("Done in {s:.1f} s on `{model}`. KL and top-1 are teacher-forced on the baseline's tokens ({metrics}); "
               "tokens/s: each format's own cache, `{speed}` attention backend, batch 1, {steps} steps. Bytes: "
               "\"cache vs 16-bit\" is against an fp16/bf16 cache, what engines store; \"cache vs exact\" against "
               "the cache this model runs with here."),
    "r_needle": ("{per} needles at each of {depths} depths in {n} tokens of WikiText-2, `{model}`, answers read "
                 "through each format's cache. Retrieved: {found}."),
    "h_format": "format",
    "h_spec": "spec",
    "h_bits": "bits/value",
    "h_kl": "mean KL (nats/token)",
    "h_kl_median": "median KL",
    "h_kl_p99": "p99 KL",
    "h_top1": "top-1 agreement (%)",
    "h_divergence": "first divergence (token)",
    "h_cache_kib": "cache (KiB)",
    "h_vs16": "cache vs 16-bit",
    "h_vs_exact": "cache vs exact ({dtype})",
    "h_tps": "tokens/s",
    "h_ppl": "perplexity",
    "c_kl": "mean KL (nats/token)",
    "c_top1": "top-1 agreement (%)",
    "c_vs16": "cache vs fp16/bf16 (× bytes)",
    "c_tps": "decode speed (tokens/s)",
    "c_ppl": "perplexity (WikiText-2)",
    "f_metrics": "Quality and cost per format on {model} (baseline: the unquantized cache)",
    "f_format_axis": "format (K/V spec)",
    "f_needle": "Needle in a haystack at {n} tokens of context, {per} needles per depth ({model})",
    "f_needle_x": "needle depth (% of context)",
    "f_needle_y": "retrieval rate (%)",
    "r_where": "layer {layer}, KV head {head}, {n} tokens, `{model}`",
    "f_k_max": "|K| max over tokens (abs. value)",
    "f_x_max": "|x| max over tokens (abs. value)",
    "f_rope": "K per channel, before and after RoPE ({where})",
    "f_kv": "K beside V ({where})",
    "f_rot": "Hadamard rotation spreads the outliers ({where})",
    "f_heat": "Post-RoPE |K| max per layer and channel (KV head {head}, {model})",
    "f_k_z": "|K| max (abs. value)",
    "r_outliers": ("**Outlier channels** (|x| max above {factor}× the head's median channel), {where}:\n\n"
                   "- K post-RoPE: {k_post}; largest channel / median = **{r_post:.1f}×**\n"
                   "- K pre-RoPE: {k_pre}; {r_pre:.1f}×\n"
                   "- V: {v}; {r_v:.1f}×\n"
                   "- K post-RoPE after a Hadamard rotation: {rot_before:.1f}× → **{rot_after:.1f}×** (kurtosis "
                   "{kurt_before:.1f} → {kurt_after:.1f}, mean over channels; 3 is Gaussian)\n\n"
                   "Over all layers and heads: K post-RoPE has {n_k} outlier channels, V has {n_v}."),
    "r_where_short": "layer {layer}, KV head {head}, {model}",
    "f_error_heat": "|{side} − {side}̂| for {fmt} ({which}, {where})",
    "f_quality_map": "Quality against bytes: mean KL vs bits per value, Pareto frontier dashed ({model})",
    "f_layer_errors": "Relative error per layer on {model} (K post-RoPE solid, V dashed)",
    "f_rel_error": "relative error (‖x - x̂‖ / ‖x‖)",
    "r_no_scales": "({base} has no scales; showing int4)",
    "f_granularity": "{base}: one scale per token, per channel, per tensor ({which}, {where})",
    "f_gran_sub": "rel. error {err:.3g} · {bits:g} bits/value",
    "r_errors_head": "Mean over layers, on this prompt's {n} tokens (`{model}`):",
    "r_errors_table": "| format | K rel. error | V rel. error | attention-output rel. error | bits/value |",
    "r_errors_note": ("The attention-output error is what the next layer sees: quantized K and V, the prompt's own "
                      "queries."),
    "r_supported": "supported",
    "r_not_supported": "not supported",
    "r_unsupported": "✗ unsupported",
    "f_scales": "Calibrated FP8 E4M3 scales per layer ({n} prompt(s), {model})",
    "r_scales": ("**Scales**: calibrated on {n} prompt(s) with `{model}` (amax / 448 per layer). SGLang applies one "
                 "scale per layer to both K and V, so the file holds the larger of the two. Save it as "
                 "`scales.json` beside the command above."),
    "r_scales_fp8_only": ("_SGLang's scale file holds per-layer FP8 E4M3 per-tensor scales; pick fp8_e4m3 to "
                          "calibrate one on your prompts._"),
    "f_scales_fp8_only": "Scales are calibrated for fp8_e4m3 only.",
    "r_scales_no_prompts": "_Add calibration prompts to get per-layer scales._",
    "f_scales_no_prompts": "Add calibration prompts to calibrate scales.",
    # Sensitivity
    "sens_intro": (
        "**What you see:** how much one layer's K or V, stored in the chosen format while every other tensor stays "
        "exact, moves the model's next-token distribution (mean teacher-forced KL over the text). A few layers carry "
        "most of the damage; the table's magnitudes say why (a K channel far above the layer's median channel). "
        "Keep those layers in higher precision: *Find a plan* below does it within a KL budget."),
    "sens_source": "Text to measure on",
    "sens_source_info": "WikiText-2: the bundled test slice; prompt: the text below",
    "sens_spec": "Format (K/V spec)",
    "sens_tokens": "Tokens",
    "sens_tokens_info": "The text is cut to this many tokens; SmolLM2 at 256 takes about 50 s on an idle 2-core CPU",
    "sens_run": "Measure sensitivity",
    "sens_norms": "Per layer: KL of K and V, and the K/V magnitudes that explain the peaks",
    "sens_where": "{model}, {spec}, {tokens} tokens",
    "sens_heat_title": "KL when only one layer's K or V is quantized ({where})",
    "sens_rank_title": "Most damaging layers ({where})",
    "sens_col0": "layer",
    "sens_col1": "K: KL (nats/token)",
    "sens_col2": "V: KL (nats/token)",
    "sens_col3": "K max |x|",
    "sens_col4": "K median channel max",
    "sens_col5": "K channel ratio (×)",
    "sens_col6": "K largest token norm",
    "sens_col7": "V max |x|",
    "sens_col8": "V channel ratio (×)",
    "sens_col9": "V largest token norm",
    "sens_summary": ("**{where}**: {rows} variants, each with one layer's K (or V) quantized and its other side in "
                     "{other}, measured as one batch in {seconds:.1f} s. The worst:"),
    "sens_peak_line": ("- **{side} of layer {layer}**: KL {kl:.4g} nats/token, {times:.1f}× the median; its largest "
                       "{side} channel is {ratio:.1f}× its median channel (median layer {median_ratio:.1f}×), "
                       "max |{side}| {peak:.3g}"),
    "plan_intro": (
        "### Find a plan\n"
        "Start with every layer in the cheapest candidate; raise one layer at a time to the next candidate, the "
        "largest KL saved per byte first; return the cheapest plan whose KL stays within the budget. The curve is "
        "every step of that climb."),
    "plan_candidates": "Candidate formats (the search mixes them per layer)",
    "plan_custom": "More candidates (custom)",
    "plan_custom_info": "One K/V spec per line, e.g. k=int8,v=int4",
    "plan_budget": "KL budget (nats/token)",
    "plan_budget_info": "mean teacher-forced KL the plan may cost, 0 to 10; 0.01 is hard to notice in the text",
    "plan_run": "Find a plan",
    "plan_found": "Plan (default; layers=spec)",
    "plan_to_compare": "Compare this plan",
    "plan_to_memory": "Plan's memory",
    "plan_steps": "Every step of the search: the layer moved, the plan, its bytes and KL",
    "plan_where": "{model}, candidates {cands}, budget {budget:g}",
    "plan_fig_title": "KV bytes against KL along the search ({where})",
    "plan_within": "within the budget of {budget:g}",
    "plan_over": "**no plan on the path stays within {budget:g}**: this is the all-top plan",
    "plan_not_yet": "none of the path's first {n} plans stays within {budget:g} yet: the last of them so far",
    "plan_partial": "*Measured {n} of the path's {total} plans; the rest follow.*",
    "plan_summary": ("**{where}**: `{plan}`, {verdict}. KL {kl:.4g} nats/token; {mib:.3f} MiB of KV cache at "
                     "{context:,} tokens: {fp16:.3f}× fp16, {uniform:.3f}× uniform {cheapest}. "
                     "Searched in {seconds:.1f} s."),
    "plan_export": "**Serving it:**",
    "plan_export_none": "No engine can express this plan: {note}",
    "plan_move_start": "start: every layer {spec}",
    "plan_move": "layer {layer}: {low} -> {high}",
    "plan_col0": "step",
    "plan_col1": "move",
    "plan_col2": "plan",
    "plan_col3": "KV cache (MiB)",
    "plan_col4": "KL (nats/token)",
    # lesson 9: rotate, then quantize (kvviz/ui/rotation.py, the Compare tab's accordion)
    "lesson9": "9 · Rotate, then quantize",
    "lesson_note9": ("**Lesson 9.** Rotate, then quantize. Six formats at 4 to 6 bits per value, their KL on 256 WikiText-2 "
                     "tokens. On SmolLM2: int4 per token 0.29 nats/token; the same int4 after a Hadamard rotation "
                     "(`int4/rot`) 0.057, 5× less at the same 4.25 bits; vLLM's `int4_per_token_head` 0.040 (4.5 bits); "
                     "TQ-mse 4-bit 0.044 (4.25 bits); vLLM's `turboquant_4bit_nc` 0.037 (5.9 bits: vLLM keeps the "
                     "first and last 2 of the 30 layers in 16 bits). The histogram says why the rotation works: in "
                     "layer 19's head 0 a few channels carry most of K's norm (kurtosis 25.6, largest coordinate 0.87 "
                     "of the unit vector); after the rotation the coordinates follow the N(0, 1/d) curve the codebook "
                     "is built for (kurtosis 2.3, largest 0.37). TQ-prod 4-bit is the exception: 0.36, 8× TQ-mse's "
                     "and worse than unrotated int4. Its score q·k is unbiased, but it pays for the 1-bit QJL sketch "
                     "with a 3-bit codebook, so each score carries far more random error; softmax exponentiates the "
                     "scores, so that error multiplies the attention weights instead of averaging out. That is why "
                     "vLLM's TurboQuant keeps TQ-mse's codebook and dropped QJL (its config.py: QJL \"hurts attention "
                     "quality by amplifying variance through softmax\")."),
    "lesson_models9": ("On Gemma 3 270M (head_dim 256) the same order: int4 1.68, `int4/rot` 0.25, vLLM's "
                       "`int4_per_token_head` 0.23, TQ-mse 4-bit 0.18, `turboquant_4bit_nc` 0.18 (6.7 bits: 4 of 18 "
                       "layers in 16 bits), TQ-prod 4-bit 1.23, 7× TQ-mse's; layer 6's head 0 goes from kurtosis 72 "
                       "to 2.4."),
    "rot_title": "Rotate, then quantize: six 4-bit formats, one head's K before and after the rotation (lesson 9)",
    "rot_intro": ("Six formats at nearly the same bytes: kvviz's int4 per token, the same after a Hadamard rotation "
                  "(`int4/rot`), vLLM's `int4_per_token_head` and `turboquant_4bit_nc` (vLLM keeps a dense model's "
                  "first and last 2 layers in 16 bits), and the TurboQuant paper's TQ-mse and TQ-prod at 4 bits "
                  "(TQ-prod: TQ-mse at 3 bits plus a 1-bit QJL sketch of the residual, an unbiased inner product). "
                  "Teacher-forced KL on WikiText-2 (the window's second half is scored); the histogram shows the "
                  "coordinates of one head's unit K vectors, before and after the rotation, against the N(0, 1/d) "
                  "curve TurboQuant's codebook is built for."),
    "rot_tokens": "WikiText-2 tokens",
    "rot_run": "Run the six formats",
    "rot_table": "KL and bits per format",
    "rot_h_bits": "bits per value (K and V, all layers)",
    "rot_h_se": "± standard error",
    "rot_c_bits": "bits per value (bits)",
    "rot_kl_title": "Six 4-bit formats on {model}: KL and bits ({n} WikiText-2 tokens)",
    "rot_hist_title": "{model}: layer {layer}, KV head {head}, K/‖K‖ coordinates (d = {d})",
    "rot_before": "before the rotation",
    "rot_after": "after the Hadamard rotation",
    "rot_curve": "N(0, 1/d): the codebook's density",
    "rot_hist_x": "coordinate of the unit vector K/‖K‖ (unitless)",
    "rot_hist_y": "density (per unit of coordinate)",
    "rot_done": "Measured on {model}, {n} WikiText-2 tokens, in {s:.1f} s.",
    "rot_hist_note": ("Layer {layer}, head {head} (the most heavy-tailed head, d = {d}): kurtosis of the coordinates "
                      "{kb:.1f} before the rotation, {ka:.1f} after (3 for N(0, 1/d)); the largest |coordinate| "
                      "{mb:.3f} before, {ma:.3f} after."),
    "rot_prod_worse": ("TQ-prod 4-bit: KL {prod:.5f}, {ratio:.2f}× TQ-mse 4-bit's {mse:.5f} at the same bytes: its "
                       "unbiased score costs more than the bias it removes."),
    "rot_prod_better": ("TQ-prod 4-bit: KL {prod:.5f}, {ratio:.2f}× TQ-mse 4-bit's {mse:.5f}: here the unbiased score "
                        "did better."),
}

KO: dict[str, str] = {
    "title": "# kvviz: KV 캐시 양자화 실습장",
    "subtitle": ("실제 언어 모델의 KV 캐시를 양자화하고, 그 결과가 키와 값, 메모리, 그리고 모델이 쓰는 글에 어떤 영향을 "
                 "주는지 직접 확인하세요. 아래 레슨을 고르거나 탭을 여세요."),
    "language": "언어",
    "lessons": "### 아홉 가지 레슨, 각각 한 번의 클릭",
    "lesson1": "1 · K에는 이상치 채널이 있고 V에는 없다",
    "lesson2": "2 · 텐서 단위 스케일은 실패, 토큰/채널 단위는 성공",
    "lesson3": "3 · K는 민감하고 V는 관대하다 (k8v4 vs k4v8)",
    "lesson4": "4 · KV에는 E4M3가 E5M2보다 낫다",
    "lesson5": "5 · 텐서 단위 int4는 바늘을 놓치고, 토큰 단위 int4는 덜 놓친다",
    "lesson6": "6 · 스케일 저장이 절감분을 갉아먹는다",
    "lesson7": "7 · 융합 역양자화가 비융합보다 빠르다",
    "lesson8": "8 · 소수의 레이어가 손상을 짊어진다: 그 레이어는 정밀하게",
    "lesson_note1": ("**레슨 1.** *K beside V* 그래프를 보세요: RoPE 이후 몇몇 K 채널(▼ 표시)은 다른 채널의 몇 배에 "
                     "이르지만 V의 채널은 고르게 유지됩니다. 히트맵에서는 같은 채널이 여러 레이어에 걸쳐 밝게 빛납니다."),
    "lesson_note2": ("**레슨 2.** 아래쪽 네 맵을 같은 색 척도로 비교하세요: 텐서 전체에 스케일 하나를 쓰면 이상치 채널이 "
                     "스케일을 늘려 오차가 곳곳에 퍼지고, 채널이나 토큰마다 스케일을 두면 오차가 갇힙니다. 먼저 아다마르 "
                     "회전을 하면 텐서 단위 스케일도 다시 좋아집니다. 아래의 *포맷 해부*는 토큰 하나가 int4/tensor를 "
                     "지나는 과정을 보여 줍니다: 이상치 채널(▼, 먼저 나열)이 하나뿐인 스케일을 정하고, 나머지 채널의 "
                     "코드는 0 근처의 몇 단계에 몰립니다."),
    "lesson_note3": ("**레슨 3.** k8v4와 k4v8은 같은 바이트를 씁니다. KL과 top-1을 비교하세요: 4비트 K가 4비트 V보다 "
                     "훨씬 해롭습니다. K의 오차는 어텐션 가중치를 바꾸지만 V의 오차는 평균 속에서 상쇄되기 때문입니다."),
    "lesson_note4": ("**레슨 4.** 레이어별 그래프에서 fp8_e4m3가 fp8_e5m2보다 아래에 있습니다: K와 V의 값 범위는 크지 "
                     "않으므로 E4M3의 가수 1비트가 E5M2의 넓은 지수 범위보다 값집니다. *정적 스케일에서는 E4M3의 "
                     "범위도 중요합니다:* vLLM과 SGLang은 보정된 스케일이 없으면 FP8을 스케일 1.0으로 저장하므로 "
                     "(여기서는 `fp8_e4m3/unit`) |K|가 448을 넘으면 포화됩니다. WikiText-2 512토큰에서 측정한 값"
                     "(benchmarks/fp8_unit_scale.py): SmolLM2의 RoPE 후 |K| 최댓값은 26.5로 448보다 17배 작고, "
                     "Gemma 3 270M은 97.4로 4.6배 작습니다. 둘 다 포화되지 않고, 단위 스케일의 K 오차(2.6%)는 보정된 "
                     "스케일과 같습니다. Qwen2 계열 모델은 k_proj 바이어스가 큽니다: kvviz의 작은 Qwen2의 두 헤드에서 "
                     "한 채널씩 600과 -700의 바이어스를 주면 |K|가 701에 이르고, 단위 스케일에서 K의 6.4%가 포화되며 K의 상대 "
                     "오차는 보정된 스케일의 2.4%에 비해 24%입니다."),
    "lesson_note5": ("**레슨 5.** 바늘 그래프는 숫자가 문맥의 어디에 있는지에 따른 검색 성공률입니다: 다섯 깊이마다 바늘 "
                     "3개, 각각 WikiText-2의 다른 구간에 숨기므로 각 점은 비율(0, 33, 67, 100%)입니다. SmolLM2, "
                     "352토큰: 원본 캐시는 15개 중 15개, 토큰 단위 int4는 15개(100%), 텐서 단위 int4는 7개(47%)를 "
                     "찾습니다. 텐서 전체에 스케일 하나를 쓰면 K의 이상치 채널이 스케일을 늘려 나머지 값에 남는 단계가 "
                     "너무 적고, 답이 틀리게 나옵니다. 문맥을 길게(슬라이더) 하면 4비트 포맷이 더 힘들어지고 시간도 "
                     "더 걸립니다: 바늘 하나마다 프리필이 한 번 더 듭니다."),
    "lesson_models5": ("**모델 간 차이:** Gemma 3 270M에서는 이 레슨을 256토큰에서 실행합니다. 거기서 이미 이상치 "
                       "채널(레이어 5와 11에서 중앙값의 약 30배)이 결과를 정합니다: 원본 캐시는 15개 중 15개, 토큰 "
                       "단위 int4는 8개(53%), 텐서 단위 int4는 하나도 찾지 못합니다. Gemma에서는 토큰마다 스케일 하나도 "
                       "K에는 거칩니다. 두 모델 모두 텐서 단위가 더 나쁩니다."),
    "lesson_note6": ("**레슨 6.** SmolLM2의 head_dim은 64입니다. bits/value 열을 보세요: int4에 fp16 스케일을 64개 값마다 "
                     "두면 4.25비트, 16개마다 5비트, 8개마다 6비트입니다. 그룹이 짧으면 절감분이 사라집니다."),
    "lesson_note7": ("**레슨 7.** Compare 탭의 *융합 대 비융합* 보기가 WikiText-2 프롬프트 1,024토큰 하나를 DynamicCache로, "
                     "그리고 int4와 k8v4로 각각 두 번씩, 지금 이 컴퓨터에서 디코딩합니다. 먼저 *단계당 읽기*를 보세요: "
                     "융합 커널(CPU에서는 kvviz의 numba 커널)은 패킹된 바이트만 읽습니다. 비융합 참조 구현은 매 단계 "
                     "기록 전체를 역양자화해 전체 정밀도 복사본을 쓰고 다시 읽으므로, 원본 캐시보다도 많은 바이트를 "
                     "옮깁니다 (SmolLM2에서 int4 융합 6.0 MiB, DynamicCache 45.4 MiB, int4 비융합 96.8 MiB). 다음은 "
                     "*토큰/초*: 융합이 비융합보다 빨라야 합니다. 비융합 경로는 매 단계 기록 전체를 복사하므로 그 추가 "
                     "작업은 기록이 길수록 늘어납니다 (프롬프트를 길게 해 보세요). DynamicCache와의 비교는 컴퓨터와 그 부하에 따라 "
                     "달라집니다 (docs/benchmarks.md에 측정한 실행이 있습니다). 상태 줄은 융합과 비융합이 같은 토큰을 썼는지, 융합 "
                     "경로가 실제로 돌았는지 알려줍니다: numba가 없으면 행에 '융합 아님'이라고 나옵니다."),
    "lesson_on_model": "_이 레슨은 탭에서 고른 모델 `{model}`에서 실행됩니다; 다른 모델을 골라 비교해 보세요._",
    "lesson_models1": ("**모델 간 차이** (가장 큰 K 채널 / 중앙값 채널, WikiText-2 256토큰): Gemma 3 270M은 전체 "
                       "어텐션 레이어 5와 11에서 약 28-34배에 이르고(이 모델에서는 레슨이 레이어 11을 엽니다) 슬라이딩 "
                       "윈도 레이어에서는 4-19배입니다; SmolLM2는 3.5-7.3배에 머뭅니다: 레슨은 SmolLM2의 레이어 "
                       "17(5배; 레이어 0에는 이상치 채널이 없습니다)을 엽니다."),
    "lesson_models2": ("**모델 간 차이:** 이상치 채널이 클수록 텐서 단위 스케일 하나가 더 많이 잃습니다. Gemma 3 "
                       "270M에서는 전체 어텐션 레이어 5와 11(K의 가장 큰 채널이 중앙값의 약 28-34배)을 보세요. 텐서 "
                       "단위 맵이 가장 두드러집니다; SmolLM2의 채널은 3.5-7.3배입니다."),
    "lesson_models3": ("**모델 간 차이:** k8v4는 SmolLM2의 head_dim 64에서 값당 6.25비트(16비트 캐시의 0.39배), "
                       "Gemma 3 270M의 head_dim 256에서 6.06비트(0.38배)입니다: head_dim 행마다 두는 fp16 스케일은 "
                       "행이 길수록 덜 듭니다. 비교 표에 두 가지 바이트 비율이 모두 나옵니다."),
    "lesson_models6": ("**모델 간 차이:** Gemma 3 270M은 head_dim이 256이라, 행마다 fp16 스케일 하나를 둔 int4는 "
                       "4.06비트입니다(SmolLM2는 head_dim 64에서 4.25). 16개·8개 그룹은 두 모델 모두 5비트와 6비트. "
                       "고른 모델에 프리셋이 있으면 레슨이 메모리 탭을 그 모델로 엽니다."),
    "lesson_note8": ("**레슨 8.** 이 맵은 WikiText-2의 64토큰에서 한 번에 한 레이어의 K 또는 V만 vLLM의 "
                     "`int4_per_token_head`(하다마드 회전 뒤 토큰·헤드마다 비대칭 int4)로 양자화합니다. SmolLM2에서는 "
                     "회전이 맵을 평평하게 만듭니다: 레이어 1의 K가 KL 0.0038 nats/토큰으로 가장 높고(중간 텐서의 8배), "
                     "그다음이 레이어 2와 10(0.0027)입니다. 이어서 그 dtype과 fp16으로 계획을 탐색합니다(예산 0.03): "
                     "모든 레이어를 `int4_per_token_head`로 두면 KL 0.046, 레이어 1-3과 10을 fp16으로 두면 0.027이 "
                     "되고 캐시는 fp16의 0.28배 대신 0.38배입니다. 레이어 1만 올리면 0.053으로 시작점보다 높습니다: 한 "
                     "레이어의 손상이 다른 레이어의 손상에 그대로 더해지지 않으므로, 탐색은 경로의 모든 계획을 직접 "
                     "잽니다. 후보가 엔진의 dtype과 fp16이라 결과는 vLLM이 서빙할 수 있는 계획입니다: *서빙하려면*에 "
                     "`--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers 1 2 3 10`이 나옵니다. 맵과 "
                     "탐색은 쉬고 있는 2코어 CPU에서 각각 5초 안팎 걸립니다(다른 작업과 나눠 쓰면 더 깁니다)."),
    "lesson_models8": ("**모델 간 차이:** Gemma 3 270M에서는 전체 어텐션 레이어 5와 11이 맵의 맨 위입니다(K의 KL "
                       "0.036과 0.034, 중간 텐서의 27배와 25배; 가장 큰 K 채널은 중앙값의 30배와 33배). 그래도 탐색(예산 "
                       "0.11)은 슬라이딩 윈도 레이어 4부터 올립니다: 4,096토큰에서 슬라이딩 레이어는 512토큰 윈도만 "
                       "담으므로 fp16으로 두는 비용이 전체 레이어의 10분의 1입니다. 모든 레이어를 "
                       "`int4_per_token_head`로 두면 KL 0.17, 레이어 4를 fp16으로 두면 0.100: `--kv-cache-dtype "
                       "int4_per_token_head --kv-cache-dtype-skip-layers 4`."),
    "tab_compare": "비교",
    "tab_outliers": "K 이상치",
    "tab_errors": "양자화 오차",
    "tab_memory": "메모리",
    "tab_export": "내보내기",
    "tab_sensitivity": "민감도",
    "prompt": "프롬프트",
    "model": "모델",
    "prompt_ph": "프롬프트를 입력하거나 아래 예시를 고르세요.",
    "layer": "레이어",
    "head": "KV 헤드",
    "run": "실행",
    "compare_intro": (
        "**보고 있는 것:** 같은 모델이 같은 프롬프트에 답하되, KV 캐시 포맷만 바꿔 나란히 보여줍니다. 양자화하지 않은 "
        "캐시가 기준이며, 각 포맷의 글이 기준에서 처음 갈라지는 단어를 <mark>강조</mark>합니다. KL과 top-1은 기준 토큰으로 "
        "teacher forcing 하여 측정하므로, 글이 갈라진 뒤에도 같은 조건에서 비교됩니다. k8v4와 k4v8을 비교해 보세요: "
        "바이트는 같지만 민감한 쪽은 K입니다."),
    "specs": "비교할 포맷 (양자화하지 않은 기준은 항상 실행)",
    "custom_specs": "추가 포맷 (직접 입력)",
    "custom_specs_info": ("한 줄에 K/V 스펙 하나, 예: k=int8,v=int4 또는 fp8_e5m2 또는 int4/channel/g32/asym, 또는 "
                          "int4; 0,27=fp16 같은 레이어별 계획"),
    "max_new_tokens": "최대 생성 토큰 수",
    "with_ppl": "WikiText-2 퍼플렉서티도 측정 (포맷마다 몇 초 추가)",
    "outputs": "생성된 글 (기준과 처음 갈라지는 곳 강조)",
    "metrics": "포맷별 지표",
    "needle_intro": ("**건초더미 속 바늘:** 긴 문맥의 여러 깊이에 숫자를 깊이마다 몇 번씩 숨기고, 각 포맷의 캐시로 다시 "
                     "물어봅니다. 거친 스케일이 먼저 놓칩니다."),
    # Compare: 엔진 보기 (kvviz/ui/engines.py)
    "engine_title": "kvviz와 엔진: llama.cpp(설정하면 vLLM도)의 캐시 타입을 엔진 안에서 측정",
    "engine_intro": ("**보고 있는 것:** llama.cpp의 KV 캐시 타입을 llama.cpp 안에서(앱의 작업자 프로세스에서, 모델의 GGUF 파일로) "
                     "그리고 kvviz의 시뮬레이션으로, WikiText-2의 같은 토큰에 대해 돌린 결과입니다. 각각의 KLD는 자기 "
                     "엔진의 양자화하지 않은 실행과 비교하며, 통계는 llama.cpp의 `--kl-divergence`와 같습니다."),
    "engine_vllm_note": ("**vLLM도:** 이 앱은 vLLM 서버와 함께 시작되었으므로(KVVIZ_VLLM_URLS), 실행할 때마다 같은 "
                         "토큰에서 vLLM의 KV 캐시 dtype도 측정하고, 같은 방식(상위 20개 로그 확률, 나머지는 한 묶음)으로 "
                         "잰 kvviz의 시뮬레이션 옆에 보여 줍니다. 판정 열은 엔진의 KLD가 시뮬레이션의 1.5배 안에 "
                         "있는지(*포맷이 예상하는 범위 안*), 그보다 큰지(*엔진이 포맷으로 설명되는 것보다 더 잃음*: "
                         "스케일이 커널에 전달되지 않는 것 같은 엔진 버그의 특징)를 말합니다."),
    "engine_pairs": "llama.cpp 캐시 타입 (-ctk / -ctv; 쌍은 k=K,v=V)",
    "engine_tokens": "WikiText-2 토큰 수 (많을수록 느리지만 수치가 안정적)",
    "engine_rotate": "llama.cpp에서 K/V 회전 (하다마드, 기본값; kvviz 포맷은 회전하지 않음)",
    "engine_run": "kvviz와 llama.cpp 실행",
    "engine_table": ("포맷별 평균 KLD (nats/토큰), 99번째 백분위수, 최상위 토큰 일치율; 이어서 kvviz의 llama.cpp "
                     "시뮬레이션과 그것의 llama.cpp 평균 KLD에 대한 비율"),
    "engine_why": (
        "**kvviz의 기본 포맷이 llama.cpp와 다른 이유** (docs/engines.md 참고). kvviz의 `q4_0`이나 `k=q8_0,v=q4_0`은 "
        "llama.cpp와 똑같은 블록을 저장하지만, llama.cpp는 저장 말고도 더 하는 일이 있습니다. *8비트 행렬곱 입력:* "
        "양자화된 가중치마다 입력을 8비트로 반올림해 곱하므로(GGUF의 Q4_1에는 q8_1), 작은 KV 오차도 이후 모든 층에서 "
        "반올림 몇 개를 뒤집습니다. 이것이 q8_0의 바닥입니다(SmolLM2, 512 토큰에서 kvviz의 기본 q8_0은 0.00026, "
        "llama.cpp는 0.0034). *회전:* 끄지 않으면 llama.cpp는 양자화된 K와 V에 하다마드 행렬을 곱하고, 그러면 q4_0의 "
        "KLD가 내려갑니다. *채널 순서:* Llama 계열 GGUF에서는 캐시의 32개짜리 블록이 transformers의 순서와 다른 K "
        "채널을 묶습니다. \"kvviz's llama.cpp simulation\" 열은 이 셋(과 llama.cpp의 flash attention)을 같은 가중치와 "
        "토큰에 위의 회전 설정으로 적용합니다. 비트 단위로 같지는 않아서 비율은 1 근처에 흩어집니다(번들 모델, 512 "
        "토큰에서 20% 이내; 토큰이 적으면 더 흩어짐)."),
    # Compare: 융합 대 비융합 디코딩 (kvviz/ui/fused.py)
    "fused_title": "융합 대 비융합 디코딩: tokens/s와 단계당 읽는 바이트 (레슨 7)",
    "fused_intro": ("**보고 있는 것:** WikiText-2 프롬프트 뒤의 같은 greedy 디코딩을 원본 캐시(DynamicCache)로, 그리고 "
                    "포맷마다 두 번, 지금 이 컴퓨터에서 돌린 결과입니다. *융합*: 어텐션 커널이 패킹된 코드와 스케일을 "
                    "그 자리에서 읽습니다 (CPU에서는 kvviz의 numba 커널, GPU에서는 Triton 커널). *비융합*: 참조 구현이 "
                    "매 단계 기록 전체를 전체 정밀도로 역양자화한 뒤 그 복사본으로 SDPA를 돌립니다. *단계당 읽는 "
                    "바이트*는 마지막 단계의 K/V를 셉니다: 원본 캐시는 그 값, 융합은 패킹된 바이트, 비융합은 패킹된 "
                    "바이트에 전체 정밀도 복사본을 쓰고 다시 읽는 양(원본 캐시의 2배; 참조 구현의 다른 임시 텐서는 "
                    "세지 않음)을 더합니다. 모든 실행은 같은 프리필에서 시작해 두 라운드 동안 "
                    "단계마다 시간을 재고, 각 실행의 중앙값 단계를 남깁니다(바쁜 순간은 몇 단계만 늦출 뿐 값을 바꾸지 않습니다)."),
    "fused_specs": "포맷 (각각 융합과 비융합으로 두 번 디코딩)",
    "fused_context": "프롬프트 토큰 수 (WikiText-2)",
    "fused_new": "시간을 재는 디코딩 토큰 수",
    "fused_run": "융합 대 비융합 시간 재기",
    "fused_table": "캐시와 디코딩 경로별 tokens/s와 디코딩 단계당 읽는 K/V 바이트",
    "fused_h_format": "캐시",
    "fused_h_path": "디코딩 경로",
    "fused_h_tps": "토큰/초",
    "fused_h_vs": "DynamicCache 대비 ×",
    "fused_h_mib": "단계당 읽기 (MiB)",
    "fused_c_tps": "디코딩 속도 (tokens/s)",
    "fused_c_mib": "단계당 읽는 K/V (MiB)",
    "fused_fig": "{model}의 융합 대 비융합 디코딩, 프롬프트 {n}토큰",
    "fused_fig_x": "캐시 · 디코딩 경로",
    "fused_fused": "융합",
    "fused_unfused": "비융합",
    "fused_path_exact": "원본: 모델 dtype K/V에 SDPA",
    "fused_path_fused": "융합: {backend} 커널이 패킹된 바이트를 읽음",
    "fused_path_unfused": "비융합: 기록을 역양자화한 뒤 SDPA",
    "fused_path_fallback": "융합 아님: 참조 구현이 실행됨 ({why})",
    "fused_why_unavailable": "이 컴퓨터에서 융합 경로가 돌지 않음",
    "fused_why_no_branch": "이 포맷의 융합 분기가 없음",
    "fused_why_lossless": "무손실 캐스트: 레퍼런스가 DynamicCache와 똑같은 값을 읽음",
    "fused_done": ("{s:.0f}초 만에 끝남. `{model}`: WikiText-2 프롬프트 {n}토큰 뒤 greedy 디코딩, {rounds}라운드 x "
                   "{steps}단계 측정의 중앙값; 융합 백엔드 `{backend}`."),
    "fused_cut": "이 모델의 위치 수에 맞추려고 프롬프트를 {asked}토큰에서 {n}토큰으로 잘랐습니다.",
    "fused_same": "융합과 비융합이 {formats}에서 같은 {n}개 토큰을 생성했습니다.",
    "fused_differ": ("**융합과 비융합이 다른 토큰을 생성했습니다**: {formats}. 커널은 SDPA와 다른 순서로 float32 합을 "
                     "구하므로, 두 토큰이 거의 동점이면 뒤바뀔 수 있습니다."),
    "fused_unavailable": ("**이 컴퓨터에서는 융합 경로가 돌지 않습니다** (백엔드 `{backend}`: numba가 없거나 컴파일에 "
                          "실패, 또는 Triton용 GPU 없음). 그래서 '융합 아님'으로 표시된 행은 비융합 참조 구현으로 "
                          "디코딩했으며, 융합 디코딩의 측정값이 아닙니다. numba를 설치(`pip install numba`)하고 앱을 "
                          "다시 시작하세요."),
    "fused_no_branch": "{formats}: 융합 경로에 이 포맷의 분기가 없어서 '융합' 행도 참조 구현으로 돌았습니다.",
    "fused_lossless": ("{formats}: 모델 자신의 dtype으로의 무손실 변환이라 '융합' 행도 참조 구현으로 돌았습니다. 참조 "
                       "구현은 어텐션에 DynamicCache와 똑같은 값을 넘깁니다."),
    "fused_ctx_fig": "{model}의 컨텍스트에 따른 디코딩 속도: 작은 캐시가 원본 캐시를 앞지르는 지점",
    "fused_ctx_x": "컨텍스트 (토큰)",
    "fused_ctx_recorded": ("**컨텍스트에 따른 속도** (곡선): 디코딩 한 단계는 가중치와 캐시 전체를 읽으므로, 컨텍스트가 "
                           "길어질수록 원본 캐시는 느려지고 4비트 캐시는 그 바이트의 약 7분의 1만 읽습니다. 점선은 "
                           "포맷마다의 한계로, 원본 캐시 속도 × (가중치 + 원본 K/V 바이트) / (가중치 + 포맷의 바이트), "
                           "즉 바이트 말고는 비용이 없을 때 닿을 속도입니다. 곡선: `{command}`로 {machine}에서 "
                           "{date}에 기록. 마름모: 지금 이 컴퓨터에서 돌린 이번 실행."),
    "fused_ctx_none": ("**컨텍스트에 따른 속도**: `{model}`의 기록이 없습니다 (번들 모델만 있음; "
                       "`python -m kvviz bench --contexts 1024,2048,4096,8192 --model ...`로 만들 수 있음). "
                       "마름모는 이번 실행입니다."),
    "needle_title": "건초더미 속 바늘: 긴 문맥에서 찾아내기 (레슨 5)",
    "needle_run": "바늘 테스트 실행",
    "needle_context": "문맥 길이 (토큰)",
    "outliers_intro": (
        "**보고 있는 것:** 한 레이어, 한 KV 헤드에서 프롬프트 전체에 걸쳐 키(K)와 값(V)의 각 채널이 도달하는 최대 |값|. "
        "RoPE 이후 몇몇 K 채널은 나머지의 몇 배에 이르는 크기를 가지지만, V에는 그런 채널이 없습니다. 아다마르(Hadamard) "
        "회전은 채널을 섞어 이상치를 고르게 퍼뜨립니다."),
    "outliers_why": (
        "**왜 중요한가.** 텐서 전체가 스케일 하나를 공유하면 그 스케일이 이상치 채널에 맞춰 늘어나, 나머지 채널에는 "
        "몇 개의 레벨만 남습니다. 채널마다 스케일을 두면(KIVI의 채널 단위 K) 이상치 채널도 제 범위를 가지며, 아다마르 "
        "회전은 양자화 전에 이상치를 평평하게 만듭니다. V에는 이상치 채널이 없고 토큰에 대한 가중 평균으로 읽혀 오차가 "
        "일부 상쇄되므로, 토큰마다 스케일 하나(head_dim 방향)면 충분합니다."),
    "errors_intro": (
        "**보고 있는 것:** 양자화 오차가 어디에 생기는지. 히트맵은 한 포맷·레이어·헤드에서 토큰과 채널별 |x − x̂|, 선 "
        "그래프는 고른 포맷마다 각 레이어의 상대 오차, 아래 네 맵은 같은 텐서를 토큰 단위·채널 단위·텐서 단위 스케일, "
        "그리고 아다마르 회전 뒤 텐서 단위 스케일로 양자화한 결과를 같은 색 척도로 보여줍니다."),
    "error_format": "히트맵에 쓸 포맷",
    "error_formats": "레이어별 그래프에 쓸 포맷",
    "which": "텐서",
    "anatomy_title": "포맷 해부: 토큰 하나가 양자화기를 지나는 과정",
    "anatomy_intro": (
        "**보이는 것:** 실제 K(RoPE 이후)나 V에서 KV 헤드 하나의 토큰 하나를 원소별로 보여 줍니다: 입력, 코드가 "
        "양자화하는 값(회전 포맷이면 회전된 값), 원소마다 저장된 코드와 비트, 저장된 스케일이나 노름, 복원값과 오차. "
        "원소에 마우스를 올리면 계산식이 보입니다. 레이어, 헤드, 프롬프트는 이 탭의 것이고, ▼는 헤드의 이상치 "
        "채널입니다."),
    "anatomy_format": "포맷 (스펙, K/V 쌍, 엔진 dtype 모두 가능)",
    "anatomy_side": "K 또는 V",
    "anatomy_token": "토큰 (프롬프트 안의 위치)",
    "anatomy_run": "해부 보기",
    "f_anatomy": "{side}의 토큰 {token} ('{text}')에 적용한 {fmt}, {where}",
    "f_rotated_hist": "{fmt}: 모든 토큰의 회전된 좌표와 코드북의 가우스 분포 ({where})",
    "r_anatomy_head": ("**`{fmt}`**, {side}, 레이어 {layer}, KV 헤드 {head}, 토큰 {token} (`{text}`): 값당 "
                       "{bpv:g}비트; 이 토큰의 상대 오차 {err:.2%}. 코드가 양자화하는 것: {domain}."),
    "r_anatomy_rotation": "**회전:** {rotation}.",
    "r_anatomy_codebook": "**코드북** (중심점 {n}개, 단위 벡터 좌표): {codebook}. **노름** {norm:.5g}.",
    "r_anatomy_scales": "**코드와 함께 저장되는 수**\n\n| 수 | 값 | dtype | 저장 비트 | 원소 |",
    "r_anatomy_more": "…그리고 {n}개 더.",
    "r_anatomy_no_scale": "**스케일 없음:** 각 코드는 값 자체를 포맷의 비트로 변환한 것입니다.",
    "r_anatomy_steps": ("**단계별** (이상치 채널 먼저)\n\n| 원소 | 입력 | 양자화되는 값 | 코드 (비트) | 계산 | 읽은 값 | "
                        "오차 |"),
    "r_anatomy_no_codebook": "이 포맷에는 코드북이 없습니다: 히스토그램은 TurboQuant 포맷용입니다.",
    "memory_intro": (
        "**보고 있는 것:** 실제 모델 형태에서 문맥 길이에 따른 KV 캐시 메모리, 포맷마다 선 하나, 그리고 가중치를 뺀 뒤 각 "
        "GPU에 남는 용량을 점선으로 보여줍니다. 스케일 저장도 계산에 넣습니다: head_dim 64에 그룹이 짧으면 절감분이 "
        "눈에 띄게 줄어듭니다."),
    "model_preset": "모델",
    "memory_config_source": "또는: config.json 파일이나 허브 id (모델 선택보다 우선)",
    "memory_config_file": "모델의 config.json 올리기 (최대 1 MB)",
    "memory_hf_id": "Hugging Face 허브 id",
    "memory_hf_id_info": "예: Qwen/Qwen3-8B; 이 앱이 네트워크에 연결되어 있을 때만 동작",
    "memory_layout": "레이아웃",
    "memory_layout_info": ("engine: vLLM/SGLang이 할당하는 방식 (슬라이딩 레이어는 윈도만, MLA는 잠재 벡터만); "
                           "transformers: transformers 캐시 방식 (윈도 - 1); decompressed: MLA를 헤드별로"),
    "memory_breakdown": "최장 문맥에서 레이어 종류별: 레이어 수, 각 레이어가 담는 토큰 수, 포맷별 GB",
    "custom_dims": "직접 입력한 모델 크기 (모델이 'custom'일 때 사용)",
    "layers": "레이어 수",
    "kv_heads": "KV 헤드 수",
    "head_dim": "헤드 차원",
    "params_b": "파라미터 수 (십억)",
    "gpus": "GPU (점선, 그리고 표의 열)",
    "batch": "배치 크기",
    "ctx_min": "가장 짧은 문맥 (토큰)",
    "ctx_max": "가장 긴 문맥 (토큰)",
    "memory_formats": "포맷",
    "fit_table": "GPU별: 현재 배치 크기에서 들어가는 최장 문맥 · 위의 최장 문맥에서 들어가는 최대 배치",
    "export_intro": (
        "**보고 있는 것:** 이 KV 캐시 포맷으로 vLLM과 SGLang에서 모델을 서빙하는 플래그와 코드, 그리고 여러분의 "
        "프롬프트로 보정한 레이어별 스케일(SGLang 스케일 파일). 엔진이 지원하지 않는 포맷은 다른 포맷으로 몰래 바꾸지 "
        "않고 그대로 표시합니다."),
    "export_format": "포맷",
    "model_id": "명령에 넣을 모델 id 또는 경로",
    "support_table": "어느 엔진이 어떤 포맷을 지원하는가",
    "calib_prompts": "보정용 프롬프트 (한 줄에 하나)",
    "calib_file": "SGLang 스케일 파일 (여러분의 프롬프트로 보정)",
    "scale_upload": "스케일 파일 검사 (JSON)",
    "check": "파일 검사",
    "model_info_any": "목록의 모델을 고르거나 Hugging Face 허브 id(owner/name)를 직접 입력하세요; 크기를 먼저 확인합니다",
    "r_baseline": "원본 (기준)",
    "r_none": "없음",
    "r_outlier_count": "{total}개 중 가장 큰 {shown}개",
    "r_skipped": "**건너뜀** (이 모델의 형태로는 담을 수 없음):",
    "r_metrics_later": "생성이 끝나면 지표가 나타납니다.",
    "r_prefill": "`{model}`에서 프롬프트 토큰 {n}개를 프리필한 뒤, 포맷 {formats}개와 기준을 한 배치로 디코딩합니다…",
    "r_token": "토큰 {i} / {n} (`{model}`)…",
    "r_ppl_running": "모든 포맷의 캐시로 WikiText-2 퍼플렉서티를 측정하는 중…",
    "r_meta": "KL {kl:.4f} · top-1 {top1:.0f}% · 16비트 대비 바이트 {vs16}",
    "r_meta_base": "프롬프트 토큰 {n}개 · 양자화하지 않은 {dtype} K/V",
    "r_done": ("`{model}`에서 {s:.1f}초 만에 완료. KL과 top-1은 기준의 토큰으로 teacher forcing 하여 측정했습니다 "
               "({metrics}). 토큰/초: 포맷마다 자기 캐시, `{speed}` 어텐션 백엔드, 배치 1, {steps}단계. 바이트: "
               "\"16비트 대비 캐시\"는 엔진이 저장하는 fp16/bf16 캐시와, \"원본 대비 캐시\"는 여기서 이 모델이 쓰는 "
               "캐시와 비교한 값입니다."),
    "r_needle": ("WikiText-2 {n}토큰 안에 깊이 {depths}곳마다 바늘 {per}개, `{model}`, 각 포맷의 캐시로 읽은 답. "
                 "찾아낸 비율: {found}."),
    "h_format": "포맷",
    "h_spec": "스펙",
    "h_bits": "값당 비트",
    "h_kl": "평균 KL (nats/토큰)",
    "h_kl_median": "KL 중앙값",
    "h_kl_p99": "KL 99백분위",
    "h_top1": "top-1 일치율 (%)",
    "h_divergence": "처음 갈라진 곳 (토큰)",
    "h_cache_kib": "캐시 (KiB)",
    "h_vs16": "16비트 대비 캐시",
    "h_vs_exact": "원본({dtype}) 대비 캐시",
    "h_tps": "토큰/초",
    "h_ppl": "퍼플렉서티",
    "c_kl": "평균 KL (nats/토큰)",
    "c_top1": "top-1 일치율 (%)",
    "c_vs16": "fp16/bf16 대비 캐시 (× 바이트)",
    "c_tps": "디코딩 속도 (토큰/초)",
    "c_ppl": "퍼플렉서티 (WikiText-2)",
    "f_metrics": "{model}의 포맷별 품질과 비용 (기준: 양자화하지 않은 캐시)",
    "f_format_axis": "포맷 (K/V 스펙)",
    "f_needle": "문맥 {n}토큰에서 건초더미 속 바늘, 깊이마다 바늘 {per}개 ({model})",
    "f_needle_x": "바늘 깊이 (문맥의 %)",
    "f_needle_y": "찾아낸 비율 (%)",
    "r_where": "레이어 {layer}, KV 헤드 {head}, 토큰 {n}개, `{model}`",
    "f_k_max": "토큰 전체에서 |K| 최댓값 (절댓값)",
    "f_x_max": "토큰 전체에서 |x| 최댓값 (절댓값)",
    "f_rope": "채널별 K, RoPE 전과 후 ({where})",
    "f_kv": "K와 V 나란히 ({where})",
    "f_rot": "아다마르 회전이 이상치를 퍼뜨린다 ({where})",
    "f_heat": "레이어·채널별 RoPE 이후 |K| 최댓값 (KV 헤드 {head}, {model})",
    "f_k_z": "|K| 최댓값 (절댓값)",
    "r_outliers": ("**이상치 채널** (|x| 최댓값이 헤드의 중앙값 채널의 {factor}배 이상), {where}:\n\n"
                   "- RoPE 이후 K: {k_post}; 가장 큰 채널 / 중앙값 = **{r_post:.1f}×**\n"
                   "- RoPE 이전 K: {k_pre}; {r_pre:.1f}×\n"
                   "- V: {v}; {r_v:.1f}×\n"
                   "- 아다마르 회전 뒤 RoPE 이후 K: {rot_before:.1f}× → **{rot_after:.1f}×** (첨도 "
                   "{kurt_before:.1f} → {kurt_after:.1f}, 채널 평균; 가우스 분포는 3)\n\n"
                   "모든 레이어와 헤드에서: RoPE 이후 K의 이상치 채널 {n_k}개, V는 {n_v}개."),
    "r_where_short": "레이어 {layer}, KV 헤드 {head}, {model}",
    "f_error_heat": "{fmt}의 |{side} − {side}̂| ({which}, {where})",
    "f_quality_map": "품질 대 바이트: 값당 비트에 따른 평균 KL, 점선은 파레토 경계 ({model})",
    "f_layer_errors": "{model}의 레이어별 상대 오차 (RoPE 이후 K 실선, V 점선)",
    "f_rel_error": "상대 오차 (‖x - x̂‖ / ‖x‖)",
    "r_no_scales": "({base}에는 스케일이 없어 int4를 보여줍니다)",
    "f_granularity": "{base}: 토큰별, 채널별, 텐서별 스케일 하나 ({which}, {where})",
    "f_gran_sub": "상대 오차 {err:.3g} · 값당 {bits:g}비트",
    "r_errors_head": "이 프롬프트의 토큰 {n}개에서 레이어 평균 (`{model}`):",
    "r_errors_table": "| 포맷 | K 상대 오차 | V 상대 오차 | 어텐션 출력 상대 오차 | 값당 비트 |",
    "r_errors_note": "어텐션 출력 오차는 다음 레이어가 보는 것입니다: 양자화된 K와 V, 그리고 프롬프트 자신의 쿼리.",
    "r_supported": "지원",
    "r_not_supported": "지원하지 않음",
    "r_unsupported": "✗ 지원하지 않음",
    "f_scales": "레이어별로 보정한 FP8 E4M3 스케일 (프롬프트 {n}개, {model})",
    "r_scales": ("**스케일**: `{model}`로 프롬프트 {n}개에서 보정 (레이어마다 amax / 448). SGLang은 레이어마다 "
                 "스케일 하나를 K와 V에 함께 쓰므로 파일에는 둘 중 큰 값이 들어갑니다. 위 명령 옆에 "
                 "`scales.json`으로 저장하세요."),
    "r_scales_fp8_only": ("_SGLang 스케일 파일은 레이어별 FP8 E4M3 텐서 단위 스케일을 담습니다; 프롬프트로 보정하려면 "
                          "fp8_e4m3를 고르세요._"),
    "f_scales_fp8_only": "스케일은 fp8_e4m3에서만 보정합니다.",
    "r_scales_no_prompts": "_레이어별 스케일을 얻으려면 보정용 프롬프트를 넣으세요._",
    "f_scales_no_prompts": "스케일을 보정하려면 보정용 프롬프트를 넣으세요.",
    "sens_intro": (
        "**보고 있는 것:** 한 레이어의 K 또는 V만 고른 포맷으로 저장하고 나머지는 모두 원본으로 둘 때, 모델의 다음 토큰 "
        "분포가 얼마나 움직이는지(글 전체에 대한 teacher forcing 평균 KL). 소수의 레이어가 손상의 대부분을 짊어지며, "
        "표의 크기 통계가 그 이유를 보여줍니다(레이어의 중간 채널보다 훨씬 큰 K 채널). 그런 레이어는 더 높은 정밀도로 "
        "두세요: 아래 *계획 찾기*가 KL 예산 안에서 그렇게 합니다."),
    "sens_source": "측정할 글",
    "sens_source_info": "WikiText-2: 함께 들어 있는 테스트 구간; prompt: 아래 글",
    "sens_spec": "포맷 (K/V 스펙)",
    "sens_tokens": "토큰 수",
    "sens_tokens_info": "글을 이 토큰 수로 자릅니다; 한가한 2코어 CPU에서 SmolLM2는 256토큰에 약 50초 걸립니다",
    "sens_run": "민감도 측정",
    "sens_norms": "레이어별: K와 V의 KL, 그리고 최고점을 설명하는 K/V 크기",
    "sens_where": "{model}, {spec}, {tokens}토큰",
    "sens_heat_title": "한 레이어의 K 또는 V만 양자화했을 때의 KL ({where})",
    "sens_rank_title": "가장 해로운 레이어 ({where})",
    "sens_col0": "레이어",
    "sens_col1": "K: KL (nats/토큰)",
    "sens_col2": "V: KL (nats/토큰)",
    "sens_col3": "K 최대 |x|",
    "sens_col4": "K 채널 최대값의 중앙값",
    "sens_col5": "K 채널 비율 (×)",
    "sens_col6": "K 최대 토큰 노름",
    "sens_col7": "V 최대 |x|",
    "sens_col8": "V 채널 비율 (×)",
    "sens_col9": "V 최대 토큰 노름",
    "sens_summary": ("**{where}**: 한 레이어의 K(또는 V)만 양자화하고 반대쪽은 {other}로 둔 {rows}개 변형을 한 배치로 "
                     "{seconds:.1f}초에 측정했습니다. 가장 나쁜 것:"),
    "sens_peak_line": ("- **레이어 {layer}의 {side}**: KL {kl:.4g} nats/토큰, 중앙값의 {times:.1f}배; 가장 큰 {side} 채널이 "
                       "중간 채널의 {ratio:.1f}배 (중간 레이어 {median_ratio:.1f}배), 최대 |{side}| {peak:.3g}"),
    "plan_intro": (
        "### 계획 찾기\n"
        "모든 레이어를 가장 싼 후보로 시작해, 바이트당 줄어드는 KL이 가장 큰 레이어부터 한 번에 하나씩 다음 후보로 "
        "올립니다. KL이 예산 안에 드는 가장 싼 계획을 돌려줍니다. 곡선은 그 과정의 모든 단계입니다."),
    "plan_candidates": "후보 포맷 (레이어마다 섞어 씀)",
    "plan_custom": "추가 후보 (직접 입력)",
    "plan_custom_info": "한 줄에 K/V 스펙 하나, 예: k=int8,v=int4",
    "plan_budget": "KL 예산 (nats/토큰)",
    "plan_budget_info": "계획이 치를 수 있는 teacher forcing 평균 KL, 0에서 10; 0.01은 글에서 알아차리기 어렵습니다",
    "plan_run": "계획 찾기",
    "plan_found": "계획 (기본값; 레이어=스펙)",
    "plan_to_compare": "이 계획 비교하기",
    "plan_to_memory": "이 계획의 메모리",
    "plan_steps": "탐색의 모든 단계: 옮긴 레이어, 계획, 바이트와 KL",
    "plan_where": "{model}, 후보 {cands}, 예산 {budget:g}",
    "plan_fig_title": "탐색 경로의 KV 바이트 대 KL ({where})",
    "plan_within": "예산 {budget:g} 이내",
    "plan_over": "**경로의 어떤 계획도 {budget:g} 안에 들지 않습니다**: 모든 레이어를 최상위 후보로 둔 계획입니다",
    "plan_not_yet": "경로의 처음 {n}개 계획 중 아직 {budget:g} 안에 드는 것이 없습니다: 지금까지의 마지막 계획입니다",
    "plan_partial": "*경로의 계획 {total}개 중 {n}개를 측정했습니다; 나머지가 이어집니다.*",
    "plan_summary": ("**{where}**: `{plan}`, {verdict}. KL {kl:.4g} nats/토큰; {context:,}토큰에서 KV 캐시 {mib:.3f} MiB: "
                     "fp16의 {fp16:.3f}배, 균일 {cheapest}의 {uniform:.3f}배. 탐색 {seconds:.1f}초."),
    "plan_export": "**서빙하려면:**",
    "plan_export_none": "이 계획을 표현할 수 있는 엔진이 없습니다: {note}",
    "plan_move_start": "시작: 모든 레이어 {spec}",
    "plan_move": "레이어 {layer}: {low} -> {high}",
    "plan_col0": "단계",
    "plan_col1": "이동",
    "plan_col2": "계획",
    "plan_col3": "KV 캐시 (MiB)",
    "plan_col4": "KL (nats/토큰)",
    # 레슨 9: 회전한 다음 양자화 (kvviz/ui/rotation.py, Compare 탭의 아코디언)
    "lesson9": "9 · 회전한 다음 양자화",
    "lesson_note9": ("**레슨 9.** 회전한 다음 양자화. 값당 4~6비트의 포맷 여섯 개를 WikiText-2 256토큰에서 KL로 비교합니다. "
                     "SmolLM2에서: 토큰별 int4는 0.29 nats/토큰; 같은 int4를 하다마드 회전 후에(`int4/rot`) 0.057, 같은 "
                     "4.25비트에서 5분의 1; vLLM의 `int4_per_token_head` 0.040 (4.5비트); TQ-mse 4비트 0.044 (4.25비트); "
                     "vLLM의 `turboquant_4bit_nc` 0.037 (5.9비트: vLLM은 30개 레이어 중 처음과 마지막 2개를 16비트로 "
                     "둡니다). 히스토그램이 회전이 통하는 이유를 보여 줍니다: 레이어 19의 헤드 0에서는 몇몇 채널이 K 노름의 "
                     "대부분을 가집니다(첨도 25.6, 단위 벡터의 가장 큰 좌표 0.87). 회전 후에는 좌표가 코드북이 가정하는 "
                     "N(0, 1/d) 곡선을 따릅니다(첨도 2.3, 가장 큰 좌표 0.37). 예외는 TQ-prod 4비트입니다: 0.36으로 "
                     "TQ-mse의 8배, 회전하지 않은 int4보다도 나쁩니다. 점수 q·k는 불편추정이지만 1비트 QJL 스케치를 위해 "
                     "코드북을 3비트로 줄이므로 점수마다 무작위 오차가 훨씬 큽니다. softmax는 점수를 지수로 올리므로 그 "
                     "오차는 평균으로 사라지지 않고 어텐션 가중치에 곱해집니다. 그래서 vLLM의 TurboQuant는 K에 TQ-mse의 "
                     "코드북을 쓰고 QJL을 뺐습니다(config.py: QJL은 \"softmax를 통해 분산을 키워 어텐션 품질을 해친다\")."),
    "lesson_models9": ("Gemma 3 270M(head_dim 256)에서도 순서는 같습니다: int4 1.68, `int4/rot` 0.25, vLLM의 "
                       "`int4_per_token_head` 0.23, TQ-mse 4비트 0.18, `turboquant_4bit_nc` 0.18 (6.7비트: 18개 레이어 중 "
                       "4개가 16비트), TQ-prod 4비트 1.23으로 TQ-mse의 7배; 레이어 6의 헤드 0은 첨도 72에서 2.4로."),
    "rot_title": "회전한 다음 양자화: 4비트 포맷 여섯 개, 회전 전후 한 헤드의 K (레슨 9)",
    "rot_intro": ("거의 같은 바이트의 포맷 여섯 개: kvviz의 토큰별 int4, 같은 것을 하다마드 회전 후에(`int4/rot`), vLLM의 "
                  "`int4_per_token_head`와 `turboquant_4bit_nc`(vLLM은 dense 모델의 처음과 마지막 2개 레이어를 16비트로 "
                  "둡니다), 그리고 TurboQuant 논문의 4비트 TQ-mse와 TQ-prod(TQ-prod: 3비트 TQ-mse에 잔차의 1비트 QJL "
                  "스케치를 더한 것, 내적이 불편추정). WikiText-2에서 teacher-forced KL을 잽니다(윈도의 뒤쪽 절반을 "
                  "채점). 히스토그램은 한 헤드의 단위 K 벡터 좌표를 회전 전후로, TurboQuant 코드북이 가정하는 "
                  "N(0, 1/d) 곡선과 함께 보여 줍니다."),
    "rot_tokens": "WikiText-2 토큰 수",
    "rot_run": "여섯 포맷 실행",
    "rot_table": "포맷별 KL과 비트",
    "rot_h_bits": "값당 비트 (K와 V, 모든 레이어)",
    "rot_h_se": "± 표준오차",
    "rot_c_bits": "값당 비트 (비트)",
    "rot_kl_title": "{model}의 4비트 포맷 여섯 개: KL과 비트 (WikiText-2 {n}토큰)",
    "rot_hist_title": "{model}: 레이어 {layer}, KV 헤드 {head}, K/‖K‖ 좌표 (d = {d})",
    "rot_before": "회전 전",
    "rot_after": "하다마드 회전 후",
    "rot_curve": "N(0, 1/d): 코드북이 가정하는 분포",
    "rot_hist_x": "단위 벡터 K/‖K‖의 좌표 (단위 없음)",
    "rot_hist_y": "밀도 (좌표 단위당)",
    "rot_done": "{model}, WikiText-2 {n}토큰에서 측정, {s:.1f}초.",
    "rot_hist_note": ("레이어 {layer}, 헤드 {head} (좌표 꼬리가 가장 두꺼운 헤드, d = {d}): 좌표의 첨도는 회전 전 {kb:.1f}, "
                      "회전 후 {ka:.1f} (N(0, 1/d)는 3); 가장 큰 |좌표|는 회전 전 {mb:.3f}, 회전 후 {ma:.3f}."),
    "rot_prod_worse": ("TQ-prod 4비트: KL {prod:.5f}, 같은 바이트의 TQ-mse 4비트 {mse:.5f}의 {ratio:.2f}배: 불편추정 "
                       "점수가 없애는 편향보다 더 큰 값을 치릅니다."),
    "rot_prod_better": ("TQ-prod 4비트: KL {prod:.5f}, TQ-mse 4비트 {mse:.5f}의 {ratio:.2f}배: 여기서는 불편추정 점수가 "
                        "더 나았습니다."),
}

STRINGS = {"en": EN, "ko": KO}


def t(key: str, lang: str = "en") -> str:
    """The string for `key` in `lang` ("en" or "ko"); English when the language lacks it."""
    assert key in EN, f"unknown UI string key {key!r}"
    return STRINGS.get(lang, EN).get(key, EN[key])


def lang_code(choice: str | None) -> str:
    """Map the radio's choice ("English", "한국어") or a code ("ko") to a code; unknown means English."""
    if choice in LANGUAGES:
        return LANGUAGES[choice]
    return choice if choice in STRINGS else "en"


class Translator:
    """Remembers which component attribute shows which string key, to relabel them all on a language switch."""

    def __init__(self) -> None:
        self._items: list[tuple[Any, dict[str, str]]] = []

    def __call__(self, component: Any, **attr_keys: str) -> Any:
        """Register `component`; attr_keys maps an attribute (label, value, info, placeholder) to a string key."""
        for key in attr_keys.values():
            assert key in EN, f"unknown UI string key {key!r}"
        self._items.append((component, attr_keys))
        return component

    def language_input(self, radio: gr.Radio | None = None) -> gr.Radio:
        """The page's language radio, which callbacks take as their `lang` input. app.py registers its radio
        here; a tab built alone gets a hidden English one."""
        if radio is not None:
            self._language = radio
        elif getattr(self, "_language", None) is None:
            self._language = gr.Radio(list(LANGUAGES), value="English", label="Language", visible=False)
        return self._language

    @property
    def components(self) -> list[Any]:
        return [c for c, _ in self._items]

    def updates(self, lang: str) -> list[Any]:
        """One gr.update per registered component, in registration order, with every attribute in `lang`."""
        return [gr.update(**{attr: t(key, lang) for attr, key in keys.items()}) for _, keys in self._items]


def choice_from_request(request: gr.Request) -> str:
    """The language radio's starting value for this visitor: `?lang=ko` wins, else the browser's first language."""
    query = dict(request.query_params) if request is not None else {}
    if query.get("lang") in ("ko", "en"):
        return "한국어" if query["lang"] == "ko" else "English"
    accept = request.headers.get("accept-language", "") if request is not None else ""
    return "한국어" if accept.lower().startswith("ko") else "English"

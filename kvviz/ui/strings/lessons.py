"""kvviz.ui.strings.lessons: the lessons: button labels, notes and the across-models paragraphs (their measured
figures are placeholders filled from lesson_figures.json), in English and Korean.
"""

from __future__ import annotations

EN: dict[str, str] = {
    "lessons": "### Eleven lessons, one click each",
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
                     "needles at each of 5 depths, each in its own stretch of WikiText-2, so each point is a rate (0, "
                     "33, 67 or 100%). SmolLM2 at {smol[l5_ctx]} tokens: the exact cache finds {smol[l5_exact]} of "
                     "{smol[l5_total]}, per-token int4 {smol[l5_int4]} ({smol[l5_int4_pct]:.0f}%), per-tensor int4 "
                     "{smol[l5_tensor]} ({smol[l5_tensor_pct]:.0f}%): one scale for the whole tensor, stretched by "
                     "K's outlier channels, leaves too few levels for the rest, and the answer comes back wrong. "
                     "Longer contexts (the slider) press the 4-bit formats harder and take longer: each needle is one "
                     "more prefill."),
    "lesson_models5": ("**Across models:** Gemma 3 270M runs this lesson at {gemma[l5_ctx]} tokens, where its outlier "
                       "channels (about 30× the median in layers 5 and 11) already decide it: the exact cache finds "
                       "{gemma[l5_exact]} of {gemma[l5_total]}, per-token int4 {gemma[l5_int4]} "
                       "({gemma[l5_int4_pct]:.0f}%), per-tensor int4 {gemma[l5_tensor]} "
                       "({gemma[l5_tensor_pct]:.0f}%). On Gemma even one scale per token is too coarse for K; "
                       "per-tensor is worse on both models."),
    "lesson_note6": ("**Lesson 6.** SmolLM2 has head_dim 64. Read the bits/value column: int4 with one fp16 scale per "
                     "64 values costs {smol[l6_bits_row]:g} bits, per 16 values {smol[l6_bits_g16]:g}, per 8 values "
                     "{smol[l6_bits_g8]:g}. Short groups eat the savings."),
    "lesson_note7": ("**Lesson 7.** The Compare tab's *fused against unfused* view decodes one 1,024-token WikiText-2 "
                     "prompt through both exact caches, DynamicCache and StaticCache, and through int4 and k8v4 twice each, on "
                     "this machine, now. First "
                     "read *read per step*: the fused kernel (on the CPU, kvviz's numba kernel) reads only the packed "
                     "bytes; the unfused reference dequantizes the whole history at every step, writing a "
                     "full-precision copy and reading it back, so it moves more bytes than even the exact cache (on "
                     "SmolLM2: {smol[l7_int4_fused_mib]:.1f} MiB for int4 fused, {smol[l7_exact_mib]:.1f} MiB for "
                     "DynamicCache, {smol[l7_static_mib]:.1f} MiB for StaticCache, {smol[l7_int4_unfused_mib]:.1f} "
                     "MiB for int4 unfused). Then *tokens/s*: fused should decode faster than unfused, whose extra "
                     "work grows with the history it copies at every step (try a longer prompt). Measure it against "
                     "StaticCache: preallocated and written in place, it is the fair exact baseline, where "
                     "DynamicCache also copies its whole history at every step (torch.cat) and so looks slower than "
                     "its bytes explain. How far fused gets ahead depends on the context, the machine and how busy "
                     "it is (the curves below; docs/benchmarks.md gives measured runs). The status line says whether fused and unfused wrote "
                     "the same tokens and whether the fused path really ran: without numba the rows say NOT fused."),
    "lesson_on_model": "_This lesson runs on `{model}`, the model picked in the tabs; pick another to compare._",
    "lesson_models1": ("**Across models** (largest K channel / median channel, 256 WikiText-2 tokens): Gemma 3 270M's "
                       "reaches about 28-34× in its full-attention layers 5 and 11 (the lesson opens layer 11 there) "
                       "against 4-19× in its sliding-window layers; SmolLM2's stays at 3.5-7.3×: the lesson opens "
                       "its layer 17 (5×; its layer 0 has none)."),
    "lesson_models2": ("**Across models:** the larger the outlier channel, the more one per-tensor scale loses. On "
                       "Gemma 3 270M, look at the full-attention layers 5 and 11 (K's largest channel about 28-34× "
                       "the median), where the per-tensor map stands out most; SmolLM2's channels reach 3.5-7.3×."),
    "lesson_models3": ("**Across models:** k8v4 holds {smol[l3_bits]:.2f} bits per value at SmolLM2's head_dim 64 "
                       "({smol[l3_vs16]:.2f}× a 16-bit cache) and {gemma[l3_bits]:.2f} at Gemma 3 270M's head_dim 256 "
                       "({gemma[l3_vs16]:.2f}×): the fp16 scale per head_dim row costs less on longer rows. The "
                       "Compare table gives both byte ratios."),
    "lesson_models6": ("**Across models:** Gemma 3 270M has head_dim 256, so int4 with one fp16 scale per row costs "
                       "{gemma[l6_bits_row]:.2f} bits (SmolLM2: {smol[l6_bits_row]:g} at head_dim 64); groups of 16 "
                       "and 8 cost {gemma[l6_bits_g16]:g} and {gemma[l6_bits_g8]:g} bits on both. The lesson opens "
                       "the Memory tab on the picked model when it has a preset there."),
    "lesson_note8": ("**Lesson 8.** The map quantizes one layer's K or V at a time to vLLM's `int4_per_token_head` "
                     "(asymmetric int4 per token and head after a Hadamard rotation), on 64 tokens of WikiText-2. "
                     "On SmolLM2 the rotation flattens the map: layer {smol[l8_peak1_layer]}'s {smol[l8_peak1_side]} "
                     "tops it at KL {smol[l8_peak1_kl]:.2g} nats/token, {smol[l8_peak1_times]:.0f}× the median "
                     "tensor's, then layers {smol[l8_peak2_layer]} and {smol[l8_peak3_layer]} "
                     "({smol[l8_peak2_kl]:.2g}). Then the plan search over that dtype and fp16 (budget 0.03): every "
                     "layer in `int4_per_token_head` costs KL {smol[l8_kl_start]:.2g}; keeping layers "
                     "{smol[l8_plan]} in fp16 brings it to {smol[l8_kl_plan]:.2g} for {smol[l8_plan_fp16]:.2f}× an "
                     "fp16 cache instead of {smol[l8_start_fp16]:.2f}×. Layer {smol[l8_move1_layer]} alone reads "
                     "{smol[l8_kl_move1]:.2g}, above the start: one layer's damage does not simply add to the "
                     "others', which is why the search measures every plan on its path. Because the candidates are "
                     "an engine dtype and fp16, the plan is one vLLM serves: *Serving it* gives `--kv-cache-dtype "
                     "int4_per_token_head --kv-cache-dtype-skip-layers {smol[l8_skip]}`. The map and the search each "
                     "take about 5 seconds on an idle 2-core CPU (longer when the machine is shared)."),
    "lesson_models8": ("**Across models:** on Gemma 3 270M the full-attention layers {gemma[l8_peak1_layer]} and "
                       "{gemma[l8_peak2_layer]} top the map (K's KL {gemma[l8_peak1_kl]:.2g} and "
                       "{gemma[l8_peak2_kl]:.2g}, {gemma[l8_peak1_times]:.0f}× and {gemma[l8_peak2_times]:.0f}× the "
                       "median tensor's; their largest K channel {gemma[l8_peak1_ratio]:.0f}× and "
                       "{gemma[l8_peak2_ratio]:.0f}× the median). The search (budget 0.11) still starts with "
                       "sliding-window layer {gemma[l8_move1_layer]}: at 4,096 tokens a sliding layer holds only its "
                       "512-token window, so keeping it in fp16 costs a tenth of what a full layer does. Every layer "
                       "in `int4_per_token_head` costs KL {gemma[l8_kl_start]:.2g}; layer {gemma[l8_plan]} in fp16 "
                       "brings it to {gemma[l8_kl_plan]:.3f}: `--kv-cache-dtype int4_per_token_head "
                       "--kv-cache-dtype-skip-layers {gemma[l8_skip]}`."),
    "lesson9": "9 · Rotate, then quantize",
    "lesson_note9": ("**Lesson 9.** Rotate, then quantize. Six formats at 4 to 6 bits per value, their KL on 256 "
                     "WikiText-2 tokens. On SmolLM2: int4 per token {smol[l9_kl_int4]:.2f} nats/token; the same int4 "
                     "after a Hadamard rotation (`int4/rot`) {smol[l9_kl_rot]:.3f}, {smol[l9_int4_over_rot]:.0f}× "
                     "less at the same {smol[l9_bits_rot]:g} bits; vLLM's `int4_per_token_head` "
                     "{smol[l9_kl_vllm_int4]:.3f} ({smol[l9_bits_vllm_int4]:g} bits); TQ-mse 4-bit "
                     "{smol[l9_kl_mse]:.3f} ({smol[l9_bits_mse]:g} bits); vLLM's `turboquant_4bit_nc` "
                     "{smol[l9_kl_vllm_tq]:.3f} ({smol[l9_bits_vllm_tq]:.1f} bits: vLLM keeps the first and last 2 "
                     "of the 30 layers in 16 bits). The histogram says why the rotation works: in layer "
                     "{smol[l9_layer]}'s head {smol[l9_head]} a few channels carry most of K's norm (kurtosis "
                     "{smol[l9_kurt_before]:.1f}, largest coordinate {smol[l9_max_before]:.2f} of the unit vector); "
                     "after the rotation the coordinates follow the N(0, 1/d) curve the codebook is built for "
                     "(kurtosis {smol[l9_kurt_after]:.1f}, largest {smol[l9_max_after]:.2f}). TQ-prod 4-bit is the "
                     "exception: {smol[l9_kl_prod]:.2f}, {smol[l9_prod_over_mse]:.0f}× TQ-mse's and worse than "
                     "unrotated int4. Its score q·k is unbiased, but it pays for the 1-bit QJL sketch with a 3-bit "
                     "codebook, so each score carries far more random error; softmax exponentiates the scores, so "
                     "that error multiplies the attention weights instead of averaging out. That is why vLLM's "
                     "TurboQuant keeps TQ-mse's codebook and dropped QJL (its config.py: QJL \"hurts attention "
                     "quality by amplifying variance through softmax\")."),
    "lesson_models9": ("On Gemma 3 270M (head_dim 256) the rotation helps too: int4 {gemma[l9_kl_int4]:.2f}, "
                       "`int4/rot` {gemma[l9_kl_rot]:.2f}, vLLM's `int4_per_token_head` {gemma[l9_kl_vllm_int4]:.2f}, TQ-mse "
                       "4-bit {gemma[l9_kl_mse]:.2f}, `turboquant_4bit_nc` {gemma[l9_kl_vllm_tq]:.2f} "
                       "({gemma[l9_bits_vllm_tq]:.1f} bits: 4 of 18 layers in 16 bits), TQ-prod 4-bit "
                       "{gemma[l9_kl_prod]:.2f}, {gemma[l9_prod_over_mse]:.0f}× TQ-mse's; layer {gemma[l9_layer]}'s "
                       "head {gemma[l9_head]} goes from kurtosis {gemma[l9_kurt_before]:.0f} to "
                       "{gemma[l9_kurt_after]:.1f}."),
    "lesson10": "10 · Errors pile up with context",
    "lesson_note10": ("**Lesson 10.** The chart reads {smol[l10_ctx]:,} WikiText-2 tokens through each cache 256 "
                      "at a time, each chunk attending to the cache as stored (as an engine's chunked prefill does), "
                      "and plots KL against position; the table sets each format's mean KL over the last quarter of "
                      "the positions against the first quarter's. On SmolLM2 int4 goes from "
                      "{smol[l10_int4_first]:.3f} to {smol[l10_int4_last]:.3f} nats/token "
                      "({smol[l10_int4_growth]:.2f}×): each new token reads every earlier token's quantized K and V, "
                      "so a short test understates the damage at the end of a long context. k8v4 stays far below "
                      "({smol[l10_k8v4_first]:.4f} to {smol[l10_k8v4_last]:.4f}, {smol[l10_k8v4_growth]:.2f}×): "
                      "8-bit K keeps the attention weights. nvfp4 (FP8 block scales under one fp32 global scale, fitted on "
                      "the first chunk, as a prefill fits it) grows most, {smol[l10_nvfp4_first]:.3f} to "
                      "{smol[l10_nvfp4_last]:.3f} ({smol[l10_nvfp4_growth]:.1f}×). In the generation below "
                      "the share of steps "
                      "whose top-1 differs from the exact run's: int4 {smol[l10_int4_differ]:.1f}%, k8v4 "
                      "{smol[l10_k8v4_differ]:.1f}%, nvfp4 {smol[l10_nvfp4_differ]:.1f}%."),
    "lesson_models10": ("**Across models:** on Gemma 3 270M (its sliding-window layers hold 512 tokens: past "
                        "position 512 only its 3 full-attention layers read further back) int4 goes from "
                        "{gemma[l10_int4_first]:.2f} to {gemma[l10_int4_last]:.2f} ({gemma[l10_int4_growth]:.2f}×), "
                        "k8v4 from {gemma[l10_k8v4_first]:.3f} to {gemma[l10_k8v4_last]:.3f} "
                        "({gemma[l10_k8v4_growth]:.2f}×), nvfp4 from {gemma[l10_nvfp4_first]:.2f} to "
                        "{gemma[l10_nvfp4_last]:.2f} ({gemma[l10_nvfp4_growth]:.1f}×); in its generation the top-1 "
                        "differs at {gemma[l10_int4_differ]:.1f}% (int4), {gemma[l10_k8v4_differ]:.1f}% (k8v4) and "
                        "{gemma[l10_nvfp4_differ]:.1f}% (nvfp4) of the steps."),
    "lesson11": "11 · Drop tokens or drop bits?",
    "lesson_note11": ("**Lesson 11.** Every candidate spends a quarter of the 16-bit cache of {smol[l11_ctx]} WikiText-2 "
                      "tokens; read the KL over the next 16 tokens (teacher-forced) against the bytes. On SmolLM2, "
                      "int4 on every token reads them at {smol[l11_kl_int4]:.3f} nats/token (its fp16 scale per row "
                      "puts it at {smol[l11_pct_int4]:.1f}%, just over the budget); 16 bits on a quarter of the "
                      "tokens costs several times more: snapkv {smol[l11_kl_snapkv]:.2f}, streaming "
                      "{smol[l11_kl_streaming]:.2f}. In between, int8 on {smol[l11_keep_int8_snapkv]:.0f}% of the "
                      "tokens {smol[l11_kl_int8_snapkv]:.3f}, int4 on {smol[l11_keep_int4_snapkv]:.0f}% "
                      "{smol[l11_kl_int4_snapkv]:.3f}. Keeping the dropped tokens in int2 instead does not help here: "
                      "int4 on {smol[l11_keep_int4_mixed]:.0f}% and the rest in int2 reads {smol[l11_kl_int4_mixed]:.3f}, "
                      "because per-token int2 is too coarse (on every token it collapses: {smol[l11_kl_int2]:.1f}). "
                      "More tokens at fewer bits beat fewer tokens at 16, as \"More "
                      "Tokens, Lower Precision\" (EMNLP 2025) found, down to 4 bits. The needle chart (one needle at "
                      "each of 5 depths) asks what eviction risks: the policy picks what to keep before the question "
                      "arrives."),
    "lesson_models11": ("**Across models:** Gemma 3 270M keeps 15 of its 18 layers in 512-token sliding windows, which "
                        "the policies leave as they are: at {gemma[l11_ctx]} tokens those layers hold every token, so 16 "
                        "bits (or 8) on fewer tokens cannot reach a quarter of the cache at all (the tab lists why). "
                        "What fits: int4 on every token {gemma[l11_kl_int4]:.2f} ({gemma[l11_pct_int4]:.1f}%), int4 "
                        "under snapkv on its 3 full-attention layers ({gemma[l11_keep_int4_snapkv]:.0f}% of their "
                        "tokens) {gemma[l11_kl_int4_snapkv]:.2f}, the same with the rest in int2 "
                        "({gemma[l11_keep_int4_mixed]:.0f}% in int4) {gemma[l11_kl_int4_mixed]:.2f}, int2 on every "
                        "token {gemma[l11_kl_int2]:.1f}. On Gemma the int2 rest helps (it touches 3 layers' dropped tokens), on "
                        "SmolLM2 it hurts; either way the budget goes to bits, not tokens. The KLs are over 16 tokens: "
                        "a few positions weigh a lot."),
}

KO: dict[str, str] = {
    "lessons": "### 열한 가지 레슨, 각각 한 번의 클릭",
    "lesson1": "1 · K에는 이상치 채널이 있고 V에는 없다",
    "lesson2": "2 · 텐서 단위 스케일은 실패, 토큰/채널 단위는 성공",
    "lesson3": "3 · K는 민감하고 V는 관대하다 (k8v4 vs k4v8)",
    "lesson4": "4 · KV에는 E4M3가 E5M2보다 낫다",
    "lesson5": "5 · 텐서 단위 int4는 바늘을 놓치고, 토큰 단위 int4는 덜 놓친다",
    "lesson6": "6 · 스케일 저장이 절감분을 갉아먹는다",
    "lesson7": "7 · 융합 역양자화가 비융합보다 빠르다",
    "lesson8": "8 · 소수의 레이어가 손상을 짊어진다: 그 레이어는 정밀하게",
    "lesson_note1": ("**레슨 1.** *K와 V 나란히* 그래프를 보세요: RoPE 이후 몇몇 K 채널(▼ 표시)은 다른 채널의 몇 배에 "
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
                     "{smol[l5_ctx]}토큰: 원본 캐시는 {smol[l5_total]}개 중 {smol[l5_exact]}개, 토큰 단위 int4는 "
                     "{smol[l5_int4]}개({smol[l5_int4_pct]:.0f}%), 텐서 단위 int4는 {smol[l5_tensor]}개"
                     "({smol[l5_tensor_pct]:.0f}%)를 찾습니다. 텐서 전체에 스케일 하나를 쓰면 K의 이상치 채널이 스케일을 늘려 나머지 값에 남는 단계가 "
                     "너무 적고, 답이 틀리게 나옵니다. 문맥을 길게(슬라이더) 하면 4비트 포맷이 더 힘들어지고 시간도 "
                     "더 걸립니다: 바늘 하나마다 프리필이 한 번 더 듭니다."),
    "lesson_models5": ("**모델 간 차이:** Gemma 3 270M에서는 이 레슨을 {gemma[l5_ctx]}토큰에서 실행합니다. 거기서 이미 이상치 "
                       "채널(레이어 5와 11에서 중앙값의 약 30배)이 결과를 정합니다: 원본 캐시는 {gemma[l5_total]}개 중 "
                       "{gemma[l5_exact]}개, 토큰 단위 int4는 {gemma[l5_int4]}개({gemma[l5_int4_pct]:.0f}%), 텐서 단위 "
                       "int4는 {gemma[l5_tensor]}개({gemma[l5_tensor_pct]:.0f}%)를 찾습니다. Gemma에서는 토큰마다 스케일 하나도 "
                       "K에는 거칩니다. 두 모델 모두 텐서 단위가 더 나쁩니다."),
    "lesson_note6": ("**레슨 6.** SmolLM2의 head_dim은 64입니다. bits/value 열을 보세요: int4에 fp16 스케일을 64개 값마다 "
                     "두면 {smol[l6_bits_row]:g}비트, 16개마다 {smol[l6_bits_g16]:g}비트, 8개마다 "
                     "{smol[l6_bits_g8]:g}비트입니다. 그룹이 짧으면 절감분이 사라집니다."),
    "lesson_note7": ("**레슨 7.** Compare 탭의 *융합 대 비융합* 보기가 WikiText-2 프롬프트 1,024토큰 하나를 두 원본 캐시 "
                     "DynamicCache와 StaticCache로, 그리고 int4와 k8v4로 각각 두 번씩, 지금 이 컴퓨터에서 디코딩합니다. 먼저 *단계당 읽기*를 보세요: "
                     "융합 커널(CPU에서는 kvviz의 numba 커널)은 패킹된 바이트만 읽습니다. 비융합 참조 구현은 매 단계 "
                     "기록 전체를 역양자화해 전체 정밀도 복사본을 쓰고 다시 읽으므로, 원본 캐시보다도 많은 바이트를 "
                     "옮깁니다 (SmolLM2에서 int4 융합 "
                     "{smol[l7_int4_fused_mib]:.1f} MiB, DynamicCache {smol[l7_exact_mib]:.1f} MiB, StaticCache "
                     "{smol[l7_static_mib]:.1f} MiB, int4 비융합 "
                     "{smol[l7_int4_unfused_mib]:.1f} MiB). 다음은 "
                     "*토큰/초*: 융합이 비융합보다 빨라야 합니다. 비융합 경로는 매 단계 기록 전체를 복사하므로 그 추가 "
                     "작업은 기록이 길수록 늘어납니다 (프롬프트를 길게 해 보세요). 원본과의 비교는 StaticCache로 하세요: 미리 "
                     "할당해 제자리에 쓰므로 공정한 원본 기준이고, DynamicCache는 매 단계 기록 전체를 복사(torch.cat)해서 "
                     "바이트로 설명되는 것보다 느려 보입니다. 융합이 얼마나 앞서는지는 컨텍스트, 컴퓨터와 그 부하에 따라 "
                     "달라집니다 (아래 곡선; docs/benchmarks.md에 측정한 실행이 있습니다). 상태 줄은 융합과 비융합이 같은 토큰을 썼는지, 융합 "
                     "경로가 실제로 돌았는지 알려줍니다: numba가 없으면 행에 '융합 아님'이라고 나옵니다."),
    "lesson_on_model": "_이 레슨은 탭에서 고른 모델 `{model}`에서 실행됩니다; 다른 모델을 골라 비교해 보세요._",
    "lesson_models1": ("**모델 간 차이** (가장 큰 K 채널 / 중앙값 채널, WikiText-2 256토큰): Gemma 3 270M은 전체 "
                       "어텐션 레이어 5와 11에서 약 28-34배에 이르고(이 모델에서는 레슨이 레이어 11을 엽니다) 슬라이딩 "
                       "윈도 레이어에서는 4-19배입니다; SmolLM2는 3.5-7.3배에 머뭅니다: 레슨은 SmolLM2의 레이어 "
                       "17(5배; 레이어 0에는 이상치 채널이 없습니다)을 엽니다."),
    "lesson_models2": ("**모델 간 차이:** 이상치 채널이 클수록 텐서 단위 스케일 하나가 더 많이 잃습니다. Gemma 3 "
                       "270M에서는 전체 어텐션 레이어 5와 11(K의 가장 큰 채널이 중앙값의 약 28-34배)을 보세요. 텐서 "
                       "단위 맵이 가장 두드러집니다; SmolLM2의 채널은 3.5-7.3배입니다."),
    "lesson_models3": ("**모델 간 차이:** k8v4는 SmolLM2의 head_dim 64에서 값당 {smol[l3_bits]:.2f}비트(16비트 캐시의 "
                       "{smol[l3_vs16]:.2f}배), Gemma 3 270M의 head_dim 256에서 {gemma[l3_bits]:.2f}비트"
                       "({gemma[l3_vs16]:.2f}배)입니다: head_dim 행마다 두는 fp16 스케일은 "
                       "행이 길수록 덜 듭니다. 비교 표에 두 가지 바이트 비율이 모두 나옵니다."),
    "lesson_models6": ("**모델 간 차이:** Gemma 3 270M은 head_dim이 256이라, 행마다 fp16 스케일 하나를 둔 int4는 "
                       "{gemma[l6_bits_row]:.2f}비트입니다(SmolLM2는 head_dim 64에서 {smol[l6_bits_row]:g}). 16개·8개 "
                       "그룹은 두 모델 모두 {gemma[l6_bits_g16]:g}비트와 {gemma[l6_bits_g8]:g}비트. "
                       "고른 모델에 프리셋이 있으면 레슨이 메모리 탭을 그 모델로 엽니다."),
    "lesson_note8": ("**레슨 8.** 이 맵은 WikiText-2의 64토큰에서 한 번에 한 레이어의 K 또는 V만 vLLM의 "
                     "`int4_per_token_head`(하다마드 회전 뒤 토큰·헤드마다 비대칭 int4)로 양자화합니다. SmolLM2에서는 "
                     "회전이 맵을 평평하게 만듭니다: 레이어 {smol[l8_peak1_layer]}의 {smol[l8_peak1_side]}가 KL "
                     "{smol[l8_peak1_kl]:.2g} nats/토큰으로 가장 높고(중간 텐서의 {smol[l8_peak1_times]:.0f}배), "
                     "그다음이 레이어 {smol[l8_peak2_layer]}와 {smol[l8_peak3_layer]}({smol[l8_peak2_kl]:.2g})입니다. "
                     "이어서 그 dtype과 fp16으로 계획을 탐색합니다(예산 0.03): 모든 레이어를 `int4_per_token_head`로 "
                     "두면 KL {smol[l8_kl_start]:.2g}, 레이어 {smol[l8_plan]}을 fp16으로 두면 {smol[l8_kl_plan]:.2g}이 "
                     "되고 캐시는 fp16의 {smol[l8_start_fp16]:.2f}배 대신 {smol[l8_plan_fp16]:.2f}배입니다. 레이어 "
                     "{smol[l8_move1_layer]}만 올리면 {smol[l8_kl_move1]:.2g}으로 시작점보다 높습니다: 한 레이어의 "
                     "손상이 다른 레이어의 손상에 그대로 더해지지 않으므로, 탐색은 경로의 모든 계획을 직접 잽니다. "
                     "후보가 엔진의 dtype과 fp16이라 결과는 vLLM이 서빙할 수 있는 계획입니다: *서빙하려면*에 "
                     "`--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers {smol[l8_skip]}`이 나옵니다. "
                     "맵과 탐색은 쉬고 있는 2코어 CPU에서 각각 5초 안팎 걸립니다(다른 작업과 나눠 쓰면 더 깁니다)."),
    "lesson_models8": ("**모델 간 차이:** Gemma 3 270M에서는 전체 어텐션 레이어 {gemma[l8_peak1_layer]}와 "
                       "{gemma[l8_peak2_layer]}이 맵의 맨 위입니다(K의 KL {gemma[l8_peak1_kl]:.2g}과 "
                       "{gemma[l8_peak2_kl]:.2g}, 중간 텐서의 {gemma[l8_peak1_times]:.0f}배와 "
                       "{gemma[l8_peak2_times]:.0f}배; 가장 큰 K 채널은 중앙값의 {gemma[l8_peak1_ratio]:.0f}배와 "
                       "{gemma[l8_peak2_ratio]:.0f}배). 그래도 탐색(예산 0.11)은 슬라이딩 윈도 레이어 "
                       "{gemma[l8_move1_layer]}부터 올립니다: 4,096토큰에서 슬라이딩 레이어는 512토큰 윈도만 담으므로 "
                       "fp16으로 두는 비용이 전체 레이어의 10분의 1입니다. 모든 레이어를 `int4_per_token_head`로 두면 "
                       "KL {gemma[l8_kl_start]:.2g}, 레이어 {gemma[l8_plan]}를 fp16으로 두면 {gemma[l8_kl_plan]:.3f}: "
                       "`--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers {gemma[l8_skip]}`."),
    "lesson9": "9 · 회전한 다음 양자화",
    "lesson_note9": ("**레슨 9.** 회전한 다음 양자화. 값당 4~6비트의 포맷 여섯 개를 WikiText-2 256토큰에서 KL로 "
                     "비교합니다. SmolLM2에서: 토큰별 int4는 {smol[l9_kl_int4]:.2f} nats/토큰; 같은 int4를 하다마드 "
                     "회전 후에(`int4/rot`) {smol[l9_kl_rot]:.3f}, 같은 {smol[l9_bits_rot]:g}비트에서 "
                     "{smol[l9_int4_over_rot]:.0f}분의 1; vLLM의 `int4_per_token_head` {smol[l9_kl_vllm_int4]:.3f} "
                     "({smol[l9_bits_vllm_int4]:g}비트); TQ-mse 4비트 {smol[l9_kl_mse]:.3f} ({smol[l9_bits_mse]:g}비트); "
                     "vLLM의 `turboquant_4bit_nc` {smol[l9_kl_vllm_tq]:.3f} ({smol[l9_bits_vllm_tq]:.1f}비트: vLLM은 "
                     "30개 레이어 중 처음과 마지막 2개를 16비트로 둡니다). 히스토그램이 회전이 통하는 이유를 보여 "
                     "줍니다: 레이어 {smol[l9_layer]}의 헤드 {smol[l9_head]}에서는 몇몇 채널이 K 노름의 대부분을 "
                     "가집니다(첨도 {smol[l9_kurt_before]:.1f}, 단위 벡터의 가장 큰 좌표 {smol[l9_max_before]:.2f}). "
                     "회전 후에는 좌표가 코드북이 가정하는 N(0, 1/d) 곡선을 따릅니다(첨도 {smol[l9_kurt_after]:.1f}, "
                     "가장 큰 좌표 {smol[l9_max_after]:.2f}). 예외는 TQ-prod 4비트입니다: {smol[l9_kl_prod]:.2f}으로 "
                     "TQ-mse의 {smol[l9_prod_over_mse]:.0f}배, 회전하지 않은 int4보다도 나쁩니다. 점수 q·k는 "
                     "불편추정이지만 1비트 QJL 스케치를 위해 코드북을 3비트로 줄이므로 점수마다 무작위 오차가 훨씬 "
                     "큽니다. softmax는 점수를 지수로 올리므로 그 오차는 평균으로 사라지지 않고 어텐션 가중치에 "
                     "곱해집니다. 그래서 vLLM의 TurboQuant는 K에 TQ-mse의 코드북을 쓰고 QJL을 뺐습니다(config.py: "
                     "QJL은 \"softmax를 통해 분산을 키워 어텐션 품질을 해친다\")."),
    "lesson_models9": ("Gemma 3 270M(head_dim 256)에서도 회전이 도움이 됩니다: int4 {gemma[l9_kl_int4]:.2f}, `int4/rot` "
                       "{gemma[l9_kl_rot]:.2f}, vLLM의 `int4_per_token_head` {gemma[l9_kl_vllm_int4]:.2f}, TQ-mse "
                       "4비트 {gemma[l9_kl_mse]:.2f}, `turboquant_4bit_nc` {gemma[l9_kl_vllm_tq]:.2f} "
                       "({gemma[l9_bits_vllm_tq]:.1f}비트: 18개 레이어 중 4개가 16비트), TQ-prod 4비트 "
                       "{gemma[l9_kl_prod]:.2f}으로 TQ-mse의 {gemma[l9_prod_over_mse]:.0f}배; 레이어 "
                       "{gemma[l9_layer]}의 헤드 {gemma[l9_head]}은 첨도 {gemma[l9_kurt_before]:.0f}에서 "
                       "{gemma[l9_kurt_after]:.1f}로."),
    "lesson10": "10 · 오차는 문맥이 길수록 쌓인다",
    "lesson_note10": ("**레슨 10.** 그래프는 WikiText-2 {smol[l10_ctx]:,}토큰을 캐시마다 256토큰씩 읽고(각 청크는 "
                      "저장된 그대로의 캐시를 봅니다. 엔진의 청크 프리필과 같습니다) 위치별 KL을 그립니다. 표는 포맷마다 "
                      "마지막 4분의 1 위치의 평균 KL을 처음 4분의 1과 견줍니다. SmolLM2에서 int4는 "
                      "{smol[l10_int4_first]:.3f}에서 {smol[l10_int4_last]:.3f} nats/토큰으로 "
                      "({smol[l10_int4_growth]:.2f}배) 커집니다: 새 토큰은 앞선 모든 토큰의 양자화된 K와 V를 읽으므로, "
                      "짧은 시험은 긴 문맥 끝의 손상을 과소평가합니다. k8v4는 훨씬 아래에 머뭅니다"
                      "({smol[l10_k8v4_first]:.4f}에서 {smol[l10_k8v4_last]:.4f}, {smol[l10_k8v4_growth]:.2f}배): "
                      "8비트 K가 어텐션 가중치를 지킵니다. nvfp4(fp32 전역 스케일 하나 아래의 FP8 블록 스케일; 전역 스케일은 "
                      "프리필처럼 첫 청크로 맞춥니다)가 가장 크게 커집니다({smol[l10_nvfp4_first]:.3f}에서 "
                      "{smol[l10_nvfp4_last]:.3f}, {smol[l10_nvfp4_growth]:.1f}배). 아래 생성에서 "
                      "top-1이 원본과 다른 단계의 비율: int4 {smol[l10_int4_differ]:.1f}%, k8v4 "
                      "{smol[l10_k8v4_differ]:.1f}%, nvfp4 {smol[l10_nvfp4_differ]:.1f}%."),
    "lesson_models10": ("**모델 간 차이:** Gemma 3 270M(슬라이딩 윈도 레이어는 512토큰만 담으므로 위치 512 뒤로는 전체 "
                        "어텐션 레이어 3개만 더 멀리 읽습니다)에서 int4는 {gemma[l10_int4_first]:.2f}에서 "
                        "{gemma[l10_int4_last]:.2f}로({gemma[l10_int4_growth]:.2f}배), k8v4는 "
                        "{gemma[l10_k8v4_first]:.3f}에서 {gemma[l10_k8v4_last]:.3f}로({gemma[l10_k8v4_growth]:.2f}배), "
                        "nvfp4는 {gemma[l10_nvfp4_first]:.2f}에서 {gemma[l10_nvfp4_last]:.2f}로"
                        "({gemma[l10_nvfp4_growth]:.1f}배) 커집니다. 생성에서 top-1이 다른 단계는 int4 "
                        "{gemma[l10_int4_differ]:.1f}%, k8v4 {gemma[l10_k8v4_differ]:.1f}%, nvfp4 "
                        "{gemma[l10_nvfp4_differ]:.1f}%입니다."),
    "lesson11": "11 · 토큰을 버릴까, 비트를 버릴까?",
    "lesson_note11": ("**레슨 11.** 모든 후보가 WikiText-2 {smol[l11_ctx]}토큰의 16비트 캐시의 4분의 1을 씁니다; 이어지는 "
                      "16토큰(교사 강제)의 KL을 바이트와 함께 보세요. SmolLM2에서 모든 토큰을 int4로 두면 "
                      "{smol[l11_kl_int4]:.3f} nats/토큰입니다(행마다 fp16 스케일을 두어 {smol[l11_pct_int4]:.1f}%, "
                      "예산을 조금 넘습니다). 토큰의 4분의 1만 16비트로 남기면 몇 배 나쁩니다: snapkv "
                      "{smol[l11_kl_snapkv]:.2f}, streaming {smol[l11_kl_streaming]:.2f}. 그 사이에서 토큰의 "
                      "{smol[l11_keep_int8_snapkv]:.0f}%를 int8로 {smol[l11_kl_int8_snapkv]:.3f}, "
                      "{smol[l11_keep_int4_snapkv]:.0f}%를 int4로 {smol[l11_kl_int4_snapkv]:.3f}, "
                      "그리고 {smol[l11_keep_int4_mixed]:.0f}%를 int4로 두고 버릴 토큰을 int2로 남기면 "
                      "{smol[l11_kl_int4_mixed]:.3f}으로 오히려 나쁩니다: 토큰 단위 int2는 너무 거칩니다(모든 토큰을 int2로 두면 "
                      "무너집니다: {smol[l11_kl_int2]:.1f}). "
                      "적은 비트의 많은 토큰이 16비트의 적은 토큰을 이깁니다(4비트까지): \"More Tokens, Lower "
                      "Precision\"(EMNLP 2025)의 결론과 같습니다. 바늘 그래프(다섯 깊이에 하나씩)는 축출이 무엇을 "
                      "걸고 있는지 묻습니다: 정책은 질문이 오기 전에 남길 것을 고릅니다."),
    "lesson_models11": ("**모델 간 차이:** Gemma 3 270M은 18개 레이어 중 15개를 512토큰 슬라이딩 윈도로 두고, 정책은 그 "
                        "레이어를 그대로 둡니다: {gemma[l11_ctx]}토큰에서는 그 레이어가 모든 토큰을 담으므로 토큰만 줄인 "
                        "16비트(또는 8비트) 후보는 캐시의 4분의 1에 아예 닿지 못합니다(탭이 이유를 보여 줍니다). 들어가는 "
                        "것: 모든 토큰 int4 {gemma[l11_kl_int4]:.2f} ({gemma[l11_pct_int4]:.1f}%), 전체 어텐션 레이어 "
                        "3개에만 snapkv를 쓴 int4(그 레이어 토큰의 {gemma[l11_keep_int4_snapkv]:.0f}%) "
                        "{gemma[l11_kl_int4_snapkv]:.2f}, 나머지를 int2로 남긴 것({gemma[l11_keep_int4_mixed]:.0f}%가 "
                        "int4) {gemma[l11_kl_int4_mixed]:.2f}, 모든 토큰 int2 {gemma[l11_kl_int2]:.1f}. Gemma에서는 int2로 "
                        "남긴 나머지가 도움이 되고(레이어 3개의 버릴 토큰만 건드립니다) SmolLM2에서는 해가 됩니다; 어느 "
                        "쪽이든 예산은 토큰이 아니라 비트에 갑니다. KL은 16토큰에 대한 값이라 몇몇 위치의 비중이 큽니다."),
}

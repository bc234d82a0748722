"""kvviz.ui.strings.compare: the Compare tab: side-by-side generation, its metrics table and charts, the needle test,
in English and Korean.
"""

from __future__ import annotations

EN: dict[str, str] = {
    "compare_intro": (
        "**What you see:** the same model answering the same prompt, once per KV-cache format, side by side. "
        "The unquantized cache is the baseline; the first word where a format's text leaves the baseline is "
        "<mark>highlighted</mark>. KL and top-1 are measured teacher-forced on the baseline's tokens, so they compare "
        "like with like even after the texts part ways. Try k8v4 against k4v8: the same bytes, but K is the "
        "sensitive half."),
    "max_new_tokens": "Max new tokens",
    "with_ppl": "Also measure perplexity on WikiText-2 (adds seconds per format)",
    "metrics": "Metrics per format",
    "needle_intro": ("**Needle in a haystack:** hide a number at several depths of a long context, a few times at "
                     "each depth, and ask for it back through each format's cache. Coarse scales lose it first."),
    "needle_title": "Needle in a haystack: long-context retrieval (lesson 5)",
    "needle_run": "Run needle test",
    "needle_context": "Context length (tokens)",
    "r_baseline": "exact (baseline)",
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
    "h_spec": "spec",
    "h_bits": "bits/value",
    "h_kl_median": "median KL",
    "h_divergence": "first divergence (token)",
    "h_cache_kib": "cache (KiB)",
    "h_vs16": "cache vs 16-bit",
    "h_vs_exact": "cache vs exact ({dtype})",
    "h_tps": "tokens/s",
    "h_ppl": "perplexity",
    "c_top1": "top-1 agreement (%)",
    "c_vs16": "cache vs fp16/bf16 (× bytes)",
    "c_tps": "decode speed (tokens/s)",
    "c_ppl": "perplexity (WikiText-2)",
    "f_metrics": "Quality and cost per format on {model} (baseline: the unquantized cache)",
    "f_needle": "Needle in a haystack at {n} tokens of context, {per} needles per depth ({model})",
    "f_needle_x": "needle depth (% of context)",
    "f_needle_y": "retrieval rate (%)",
    "f_quality_map": "Quality against bytes: mean KL vs bits per value, Pareto frontier dashed ({model})",
    "f_quality_map_x": "stored bits per value (bits, scales included)",
    "f_quality_map_y": "mean KL against the exact cache (nats/token, log)",
    "p_needle": "Hiding {per} needles per depth in {n} tokens of haystack, {formats} formats…",
}

KO: dict[str, str] = {
    "compare_intro": (
        "**보고 있는 것:** 같은 모델이 같은 프롬프트에 답하되, KV 캐시 포맷만 바꿔 나란히 보여줍니다. 양자화하지 않은 "
        "캐시가 기준이며, 각 포맷의 글이 기준에서 처음 갈라지는 단어를 <mark>강조</mark>합니다. KL과 top-1은 기준 토큰으로 "
        "teacher forcing 하여 측정하므로, 글이 갈라진 뒤에도 같은 조건에서 비교됩니다. k8v4와 k4v8을 비교해 보세요: "
        "바이트는 같지만 민감한 쪽은 K입니다."),
    "max_new_tokens": "최대 생성 토큰 수",
    "with_ppl": "WikiText-2 퍼플렉서티도 측정 (포맷마다 몇 초 추가)",
    "metrics": "포맷별 지표",
    "needle_intro": ("**건초더미 속 바늘:** 긴 문맥의 여러 깊이에 숫자를 깊이마다 몇 번씩 숨기고, 각 포맷의 캐시로 다시 "
                     "물어봅니다. 거친 스케일이 먼저 놓칩니다."),
    "needle_title": "건초더미 속 바늘: 긴 문맥에서 찾아내기 (레슨 5)",
    "needle_run": "바늘 테스트 실행",
    "needle_context": "문맥 길이 (토큰)",
    "r_baseline": "원본 (기준)",
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
    "h_spec": "스펙",
    "h_bits": "값당 비트",
    "h_kl_median": "KL 중앙값",
    "h_divergence": "처음 갈라진 곳 (토큰)",
    "h_cache_kib": "캐시 (KiB)",
    "h_vs16": "16비트 대비 캐시",
    "h_vs_exact": "원본({dtype}) 대비 캐시",
    "h_tps": "토큰/초",
    "h_ppl": "퍼플렉서티",
    "c_top1": "top-1 일치율 (%)",
    "c_vs16": "fp16/bf16 대비 캐시 (× 바이트)",
    "c_tps": "디코딩 속도 (토큰/초)",
    "c_ppl": "퍼플렉서티 (WikiText-2)",
    "f_metrics": "{model}의 포맷별 품질과 비용 (기준: 양자화하지 않은 캐시)",
    "f_needle": "문맥 {n}토큰에서 건초더미 속 바늘, 깊이마다 바늘 {per}개 ({model})",
    "f_needle_x": "바늘 깊이 (문맥의 %)",
    "f_needle_y": "찾아낸 비율 (%)",
    "f_quality_map": "품질 대 바이트: 값당 비트에 따른 평균 KL, 점선은 파레토 경계 ({model})",
    "f_quality_map_x": "저장하는 값당 비트 (비트, 스케일 포함)",
    "f_quality_map_y": "원본 캐시 대비 평균 KL (nats/토큰, 로그)",
    "p_needle": "건초더미 {n}토큰에 깊이마다 바늘 {per}개를 숨기는 중, 포맷 {formats}개…",
}

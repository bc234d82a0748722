"""kvviz.ui.strings.long_context: the Long context tab (kvviz/ui/long_context.py, lesson 10), in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
    "tab_long_context": "Long context",
    "lc_intro": (
        "**What you see:** how a format's damage grows with position and with the length of a generation. A long "
        "text is read through each quantized cache chunk by chunk, each chunk attending to the cache as stored (as "
        "engines' chunked prefill does); the first chart plots KL(exact ‖ format) at every position, smoothed, and "
        "marks where each format first crosses a few KL thresholds; the second, how often the format's top token "
        "is the exact cache's. Both update as chunks finish. Below: a free-running generation per format beside "
        "the exact one (first divergence, differing top-1, repetition) and, on request, the needle at longer "
        "contexts. SmolLM2 holds 8,192 positions, Gemma 3 270M 32,768 (its sliding-window layers hold 512 tokens: "
        "beyond that the curve shows what its 3 full-attention layers do)."),
    "lc_source": "Text",
    "lc_src_wikitext": "WikiText-2 (bundled)",
    "lc_src_text": "my text",
    "lc_src_file": "a file",
    "lc_text": "Your text (repeated, with a marker line, when shorter than the context)",
    "lc_text_ph": "Paste a long text here, or pick WikiText-2 or a file above.",
    "lc_file": "Text file (UTF-8)",
    "lc_formats": "Formats (the exact cache always runs)",
    "lc_context": "Context length (tokens)",
    "lc_new_tokens": "New tokens for the generation-length panel",
    "lc_advanced": "Advanced: chunk size, needle at length",
    "lc_chunk": "Chunk size (tokens each prefill step reads)",
    "lc_needle": "Run the needle at length (slow: one prefill per haystack)",
    "lc_needle_contexts": "Needle contexts (tokens, comma-separated)",
    "lc_needle_depths": "Needle depths (% of the context, comma-separated)",
    "lc_run": "Run",
    "lc_gen_title": "Damage by generation length",
    "lc_needle_title": "Needle at length",
    "lc_table": "Per format",
    "lc_gen_table": "Generation per format",
    "lc_h_format": "format",
    "lc_h_mean_kl": "mean KL (nats/token)",
    "lc_h_kl_first": "KL, first quarter",
    "lc_h_kl_last": "KL, last quarter",
    "lc_h_growth": "last ÷ first",
    "lc_h_cross": "crosses KL {x:g} at",
    "lc_h_top1": "top-1 agreement (%)",
    "lc_h_first_div": "first divergence (step)",
    "lc_h_differ": "differing top-1 (%)",
    "lc_h_rep": "repeated 4-grams (%)",
    "lc_h_rep_last": "repeated 4-grams, last half (%)",
    "lc_never": "never",
    "lc_none": "none",
    "lc_exact": "exact",
    "lc_f_kl": "KL(exact ‖ format) by position on {model}: {n} tokens, {w}-token moving average",
    "lc_f_kl_x": "position in the context (tokens)",
    "lc_f_kl_y": "KL (nats/token, smoothed)",
    "lc_f_top1": "Top-1 agreement with the exact cache by position on {model} ({w}-token moving average)",
    "lc_f_top1_y": "top-1 agreement (share of positions)",
    "lc_f_gen": ("Generation on {model}: teacher-forced KL per step ({w}-step moving average); dotted: where each "
                 "format's own text first differs"),
    "lc_f_gen_x": "generated token (step)",
    "lc_f_gen_y": "KL (nats/token, smoothed)",
    "lc_f_needle": "Needle at length on {model}: {per} needles per depth and context",
    "lc_f_needle_x": "needle depth (% of the context)",
    "lc_f_needle_y": "found (%)",
    "lc_f_needle_ctx": "{context:,} tokens",
    "lc_needle_off": "The needle at length is off: tick it under Advanced to run it.",
    "lc_gen_off": "Running the generation after the chunked pass…",
    "lc_p_chunk": "`{model}`: {done:,} of {n:,} tokens through the exact cache and {formats} formats ({s:.1f} s)…",
    "lc_p_start": ("`{model}`: reading {n:,} tokens in chunks of {chunk:,} through the exact cache and {formats} "
                   "formats…"),
    "lc_p_gen": "`{model}`: generating {n} tokens per format beside the exact cache ({done} so far)…",
    "lc_p_needle": "`{model}`: the needle at {contexts} tokens ({per} needles per depth)…",
    "lc_r_done": ("Done in {s:.1f} s on `{model}`: {n:,} tokens, chunks of {chunk:,}; the first results came after "
                  "{first:.1f} s."),
    "lc_r_pos": ("**By position** ({n:,} tokens): mean KL over the last quarter against the first: {growth}. "
                 "First crossings of KL {x:g} (smoothed): {cross}."),
    "lc_r_gen": ("**By generation length** ({n} new tokens after a {p}-token prompt): first divergence from the exact "
                 "text: {div}."),
    "lc_r_needle": "**Needle at length**: {found}.",
    "lc_r_repeats": "The text is shorter than the context: it repeats, a marker line between copies.",
    "lc_r_sliding": ("The sliding-window layers hold 512 tokens: beyond that the curve shows what the "
                     "full-attention layers do."),
}

KO: dict[str, str] = {
    "tab_long_context": "긴 문맥",
    "lc_intro": (
        "**보고 있는 것:** 포맷의 손상이 위치와 생성 길이에 따라 어떻게 커지는지. 긴 글을 양자화된 캐시마다 청크 단위로 "
        "읽고, 각 청크는 저장된 그대로의 캐시를 봅니다(엔진의 청크 프리필과 같습니다). 첫 그래프는 위치마다 "
        "KL(원본 ‖ 포맷)을 이동 평균으로 그리고, 각 포맷이 몇 가지 KL 문턱을 처음 넘는 곳을 표시합니다. 둘째 그래프는 "
        "포맷의 1순위 토큰이 원본 캐시와 같은 비율입니다. 두 그래프는 청크가 끝날 때마다 갱신됩니다. 아래에는 포맷마다 "
        "원본과 나란히 자유 생성한 결과(처음 갈라지는 곳, 1순위가 다른 비율, 반복)와, 원하면 더 긴 문맥에서의 바늘 "
        "찾기가 있습니다. SmolLM2는 8,192개, Gemma 3 270M은 32,768개 위치를 가집니다(슬라이딩 윈도 레이어는 512토큰만 "
        "담으므로, 그 뒤의 곡선은 전체 어텐션 레이어 3개가 하는 일을 보여 줍니다)."),
    "lc_source": "글",
    "lc_src_wikitext": "WikiText-2 (내장)",
    "lc_src_text": "내 글",
    "lc_src_file": "파일",
    "lc_text": "내 글 (문맥보다 짧으면 표시 줄을 넣어 반복합니다)",
    "lc_text_ph": "긴 글을 붙여 넣거나, 위에서 WikiText-2나 파일을 고르세요.",
    "lc_file": "텍스트 파일 (UTF-8)",
    "lc_formats": "포맷 (원본 캐시는 항상 실행됩니다)",
    "lc_context": "문맥 길이 (토큰)",
    "lc_new_tokens": "생성 길이 패널에서 새로 만들 토큰 수",
    "lc_advanced": "고급: 청크 크기, 긴 문맥의 바늘 찾기",
    "lc_chunk": "청크 크기 (프리필 한 단계가 읽는 토큰 수)",
    "lc_needle": "긴 문맥의 바늘 찾기 실행 (느림: 건초 더미마다 프리필 한 번)",
    "lc_needle_contexts": "바늘 찾기 문맥 길이 (토큰, 쉼표로 구분)",
    "lc_needle_depths": "바늘 깊이 (문맥의 %, 쉼표로 구분)",
    "lc_run": "실행",
    "lc_gen_title": "생성 길이에 따른 손상",
    "lc_needle_title": "긴 문맥의 바늘 찾기",
    "lc_table": "포맷별 결과",
    "lc_gen_table": "포맷별 생성 결과",
    "lc_h_format": "포맷",
    "lc_h_mean_kl": "평균 KL (nats/토큰)",
    "lc_h_kl_first": "처음 4분의 1의 KL",
    "lc_h_kl_last": "마지막 4분의 1의 KL",
    "lc_h_growth": "마지막 ÷ 처음",
    "lc_h_cross": "KL {x:g}을 넘는 위치",
    "lc_h_top1": "top-1 일치율 (%)",
    "lc_h_first_div": "처음 갈라지는 단계",
    "lc_h_differ": "top-1이 다른 비율 (%)",
    "lc_h_rep": "반복된 4-gram (%)",
    "lc_h_rep_last": "뒤쪽 절반의 반복된 4-gram (%)",
    "lc_never": "넘지 않음",
    "lc_none": "없음",
    "lc_exact": "원본",
    "lc_f_kl": "{model}의 위치별 KL(원본 ‖ 포맷): {n}토큰, {w}토큰 이동 평균",
    "lc_f_kl_x": "문맥 안의 위치 (토큰)",
    "lc_f_kl_y": "KL (nats/토큰, 이동 평균)",
    "lc_f_top1": "{model}의 위치별 원본 캐시와의 top-1 일치율 ({w}토큰 이동 평균)",
    "lc_f_top1_y": "top-1 일치율 (위치 비율)",
    "lc_f_gen": "{model}의 생성: 단계별 교사 강요 KL ({w}단계 이동 평균); 점선: 각 포맷의 글이 처음 갈라지는 곳",
    "lc_f_gen_x": "생성된 토큰 (단계)",
    "lc_f_gen_y": "KL (nats/토큰, 이동 평균)",
    "lc_f_needle": "{model}의 긴 문맥 바늘 찾기: 깊이와 문맥마다 바늘 {per}개",
    "lc_f_needle_x": "바늘 깊이 (문맥의 %)",
    "lc_f_needle_y": "찾은 비율 (%)",
    "lc_f_needle_ctx": "{context:,}토큰",
    "lc_needle_off": "긴 문맥의 바늘 찾기는 꺼져 있습니다: 고급에서 켜면 실행됩니다.",
    "lc_gen_off": "청크 단위 읽기가 끝나면 생성을 실행합니다…",
    "lc_p_chunk": "`{model}`: 원본 캐시와 포맷 {formats}개로 {n:,}토큰 중 {done:,}토큰 ({s:.1f}초)…",
    "lc_p_start": "`{model}`: 원본 캐시와 포맷 {formats}개로 {n:,}토큰을 {chunk:,}토큰 청크로 읽는 중…",
    "lc_p_gen": "`{model}`: 포맷마다 원본 캐시와 나란히 {n}토큰 생성 중 (지금까지 {done})…",
    "lc_p_needle": "`{model}`: {contexts}토큰에서 바늘 찾기 (깊이마다 바늘 {per}개)…",
    "lc_r_done": ("`{model}`에서 {s:.1f}초 만에 완료: {n:,}토큰, {chunk:,}토큰 청크; 첫 결과는 {first:.1f}초 뒤에 "
                  "나왔습니다."),
    "lc_r_pos": ("**위치별** ({n:,}토큰): 마지막 4분의 1과 처음 4분의 1의 평균 KL 비: {growth}. KL {x:g}(이동 평균)을 "
                 "처음 넘는 위치: {cross}."),
    "lc_r_gen": "**생성 길이별** ({p}토큰 프롬프트 뒤 새 토큰 {n}개): 원본 글에서 처음 갈라지는 단계: {div}.",
    "lc_r_needle": "**긴 문맥의 바늘 찾기**: {found}.",
    "lc_r_repeats": "글이 문맥보다 짧아 복사본 사이에 표시 줄을 넣어 반복했습니다.",
    "lc_r_sliding": "슬라이딩 윈도 레이어는 512토큰만 담습니다: 그 뒤의 곡선은 전체 어텐션 레이어가 하는 일입니다.",
}

"""kvviz.ui.strings.equal_bytes: the Equal bytes tab (drop tokens, drop bits, or both), in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
    "tab_equal_bytes": "Equal bytes",
    "eb_intro": (
        "**What you see:** every way to spend one KV-cache budget. Pick the bytes (a share of the 16-bit cache) and "
        "each candidate is fitted to them: fewer bits on every token (int4, int2), 16 bits on fewer tokens (each "
        "eviction policy keeps what fits), fewer bits and fewer tokens, or the tokens a policy would drop kept in "
        "int2 (mixed precision). Each is measured on the same context: its bytes read from its cache, its KL "
        "against the exact run on the continuation, and the needle at five depths, where eviction fails: the "
        "policy compresses the context, not the question."),
    "eb_budget": "Budget (% of the 16-bit cache)",
    "eb_context": "Context (tokens of WikiText-2; the needle's haystack too)",
    "eb_continuation": "Continuation (tokens read teacher-forced for the KL)",
    "eb_policies": "Eviction policies (16 bits, fewer tokens)",
    "eb_combine": "Policy for int8/int4 with eviction and mixed precision",
    "eb_window": "SnapKV window (last context queries that score the keys)",
    "eb_custom": "More candidates (specs, one per line; e.g. int4 @ knorm:0.5)",
    "eb_needles": "Needles per depth (0: no needle)",
    "eb_run": "Spend the budget",
    "eb_table": "Every candidate",
    "eb_headers": "spec|how|tokens kept (%)|bytes (KiB, measured)|% of 16-bit|KL (nats/token)|needles found",
    "eb_kind_bits": "fewer bits",
    "eb_kind_tokens": "fewer tokens",
    "eb_kind_both": "both",
    "eb_kind_mixed": "mixed precision",
    "eb_chart": "{model}: quality against bytes at a {budget:g}% budget ({n:,}-token context)",
    "eb_chart_x": "KV cache bytes (% of a 16-bit cache, measured)",
    "eb_chart_y": "mean KL against the exact run (nats/token, log)",
    "eb_chart_needle": "needles found (% of all)",
    "eb_budget_line": "budget",
    "eb_map": "Where the bits go: each context token's stored bits ({model})",
    "eb_map_x": "context token (position)",
    "eb_map_y": "candidate (spec)",
    "eb_map_z": "bits per value (bits, 0: dropped)",
    "eb_progress": "Measuring {spec} ({i} of {n})…",
    "eb_progress_needle": "The needle: {per} per depth at 5 depths, {n} candidates…",
    "eb_status_running": "Measured {i} of {n} candidates on `{model}`; the needle runs after the last.",
    "eb_status": ("Done in {s:.1f} s on `{model}`: {n} candidates at {budget:g}% of the 16-bit cache "
                  "({target} KiB of {full} KiB at {ctx:,} tokens). The exact cache found {exact} of {needles} "
                  "needles."),
    "eb_status_no_needle": ("Done in {s:.1f} s on `{model}`: {n} candidates at {budget:g}% of the 16-bit cache "
                            "({target} KiB of {full} KiB at {ctx:,} tokens)."),
    "eb_best": "Lowest KL within the budget: `{spec}` ({kl:.3g} nats/token).",
    "eb_over": "Over the budget (their bytes are what they are with every token kept): {specs}.",
    "eb_left": "No keep ratio fits the budget for:",
    "eb_sliding": ("{model}: {sliding} of its {layers} layers are sliding-window layers ({window:,} tokens): they "
                   "already drop what leaves their window, and the policies leave them as they are; the policies "
                   "compress its {full} full-attention layers."),
    "eb_no_map": "(this cache does not say which tokens its policy kept)",
}

KO: dict[str, str] = {
    "tab_equal_bytes": "같은 바이트",
    "eb_intro": (
        "**보고 있는 것:** KV 캐시 예산 하나를 쓰는 모든 방법. 바이트(16비트 캐시 대비 비율)를 고르면 후보마다 그 "
        "바이트에 맞춥니다: 모든 토큰을 더 적은 비트로(int4, int2), 더 적은 토큰을 16비트로(축출 정책마다 들어가는 "
        "만큼 남김), 비트와 토큰을 함께 줄이기, 또는 정책이 버릴 토큰을 int2로 남기기(혼합 정밀도). 모두 같은 "
        "문맥에서 잽니다: 캐시에서 읽은 바이트, 이어지는 토큰에서 원본 실행과의 KL, 그리고 다섯 깊이의 바늘. 바늘은 "
        "축출이 실패하는 곳입니다: 정책은 문맥을 압축하고 질문은 압축하지 않습니다."),
    "eb_budget": "예산 (16비트 캐시 대비 %)",
    "eb_context": "문맥 (WikiText-2 토큰 수; 바늘의 건초더미도 같은 길이)",
    "eb_continuation": "이어지는 토큰 (KL을 위해 교사 강제로 읽는 수)",
    "eb_policies": "축출 정책 (16비트, 더 적은 토큰)",
    "eb_combine": "축출을 함께 쓰는 int8/int4와 혼합 정밀도의 정책",
    "eb_window": "SnapKV 윈도 (키에 점수를 매기는 마지막 문맥 쿼리 수)",
    "eb_custom": "후보 더 넣기 (한 줄에 스펙 하나; 예: int4 @ knorm:0.5)",
    "eb_needles": "깊이당 바늘 수 (0: 바늘 없음)",
    "eb_run": "예산 쓰기",
    "eb_table": "모든 후보",
    "eb_headers": "스펙|방법|남긴 토큰 (%)|바이트 (KiB, 측정)|16비트 대비 %|KL (nats/토큰)|찾은 바늘",
    "eb_kind_bits": "비트 줄이기",
    "eb_kind_tokens": "토큰 줄이기",
    "eb_kind_both": "둘 다",
    "eb_kind_mixed": "혼합 정밀도",
    "eb_chart": "{model}: 예산 {budget:g}%에서 바이트 대비 품질 (문맥 {n:,}토큰)",
    "eb_chart_x": "KV 캐시 바이트 (16비트 캐시 대비 %, 측정)",
    "eb_chart_y": "원본 실행 대비 평균 KL (nats/토큰, 로그)",
    "eb_chart_needle": "찾은 바늘 (전체 대비 %)",
    "eb_budget_line": "예산",
    "eb_map": "비트가 가는 곳: 문맥 토큰마다 저장된 비트 ({model})",
    "eb_map_x": "문맥 토큰 (위치)",
    "eb_map_y": "후보 (스펙)",
    "eb_map_z": "값당 비트 (비트, 0: 버림)",
    "eb_progress": "{spec} 측정 중 ({n}개 중 {i}번째)…",
    "eb_progress_needle": "바늘: 다섯 깊이에 깊이당 {per}개, 후보 {n}개…",
    "eb_status_running": "`{model}`에서 후보 {n}개 중 {i}개를 쟀습니다; 바늘은 마지막 후보 뒤에 돕니다.",
    "eb_status": ("`{model}`에서 {s:.1f}초 만에 완료: 16비트 캐시의 {budget:g}%에서 후보 {n}개 (문맥 {ctx:,}토큰에서 "
                  "{full} KiB 중 {target} KiB). 원본 캐시는 바늘 {needles}개 중 {exact}개를 찾았습니다."),
    "eb_status_no_needle": ("`{model}`에서 {s:.1f}초 만에 완료: 16비트 캐시의 {budget:g}%에서 후보 {n}개 (문맥 "
                            "{ctx:,}토큰에서 {full} KiB 중 {target} KiB)."),
    "eb_best": "예산 안에서 KL이 가장 낮은 후보: `{spec}` ({kl:.3g} nats/토큰).",
    "eb_over": "예산을 넘는 후보 (모든 토큰을 남기면 바이트가 그만큼입니다): {specs}.",
    "eb_left": "예산에 맞는 남김 비율이 없는 후보:",
    "eb_sliding": ("{model}: {layers}개 레이어 중 {sliding}개가 슬라이딩 윈도 레이어({window:,}토큰)입니다: 윈도를 "
                   "벗어난 토큰은 이미 버리므로 정책은 그 레이어를 그대로 둡니다; 정책은 전체 어텐션 레이어 "
                   "{full}개를 압축합니다."),
    "eb_no_map": "(이 캐시는 정책이 남긴 토큰을 알려 주지 않습니다)",
}

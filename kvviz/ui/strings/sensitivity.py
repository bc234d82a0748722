"""kvviz.ui.strings.sensitivity: the Sensitivity tab and its plan search, in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
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
    "plan_fig_x": "KV cache at {context:,} tokens (MiB)",
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
    "p_sens": "Measuring {rows} one-layer variants of {spec} on up to {n} tokens, as one batch…",
    "p_sens_norms": "Measuring K/V magnitudes per layer…",
    "p_plan": "Ranking layers for {cands}, then measuring every plan on the path (up to {n} tokens)…",
}

KO: dict[str, str] = {
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
    "plan_fig_x": "{context:,}토큰에서 KV 캐시 (MiB)",
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
    "p_sens": "{spec}의 한 레이어 변형 {rows}개를 최대 {n}토큰에서 한 배치로 측정하는 중…",
    "p_sens_norms": "레이어별 K/V 크기를 재는 중…",
    "p_plan": "{cands}로 레이어 순위를 매기고, 경로의 모든 계획을 측정하는 중 (최대 {n}토큰)…",
}

"""kvviz.ui.strings.errors: the Quantization error tab and its format anatomy, in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
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
    "r_where_short": "layer {layer}, KV head {head}, {model}",
    "f_error_heat": "|{side} − {side}̂| for {fmt} ({which}, {where})",
    "f_layer_errors": "Relative error per layer on {model} (K post-RoPE solid, V dashed)",
    "f_rel_error": "relative error (‖x - x̂‖ / ‖x‖)",
    "r_no_scales": "({base} has no scales; showing int4)",
    "f_granularity": "{base}: one scale per token, per channel, per tensor ({which}, {where})",
    "f_gran_sub": "rel. error {err:.3g} · {bits:g} bits/value",
    "r_errors_head": "Mean over layers, on this prompt's {n} tokens (`{model}`):",
    "r_errors_table": "| format | K rel. error | V rel. error | attention-output rel. error | bits/value |",
    "r_errors_note": ("The attention-output error is what the next layer sees: quantized K and V, the prompt's own "
                      "queries."),
    "which_keys_post": "K (post-RoPE)",
    "which_keys_pre": "K (pre-RoPE)",
    "which_values": "V",
    "p_errors": "Quantizing every layer in every format…",
}

KO: dict[str, str] = {
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
    "r_where_short": "레이어 {layer}, KV 헤드 {head}, {model}",
    "f_error_heat": "{fmt}의 |{side} − {side}̂| ({which}, {where})",
    "f_layer_errors": "{model}의 레이어별 상대 오차 (RoPE 이후 K 실선, V 점선)",
    "f_rel_error": "상대 오차 (‖x - x̂‖ / ‖x‖)",
    "r_no_scales": "({base}에는 스케일이 없어 int4를 보여줍니다)",
    "f_granularity": "{base}: 토큰별, 채널별, 텐서별 스케일 하나 ({which}, {where})",
    "f_gran_sub": "상대 오차 {err:.3g} · 값당 {bits:g}비트",
    "r_errors_head": "이 프롬프트의 토큰 {n}개에서 레이어 평균 (`{model}`):",
    "r_errors_table": "| 포맷 | K 상대 오차 | V 상대 오차 | 어텐션 출력 상대 오차 | 값당 비트 |",
    "r_errors_note": "어텐션 출력 오차는 다음 레이어가 보는 것입니다: 양자화된 K와 V, 그리고 프롬프트 자신의 쿼리.",
    "which_keys_post": "K (RoPE 이후)",
    "which_keys_pre": "K (RoPE 이전)",
    "which_values": "V (값)",
    "p_errors": "모든 레이어를 모든 포맷으로 양자화하는 중…",
}

"""kvviz.ui.strings.rotation: Compare's rotate-then-quantize view (kvviz/ui/rotation.py, lesson 9), in English and
Korean.
"""

from __future__ import annotations

EN: dict[str, str] = {
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
    "p_rotation": "{formats} formats and the exact model on {n} WikiText-2 tokens, as one batch…",
    "p_rotation_capture": "Capturing K to draw its coordinates before and after the rotation…",
}

KO: dict[str, str] = {
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
    "p_rotation": "포맷 {formats}개와 원본 모델을 WikiText-2 {n}토큰에서 한 배치로 측정하는 중…",
    "p_rotation_capture": "회전 전후의 좌표를 그리려고 K를 수집하는 중…",
}

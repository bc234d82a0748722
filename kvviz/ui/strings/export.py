"""kvviz.ui.strings.export: the Export tab, in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
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
    "p_calibrate": "Calibrating per-layer scales on {n} prompt(s)…",
}

KO: dict[str, str] = {
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
    "p_calibrate": "프롬프트 {n}개로 레이어별 스케일을 보정하는 중…",
}

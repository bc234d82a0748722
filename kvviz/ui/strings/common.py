"""kvviz.ui.strings.common: strings shared by several tabs and the page around them: title, language, header, lesson
buttons' tab names, common inputs, in English and Korean.
"""

from __future__ import annotations

EN: dict[str, str] = {
    "title": "# kvviz: KV-cache quantization playground",
    "subtitle": ("Quantize a real language model's KV cache and see what it does: to the keys and values themselves, "
                 "to memory, and to the text the model writes. Pick a lesson below or open a tab."),
    "language": "Language",
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
    "specs": "Formats to compare (the unquantized baseline always runs)",
    "custom_specs": "More formats (custom)",
    "custom_specs_info": ("One K/V spec per line, e.g. k=int8,v=int4 or fp8_e5m2 or int4/channel/g32/asym, or a "
                          "per-layer plan such as int4; 0,27=fp16"),
    "outputs": "Generated text (first divergence from the baseline highlighted)",
    "layers": "Layers",
    "kv_heads": "KV heads",
    "head_dim": "Head dim",
    "model_info_any": "Pick a listed model, or type any Hugging Face hub id (owner/name); its size is checked first",
    "r_none": "none",
    "r_skipped": "**Skipped** (this model's shape cannot hold them):",
    "h_format": "format",
    "h_kl": "mean KL (nats/token)",
    "h_kl_p99": "p99 KL",
    "h_top1": "top-1 agreement (%)",
    "c_kl": "mean KL (nats/token)",
    "f_format_axis": "format (K/V spec)",
}

KO: dict[str, str] = {
    "title": "# kvviz: KV 캐시 양자화 실습장",
    "subtitle": ("실제 언어 모델의 KV 캐시를 양자화하고, 그 결과가 키와 값, 메모리, 그리고 모델이 쓰는 글에 어떤 영향을 "
                 "주는지 직접 확인하세요. 아래 레슨을 고르거나 탭을 여세요."),
    "language": "언어",
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
    "specs": "비교할 포맷 (양자화하지 않은 기준은 항상 실행)",
    "custom_specs": "추가 포맷 (직접 입력)",
    "custom_specs_info": ("한 줄에 K/V 스펙 하나, 예: k=int8,v=int4 또는 fp8_e5m2 또는 int4/channel/g32/asym, 또는 "
                          "int4; 0,27=fp16 같은 레이어별 계획"),
    "outputs": "생성된 글 (기준과 처음 갈라지는 곳 강조)",
    "layers": "레이어 수",
    "kv_heads": "KV 헤드 수",
    "head_dim": "헤드 차원",
    "model_info_any": "목록의 모델을 고르거나 Hugging Face 허브 id(owner/name)를 직접 입력하세요; 크기를 먼저 확인합니다",
    "r_none": "없음",
    "r_skipped": "**건너뜀** (이 모델의 형태로는 담을 수 없음):",
    "h_format": "포맷",
    "h_kl": "평균 KL (nats/토큰)",
    "h_kl_p99": "KL 99백분위",
    "h_top1": "top-1 일치율 (%)",
    "c_kl": "평균 KL (nats/토큰)",
    "f_format_axis": "포맷 (K/V 스펙)",
}

"""kvviz.ui.strings.outliers: the K outliers tab, in English and Korean."""

from __future__ import annotations

EN: dict[str, str] = {
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
    "r_outlier_count": "the strongest {shown} of {total}",
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
}

KO: dict[str, str] = {
    "outliers_intro": (
        "**보고 있는 것:** 한 레이어, 한 KV 헤드에서 프롬프트 전체에 걸쳐 키(K)와 값(V)의 각 채널이 도달하는 최대 |값|. "
        "RoPE 이후 몇몇 K 채널은 나머지의 몇 배에 이르는 크기를 가지지만, V에는 그런 채널이 없습니다. 아다마르(Hadamard) "
        "회전은 채널을 섞어 이상치를 고르게 퍼뜨립니다."),
    "outliers_why": (
        "**왜 중요한가.** 텐서 전체가 스케일 하나를 공유하면 그 스케일이 이상치 채널에 맞춰 늘어나, 나머지 채널에는 "
        "몇 개의 레벨만 남습니다. 채널마다 스케일을 두면(KIVI의 채널 단위 K) 이상치 채널도 제 범위를 가지며, 아다마르 "
        "회전은 양자화 전에 이상치를 평평하게 만듭니다. V에는 이상치 채널이 없고 토큰에 대한 가중 평균으로 읽혀 오차가 "
        "일부 상쇄되므로, 토큰마다 스케일 하나(head_dim 방향)면 충분합니다."),
    "r_outlier_count": "{total}개 중 가장 큰 {shown}개",
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
}

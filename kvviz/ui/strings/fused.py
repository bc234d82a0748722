"""kvviz.ui.strings.fused: Compare's fused against unfused decode (kvviz/ui/fused.py, lesson 7), in English and Korean.
"""

from __future__ import annotations

EN: dict[str, str] = {
    "fused_title": "Fused against unfused decode: tokens/s and bytes read per step (lesson 7)",
    "fused_intro": ("**What you see:** the same greedy decode after a WikiText-2 prompt, through the two exact "
                    "caches and through each format twice, on this machine, now. *DynamicCache* appends each token "
                    "with a copy of the whole history (torch.cat); *StaticCache* is preallocated and written in "
                    "place, the faster exact baseline. *Fused*: the attention "
                    "kernel reads the packed codes and scales in place (on the CPU kvviz's numba kernel, on a GPU "
                    "Triton's). *Unfused*: the reference dequantizes the whole history to full precision at every "
                    "step, then runs SDPA on the copy. *Bytes read per step* counts K/V at the last step: the exact "
                    "cache's values; fused, the packed bytes; unfused, the packed bytes plus the full-precision copy "
                    "written and read again (2x the exact cache; the reference's other temporaries are not counted). "
                    "Every run starts from the same prefill and times its steps one by one, in two rounds; each run's median "
                    "step is kept (a busy moment slows a few steps, not the figure)."),
    "fused_specs": "Formats (each decodes twice: fused and unfused)",
    "fused_context": "Prompt tokens (WikiText-2)",
    "fused_new": "Decode tokens timed",
    "fused_run": "Time fused against unfused",
    "fused_table": "tokens/s and K/V bytes read per decode step, per cache and decode path",
    "fused_h_format": "cache",
    "fused_h_path": "decode path",
    "fused_h_tps": "tokens/s",
    "fused_h_vs": "× DynamicCache",
    "fused_h_vs_static": "× StaticCache",
    "fused_h_mib": "read per step (MiB)",
    "fused_c_tps": "decode speed (tokens/s)",
    "fused_c_mib": "K/V read per step (MiB)",
    "fused_fig": "Fused against unfused decode on {model}, {n}-token prompt",
    "fused_fig_x": "cache · decode path",
    "fused_fused": "fused",
    "fused_unfused": "unfused",
    "fused_path_exact": "exact: SDPA over the model-dtype K/V",
    "fused_path_fused": "fused: the {backend} kernel reads the packed bytes",
    "fused_path_unfused": "unfused: dequantize the history, then SDPA",
    "fused_path_fallback": "NOT fused: the reference ran ({why})",
    "fused_why_unavailable": "the fused path does not run here",
    "fused_why_no_branch": "no fused branch for this format",
    "fused_why_lossless": "a lossless cast: the reference reads DynamicCache's very values",
    "fused_done": ("Done in {s:.0f} s. `{model}`: a {n}-token WikiText-2 prompt, then greedy decode, median step of "
                   "{rounds} rounds x {steps} timed steps; fused backend `{backend}`."),
    "fused_cut": "The prompt was cut from {asked} to {n} tokens to fit this model's positions.",
    "fused_same": "Fused and unfused generated the same {n} tokens for {formats}.",
    "fused_differ": ("**Fused and unfused generated different tokens** for {formats}: the kernel sums in float32 in "
                     "another order than SDPA, and a near-tie between two tokens can flip."),
    "fused_unavailable": ("**The fused path does not run here** (backend `{backend}`: numba missing or failed to "
                          "compile, or no GPU for Triton), so the rows marked NOT fused were decoded by the unfused "
                          "reference: they are not a measurement of fused decode. Install numba (`pip install "
                          "numba`) and restart the app."),
    "fused_no_branch": "{formats}: the fused path has no branch for this format, so its \"fused\" row ran the reference.",
    "fused_lossless": ("{formats}: a lossless cast of the model's own dtype, so its \"fused\" row ran the reference, "
                       "which hands attention DynamicCache's very values."),
    "fused_ctx_fig": "Decode speed against context on {model}: where the smaller cache overtakes the exact one",
    "fused_ctx_x": "context (tokens)",
    "fused_ctx_recorded": ("**Speed against context** (the curves): a decode step reads the weights and the whole "
                           "cache, so the exact cache slows as the context grows while a 4-bit cache reads about a "
                           "seventh of its bytes; the dashed lines are each format's ceiling, StaticCache's speed "
                           "times (weights + the exact K/V bytes) / (weights + the format's bytes), what the format "
                           "would reach if it cost nothing beyond its bytes. DynamicCache falls further behind: it "
                           "copies its whole history at every step. Lines: recorded with `{command}` on "
                           "{machine}, {date}. Diamonds: this run, on this machine now."),
    "fused_ctx_none": ("**Speed against context**: no recorded run for `{model}` (only the bundled models have one; "
                       "make one with `python -m kvviz bench --contexts 1024,2048,4096,8192 --model ...`). The "
                       "diamonds are this run."),
    "p_fused": "Prefill {n} tokens, then {runs} decode runs x {rounds} rounds…",
}

KO: dict[str, str] = {
    "fused_title": "융합 대 비융합 디코딩: tokens/s와 단계당 읽는 바이트 (레슨 7)",
    "fused_intro": ("**보고 있는 것:** WikiText-2 프롬프트 뒤의 같은 greedy 디코딩을 두 원본 캐시로, 그리고 "
                    "포맷마다 두 번, 지금 이 컴퓨터에서 돌린 결과입니다. *DynamicCache*는 토큰마다 기록 전체를 "
                    "복사해 이어 붙이고(torch.cat), *StaticCache*는 미리 할당한 자리에 그대로 써서 더 빠른 원본 "
                    "기준입니다. *융합*: 어텐션 커널이 패킹된 코드와 스케일을 "
                    "그 자리에서 읽습니다 (CPU에서는 kvviz의 numba 커널, GPU에서는 Triton 커널). *비융합*: 참조 구현이 "
                    "매 단계 기록 전체를 전체 정밀도로 역양자화한 뒤 그 복사본으로 SDPA를 돌립니다. *단계당 읽는 "
                    "바이트*는 마지막 단계의 K/V를 셉니다: 원본 캐시는 그 값, 융합은 패킹된 바이트, 비융합은 패킹된 "
                    "바이트에 전체 정밀도 복사본을 쓰고 다시 읽는 양(원본 캐시의 2배; 참조 구현의 다른 임시 텐서는 "
                    "세지 않음)을 더합니다. 모든 실행은 같은 프리필에서 시작해 두 라운드 동안 "
                    "단계마다 시간을 재고, 각 실행의 중앙값 단계를 남깁니다(바쁜 순간은 몇 단계만 늦출 뿐 값을 바꾸지 않습니다)."),
    "fused_specs": "포맷 (각각 융합과 비융합으로 두 번 디코딩)",
    "fused_context": "프롬프트 토큰 수 (WikiText-2)",
    "fused_new": "시간을 재는 디코딩 토큰 수",
    "fused_run": "융합 대 비융합 시간 재기",
    "fused_table": "캐시와 디코딩 경로별 tokens/s와 디코딩 단계당 읽는 K/V 바이트",
    "fused_h_format": "캐시",
    "fused_h_path": "디코딩 경로",
    "fused_h_tps": "토큰/초",
    "fused_h_vs": "DynamicCache 대비 ×",
    "fused_h_vs_static": "StaticCache 대비 ×",
    "fused_h_mib": "단계당 읽기 (MiB)",
    "fused_c_tps": "디코딩 속도 (tokens/s)",
    "fused_c_mib": "단계당 읽는 K/V (MiB)",
    "fused_fig": "{model}의 융합 대 비융합 디코딩, 프롬프트 {n}토큰",
    "fused_fig_x": "캐시 · 디코딩 경로",
    "fused_fused": "융합",
    "fused_unfused": "비융합",
    "fused_path_exact": "원본: 모델 dtype K/V에 SDPA",
    "fused_path_fused": "융합: {backend} 커널이 패킹된 바이트를 읽음",
    "fused_path_unfused": "비융합: 기록을 역양자화한 뒤 SDPA",
    "fused_path_fallback": "융합 아님: 참조 구현이 실행됨 ({why})",
    "fused_why_unavailable": "이 컴퓨터에서 융합 경로가 돌지 않음",
    "fused_why_no_branch": "이 포맷의 융합 분기가 없음",
    "fused_why_lossless": "무손실 캐스트: 레퍼런스가 DynamicCache와 똑같은 값을 읽음",
    "fused_done": ("{s:.0f}초 만에 끝남. `{model}`: WikiText-2 프롬프트 {n}토큰 뒤 greedy 디코딩, {rounds}라운드 x "
                   "{steps}단계 측정의 중앙값; 융합 백엔드 `{backend}`."),
    "fused_cut": "이 모델의 위치 수에 맞추려고 프롬프트를 {asked}토큰에서 {n}토큰으로 잘랐습니다.",
    "fused_same": "융합과 비융합이 {formats}에서 같은 {n}개 토큰을 생성했습니다.",
    "fused_differ": ("**융합과 비융합이 다른 토큰을 생성했습니다**: {formats}. 커널은 SDPA와 다른 순서로 float32 합을 "
                     "구하므로, 두 토큰이 거의 동점이면 뒤바뀔 수 있습니다."),
    "fused_unavailable": ("**이 컴퓨터에서는 융합 경로가 돌지 않습니다** (백엔드 `{backend}`: numba가 없거나 컴파일에 "
                          "실패, 또는 Triton용 GPU 없음). 그래서 '융합 아님'으로 표시된 행은 비융합 참조 구현으로 "
                          "디코딩했으며, 융합 디코딩의 측정값이 아닙니다. numba를 설치(`pip install numba`)하고 앱을 "
                          "다시 시작하세요."),
    "fused_no_branch": "{formats}: 융합 경로에 이 포맷의 분기가 없어서 '융합' 행도 참조 구현으로 돌았습니다.",
    "fused_lossless": ("{formats}: 모델 자신의 dtype으로의 무손실 변환이라 '융합' 행도 참조 구현으로 돌았습니다. 참조 "
                       "구현은 어텐션에 DynamicCache와 똑같은 값을 넘깁니다."),
    "fused_ctx_fig": "{model}의 컨텍스트에 따른 디코딩 속도: 작은 캐시가 원본 캐시를 앞지르는 지점",
    "fused_ctx_x": "컨텍스트 (토큰)",
    "fused_ctx_recorded": ("**컨텍스트에 따른 속도** (곡선): 디코딩 한 단계는 가중치와 캐시 전체를 읽으므로, 컨텍스트가 "
                           "길어질수록 원본 캐시는 느려지고 4비트 캐시는 그 바이트의 약 7분의 1만 읽습니다. 점선은 "
                           "포맷마다의 한계로, StaticCache 속도 × (가중치 + 원본 K/V 바이트) / (가중치 + 포맷의 바이트), "
                           "즉 바이트 말고는 비용이 없을 때 닿을 속도입니다. DynamicCache는 매 단계 기록 전체를 "
                           "복사하므로 더 뒤처집니다. 곡선: `{command}`로 {machine}에서 "
                           "{date}에 기록. 마름모: 지금 이 컴퓨터에서 돌린 이번 실행."),
    "fused_ctx_none": ("**컨텍스트에 따른 속도**: `{model}`의 기록이 없습니다 (번들 모델만 있음; "
                       "`python -m kvviz bench --contexts 1024,2048,4096,8192 --model ...`로 만들 수 있음). "
                       "마름모는 이번 실행입니다."),
    "p_fused": "{n}토큰 프리필, 이어서 디코딩 {runs}회 × {rounds}라운드…",
}

"""Quality metrics of a KV format against the exact model: KL divergence, top-1 agreement, NLL / perplexity and
llama.cpp's KLD statistics. Pure torch functions (tensors in, tensors or floats out), one implementation of each;
every caller in kvviz (Compare, the teacher-forced rows, sensitivity, `quality.kld`, perplexity, the engines)
computes its numbers here.

Conventions: P is the baseline's (exact) distribution, Q the candidate's; KL(P || Q) = sum_i P_i (ln P_i - ln Q_i)
in nats, 0 ln 0 = 0 (a token the baseline gives no mass contributes nothing). Log-probs are float64; logits may be
in any float dtype.

llama.cpp's statistics follow tools/perplexity/perplexity.cpp (`kl_divergence`, `log_softmax(..., kld)`):

- per position t, with y_t the correct next token: KLD_t = KL(P_t || Q_t); dp_t = Q(y_t) - P(y_t);
  same_t = argmax P == argmax Q; nll_t = -ln Q(y_t), nll_base_t = -ln P(y_t).
- `mean` is the mean of KLD_t and `mean_se` its standard error sqrt((E[x^2] - E[x]^2) / (n - 1)), 0 when n <= 10
  (llama.cpp's `mean_and_uncertainty`).
- `median` averages the two middle values when n is even; `p90`, `p95`, `p99`, `p999` interpolate linearly
  between sorted values at fraction * (n - 1) (llama.cpp's `percentile` lambda); `max` is the largest KLD_t.
- `delta_p_rms` = sqrt(mean(dp_t^2)) ("RMS Δp"), with `delta_p_rms_se` = 0.5 / rms * se(dp^2); `delta_p_mean`
  is the signed mean ("Mean Δp").
- `same_top_p` is the fraction of positions whose argmax agrees, with `same_top_p_se` = sqrt(p (1 - p) / (n - 1)).
- `ln_ppl_ratio` = mean(nll_t) - mean(nll_base_t) = ln(PPL(Q) / PPL(base)); its `ln_ppl_ratio_se` subtracts
  twice the covariance of the two means, as llama.cpp does (covariance 0 when n < 10).

One difference: llama.cpp stores the base log-probs as uint16 over [max - 16, max] and skips tokens with
ln P <= -16 in the KL sum; here the base log-probs are kept in full, so KLD_t is the exact sum (the skipped terms
are below e^-16 each). llama.cpp scores the second half of each context window only; callers choose positions.

    kl, top1 = kl_top1(base_logits[:1], logits)                 # [rows, vocab] -> [rows] nats, [rows] bool
    stats = kld_stats(base_logprobs, cand_logprobs, targets)     # [N, vocab], [N, vocab], [N] -> dict of floats
    stats = kld_stats_topk(base_ids, base_lp, base_target_lp, cand_ids, cand_lp, cand_target_lp)  # engine APIs
    ref = Baseline(base_logprobs, targets); ref.kl(cand_logits)  # many candidates against one baseline, fast
    ref.kl_linear(head_weight, cand_hidden)                     # the same, from a linear head's inputs
"""

from __future__ import annotations

import math

import torch

from kvviz.rowstable import HeadChunks

STAT_KEYS = ("mean", "mean_se", "median", "p90", "p95", "p99", "p999", "max", "delta_p_mean", "delta_p_rms",
             "delta_p_rms_se", "same_top_p", "same_top_p_se", "ln_ppl_ratio", "ln_ppl_ratio_se", "ppl", "ppl_base",
             "n")


# ------------------------------------------------------------------------------------------------ per position


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] logits (any float dtype) -> float64 log-softmax [..., vocab]."""
    return torch.log_softmax(logits.double(), dim=-1)


def kl(base_logprobs: torch.Tensor, cand_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) [...] in nats from log-probs [..., vocab] (computed in float64; 0 ln 0 = 0)."""
    lp, lq = base_logprobs.double(), cand_logprobs.double()
    p = lp.exp()
    # 0 * ln 0 = 0: a token the base gives no mass contributes nothing, even where Q is also 0
    return torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1)


def top1(base: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Whether the argmax agrees [...] of logits or log-probs [..., vocab] (each side in its own scale)."""
    return base.argmax(-1) == cand.argmax(-1)


def nll(logprobs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-ln Q(y_t) [N] of log-probs [N, vocab] at the correct next tokens targets [N] (int)."""
    return -logprobs.gather(-1, targets.long()[:, None])[:, 0]


def perplexity(mean_nlls) -> float:
    """exp of the mean of per-window mean NLLs (nats): the perplexity of equally long windows."""
    values = [float(x) for x in mean_nlls]
    if not values:
        raise ValueError("Perplexity needs at least one window's NLL.")
    return math.exp(sum(values) / len(values))


def kl_top1(base_logits: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row KL(base || other) in nats (float64, rounding below 0 clamped) and top-1 agreement.
    base_logits, logits: [rows, vocab] -> ([rows], [rows]); base_logits may be one row [1, vocab], compared with
    every row of logits (its log-softmax is formed once)."""
    return kl(log_probs(base_logits), log_probs(logits)).clamp(min=0.0), top1(base_logits, logits)


class Baseline:
    """One baseline, many candidates: the exact model's log-probs lp [N, vocab] (float64) and the correct next
    tokens targets [N], with what every candidate's KL reuses formed once: P = exp(lp), sum_i P_i lp_i, sum_i P_i,
    argmax and -lp(target).

    With lq = z - lse(z) for a candidate's logits z, KL = sum P lp - sum P z + lse(z) sum P: the candidate's
    vocabulary is read once for lse and once for sum P z, never as a second [N, vocab] of log-probs."""

    def __init__(self, lp: torch.Tensor, targets: torch.Tensor):
        self.lp, self.targets = lp, targets
        self.p = lp.exp()
        # 0 * ln 0 = 0: a token of no mass adds nothing (its lp may be -inf; finite lp times an underflowed 0 is 0)
        self.p_lp = torch.linalg.vecdot(self.p, lp.nan_to_num(neginf=0.0))  # [N]
        self.p_sum = self.p.sum(-1)
        self.top = lp.argmax(-1)
        self.nll = nll(lp, targets)
        self._pw: tuple[torch.Tensor, torch.Tensor] | None = None  # (head weight, P W) of p_z

    def kl(self, logits: torch.Tensor, p_z: torch.Tensor | None = None) -> torch.Tensor:
        """KL(baseline || candidate) [N] of a candidate's logits [N, vocab], the vocabulary read in the logits' own
        dtype, never copied to float64: lse(z) = max + log(sum exp(z - max)), the exponentials summed in float64
        (their float32 rounding errors are independent, so the sum keeps ~1e-9 relative), and sum P z = p_z when
        given (`p_z`: one dot product per position instead of a vocabulary pass)."""
        top = logits.amax(dim=-1, keepdim=True)  # [N, 1]
        lse = top[:, 0].double() + torch.exp(logits - top).sum(dim=-1, dtype=torch.float64).log()
        if p_z is None:
            p_z = torch.linalg.vecdot(self.p, logits.double())
        return self._kl(lse, p_z)

    def kl_linear(self, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """kl(hidden @ weight.T, p_z(weight, hidden)) [..., N] for a linear head (weight [vocab, hidden], no bias,
        no softcapping) and candidates' hidden states [..., N, hidden] in the weight's dtype (several candidates
        stacked in front share each product: the head runs faster on a few hundred rows than on one candidate's),
        the logits formed and reduced a vocabulary chunk at a time (kvviz.rowstable.HeadChunks: oneDNN's inner
        product on the weight packed once per process): lse(z) = top + log(sum_c exp(top_c - top) sum exp(z_c -
        top_c)), each chunk's exponentials summed in float64 from its own max. `kl` holds four [N, vocab] arrays
        per candidate; at Gemma 3's 262K vocabulary, forming and faulting in those pages costs about as much as the
        head's product, which MKL runs at half oneDNN's speed on AMD CPUs. Equal to `kl` to float32 rounding (the
        products round apart); a candidate's value does not depend on the candidates stacked beside it."""
        rows = hidden.reshape(-1, hidden.shape[-1])  # [R N, hidden]
        tops, sums = [], []
        for _, z in HeadChunks.of(weight).logits(rows):  # z: [R N, chunk]
            top = z.amax(dim=-1, keepdim=True)  # [R N, 1]
            tops.append(top[:, 0].double())
            sums.append(z.sub_(top).exp_().sum(dim=-1, dtype=torch.float64))
        top_c, sum_c = torch.stack(tops), torch.stack(sums)  # [chunks, R N] each
        top = top_c.amax(dim=0)  # [R N]
        lse = top + (sum_c * (top_c - top).exp()).sum(dim=0).log()
        return self._kl(lse.reshape(hidden.shape[:-1]), self.p_z(weight, hidden))

    def _kl(self, lse: torch.Tensor, p_z: torch.Tensor) -> torch.Tensor:
        """sum P lp - sum P z + lse(z) sum P [N]: KL(P || softmax(z)) from the candidate's lse(z) and sum P z."""
        return self.p_lp - p_z + lse * self.p_sum

    def p_z(self, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """sum_v P_v z_v [..., N] for a linear head z = W h (weight [vocab, hidden], no bias, no softcapping) and
        candidates' hidden states [..., N, hidden], as (P W) . h: P W [N, hidden] is formed once per weight, in float64,
        a vocabulary chunk at a time (never a float64 copy of the whole head: 1.3 GB at Gemma 3's vocabulary)."""
        if self._pw is None or self._pw[0] is not weight:
            pw = self.p.new_zeros(self.p.shape[0], weight.shape[1])  # [N, hidden] float64
            for i in range(0, weight.shape[0], HeadChunks.CHUNK):
                pw.addmm_(self.p[:, i : i + HeadChunks.CHUNK], weight[i : i + HeadChunks.CHUNK].double())
            self._pw = (weight, pw)
        return torch.linalg.vecdot(self._pw[1], hidden.double())

    def values(self, logits: torch.Tensor):
        """Per-position (kld, nll, nll_base, same_top) [N] of a candidate's logits [N, vocab], the vocabulary read
        in float64: the same numbers as per_position of its log-softmax."""
        z = logits.double()
        lse = torch.logsumexp(z, dim=-1)  # [N]
        return (self._kl(lse, torch.linalg.vecdot(self.p, z)), lse - z.gather(-1, self.targets[:, None])[:, 0],
                self.nll, z.argmax(-1) == self.top)


def per_position(base_logprobs: torch.Tensor, cand_logprobs: torch.Tensor, targets: torch.Tensor):
    """Per-position values from full-vocabulary log-probabilities.

    base_logprobs, cand_logprobs: [N, vocab] log-softmax outputs (any float dtype; computed in float64);
    targets: [N] int64, the correct next token at each position.
    Returns (kld [N], nll [N], nll_base [N], same_top [N] bool), the inputs of summarize().
    """
    if base_logprobs.shape != cand_logprobs.shape or base_logprobs.dim() != 2:
        raise ValueError(f"base and candidate log-probs must both be [positions, vocab]; got "
                         f"{tuple(base_logprobs.shape)} and {tuple(cand_logprobs.shape)}.")
    if targets.shape != base_logprobs.shape[:1]:
        raise ValueError(f"targets must be [positions] = [{base_logprobs.shape[0]}]; got {tuple(targets.shape)}.")
    lp, lq = base_logprobs.double(), cand_logprobs.double()
    return kl(lp, lq), nll(lq, targets), nll(lp, targets), top1(lp, lq)


def per_position_topk(base_ids: torch.Tensor, base_lp: torch.Tensor, base_target_lp: torch.Tensor,
                      cand_ids: torch.Tensor, cand_lp: torch.Tensor, cand_target_lp: torch.Tensor):
    """Per-position values when each side reports only its top-k tokens, as engine APIs do (vLLM / SGLang
    `logprobs=k` / prompt logprobs, llama.cpp's `n_probs`).

    base_ids, base_lp: [N, k] the base's top-k token ids and their log-probs; cand_ids, cand_lp: [N, k2] the
    candidate's; base_target_lp, cand_target_lp: [N] each side's log-prob of the correct next token (the APIs
    return it whether or not it is in the top k).

    The KL is taken over buckets: one per token that BOTH lists name, plus one bucket holding each side's
    remaining mass (1 - the sum over the shared tokens, floored at 1e-12). Merging tokens into buckets can only
    lower a KL (the data-processing inequality), so this is a lower bound of the full-vocabulary KLD; it equals
    it when the lists cover nearly all the mass. Padding: ids < 0 are ignored. same_top compares each side's
    highest-log-prob listed token. delta-p and ln_ppl_ratio are exact (they use only the target log-probs).
    Returns (kld [N], nll [N], nll_base [N], same_top [N] bool), the inputs of summarize().
    """
    if base_ids.shape != base_lp.shape or cand_ids.shape != cand_lp.shape or base_ids.dim() != 2 \
            or cand_ids.dim() != 2 or base_ids.shape[0] != cand_ids.shape[0]:
        raise ValueError(f"top-k inputs must be ids and log-probs of the same [positions, k] shape per side; got "
                         f"base {tuple(base_ids.shape)}/{tuple(base_lp.shape)}, "
                         f"candidate {tuple(cand_ids.shape)}/{tuple(cand_lp.shape)}.")
    n = base_ids.shape[0]
    if base_target_lp.shape != (n,) or cand_target_lp.shape != (n,):
        raise ValueError(f"target log-probs must be [positions] = [{n}] per side; got "
                         f"{tuple(base_target_lp.shape)} and {tuple(cand_target_lp.shape)}.")
    blp, clp = base_lp.double(), cand_lp.double()
    bvalid, cvalid = base_ids >= 0, cand_ids >= 0
    # match[t, i, j]: base's i-th listed token is the candidate's j-th
    match = (base_ids[:, :, None] == cand_ids[:, None, :]) & bvalid[:, :, None] & cvalid[:, None, :]  # [N, k, k2]
    shared = match.any(-1)  # [N, k]
    # the candidate's log-prob of each of the base's listed tokens, where the candidate lists it
    q_at_b = torch.where(match, clp[:, None, :], torch.full_like(match, -math.inf, dtype=torch.float64))
    q_at_b = q_at_b.max(-1).values  # [N, k]
    p = torch.where(shared, blp.exp(), torch.zeros_like(blp))
    q = torch.where(shared, q_at_b.exp(), torch.zeros_like(blp))
    p_rest = (1 - p.sum(-1)).clamp_min(1e-12)
    q_rest = (1 - q.sum(-1)).clamp_min(1e-12)
    terms = torch.where(shared, p * (torch.where(shared, blp, 0.0) - torch.where(shared, q_at_b, 0.0)),
                        torch.zeros_like(p))
    kld = terms.sum(-1) + p_rest * (p_rest.log() - q_rest.log())  # [N]
    btop = base_ids.gather(-1, torch.where(bvalid, blp, -math.inf).argmax(-1, keepdim=True))[:, 0]
    ctop = cand_ids.gather(-1, torch.where(cvalid, clp, -math.inf).argmax(-1, keepdim=True))[:, 0]
    return kld, -cand_target_lp.double(), -base_target_lp.double(), btop == ctop


# ------------------------------------------------------------------------------------- llama.cpp's statistics


def mean_and_se(x: torch.Tensor) -> tuple[float, float]:
    """llama.cpp's mean_and_uncertainty: the mean of x [n] and sqrt(var / (n - 1)), 0 for n <= 10."""
    n = x.numel()
    if n < 1:
        return 0.0, 0.0
    f = float(x.mean())
    var = float((x * x).mean()) - f * f
    return f, (math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0)


def percentile(sorted_x: torch.Tensor, fraction: float) -> float:
    """llama.cpp's percentile: linear interpolation between sorted values [n] at fraction * (n - 1)."""
    n = sorted_x.numel()
    if fraction <= 0:
        return float(sorted_x[0])
    if fraction >= 1:
        return float(sorted_x[-1])
    p = fraction * (n - 1)
    ip = int(p)
    p -= ip
    return (1 - p) * float(sorted_x[ip]) + p * float(sorted_x[min(ip + 1, n - 1)])


def median(sorted_x: torch.Tensor) -> float:
    """llama.cpp's median of sorted values [n]: the middle one, or the mean of the two middle ones when n is even."""
    n = sorted_x.numel()
    return float(sorted_x[n // 2]) if n % 2 else 0.5 * (float(sorted_x[n // 2]) + float(sorted_x[n // 2 - 1]))


def summarize(kld: torch.Tensor, nll: torch.Tensor, nll_base: torch.Tensor, same_top: torch.Tensor) -> dict:
    """The statistics (STAT_KEYS) from per-position values, each [N]: KLD_t (nats), -ln Q(y_t), -ln P(y_t), and
    whether the argmax agrees (bool). Every KLD statistic in kvviz ends in this function."""
    kld, nll, nll_base = (t.detach().double().flatten().cpu() for t in (kld, nll, nll_base))
    same_top = same_top.detach().flatten().cpu().double()
    n = kld.numel()
    if n == 0 or not nll.numel() == nll_base.numel() == same_top.numel() == n:
        raise ValueError(f"KLD statistics need the same positive number of positions in every input; got "
                         f"kld {n}, nll {nll.numel()}, nll_base {nll_base.numel()}, same_top {same_top.numel()}.")
    s = torch.sort(kld).values
    mean, mean_se = mean_and_se(kld)
    dp = torch.exp(-nll) - torch.exp(-nll_base)  # Q(y) - P(y)
    dp_mean, _ = mean_and_se(dp)
    mse, mse_se = mean_and_se(dp * dp)
    rms = math.sqrt(mse)
    same = float(same_top.mean())
    lq, lq_se = mean_and_se(nll)
    lb, lb_se = mean_and_se(nll_base)
    cov = (float((nll * nll_base).mean()) - lq * lb) / (n - 1) if n >= 10 else 0.0
    ratio_var = lq_se * lq_se + lb_se * lb_se - 2.0 * cov
    return {
        "mean": mean, "mean_se": mean_se, "median": median(s), "p90": percentile(s, 0.90),
        "p95": percentile(s, 0.95), "p99": percentile(s, 0.99), "p999": percentile(s, 0.999),
        "max": float(s[-1]), "delta_p_mean": dp_mean, "delta_p_rms": rms,
        "delta_p_rms_se": 0.5 / rms * mse_se if rms > 0 else 0.0,
        "same_top_p": same, "same_top_p_se": math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0,
        "ln_ppl_ratio": lq - lb, "ln_ppl_ratio_se": math.sqrt(max(ratio_var, 0.0)),
        "ppl": math.exp(lq), "ppl_base": math.exp(lb), "n": n,
    }


def kld_stats(base_logprobs: torch.Tensor, cand_logprobs: torch.Tensor, targets: torch.Tensor) -> dict:
    """llama.cpp's KLD statistics (see the module docstring) from full-vocabulary log-probabilities.

    base_logprobs, cand_logprobs: [N, vocab] log-softmax; targets: [N] the correct next tokens.
    Returns a dict keyed by STAT_KEYS (nats for KL and ln_ppl_ratio; probabilities as fractions, not %).
    """
    return summarize(*per_position(base_logprobs, cand_logprobs, targets))


def kld_stats_topk(base_ids: torch.Tensor, base_lp: torch.Tensor, base_target_lp: torch.Tensor,
                   cand_ids: torch.Tensor, cand_lp: torch.Tensor, cand_target_lp: torch.Tensor) -> dict:
    """kld_stats from top-k lists with the remaining mass lumped into one bucket (see per_position_topk: the KL
    statistics are lower bounds of the full-vocabulary ones; delta-p, same-top and ln_ppl_ratio are exact when
    each side's top-1 is listed)."""
    return summarize(*per_position_topk(base_ids, base_lp, base_target_lp, cand_ids, cand_lp, cand_target_lp))

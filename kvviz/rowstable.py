"""Row-stable batches: inside `with row_stable(model):`, in this context, a batch row's outputs are the same bits
whichever rows share the batch. kvviz runs many caches as rows of one batch (the Compare tab's side-by-side decode,
the teacher-forced windows of KL, sensitivity and the plan search, the needle); a plan's numbers must not depend on
which plans sit beside it.

Two of torch's CPU kernels split their work by batch size, and round a row differently when it does:
- F.linear calls MKL's sgemm, which rounds a row apart when a call holds 1-3 rows rather than 4 or more. Entering
  the block gives every float32 nn.Linear of `model` on the CPU kvviz's subclass `RowStableLinear` (its forward is
  F.linear outside a row-stable block, so the model computes as before); inside the block it runs oneDNN's inner product on its weight packed once, which
  gives a row the same bits for every row count from 2 up (tested to 1,024); a 1-row call runs as 2 rows (the row
  twice), since one row takes another code path for some shapes. It is also the faster matmul for these batches:
  MKL runs its AVX2 kernels on AMD CPUs, oneDNN its AVX-512 ones (SmolLM2's gate projection at 13 rows 0.27 ->
  0.13 ms, its LM head 21 -> 6 ms on a 2-core AMD EPYC).
- SDPA with two threads rounds a decode row differently at different batch sizes: the "kvviz" attention function
  (kvviz.attention) runs each row of a batch on its own while `active()`.
The mode is the calling context's (kvviz.runtime's scope: a thread starts outside it); which model holds packed
weights is the current runtime's (kvviz.runtime.Runtime.packed_holder, .packed_head).
A quantized row turns such a 1e-7 difference into a different code and carries it through every later layer and
step: before this, a plan's mean KL on SmolLM2 read 0.03580 alone and 0.03763 beside 35 plans.

Both are float32 products rounded differently (about 1e-6 relative), so the exact row of a batch need not be
bit-equal to a plain batch-1 `model.generate` (MKL, batched SDPA), and the figures still depend on the machine
(its thread count, its instruction set). Runs that time what a server does (tokens/s, `python -m kvviz bench`) stay
on F.linear: `row_stable(model, False)` inside a row-stable block.

The packed weights are kept on each layer (`_kvviz_packed`, not a parameter or buffer: the state dict does not
change) for later calls, and repacked when the weight changes; one model at a time holds them (entering
row_stable for another model drops the previous one's), so a process holds at most one second copy of a model's
linear weights (SmolLM2-135M 513 MiB, Gemma 3 270M 1,022 MiB with its tied 262K-token head). Packing them all
takes about half a second on SmolLM2. A vocabulary-wide layer (the LM head) is packed in 4,096-row chunks
(`HeadChunks.of`), which the KL of every candidate reads too (kvviz.metrics.Baseline.kl_linear). A call runs as
one of a few row counts (`_bucket`: oneDNN builds a kernel per count). Other dtypes and devices, and torch builds
without oneDNN, run F.linear.

    with row_stable(model):
        logits = model(input_ids=batch, cache=stack).logits   # [rows, t, vocab], each row as it would be alone
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from kvviz import runtime

T = TypeVar("T")
_ROWS_HINT = 16  # oneDNN's packing hint: the layout it picks for ~16 rows runs any row count, the same bits


def available() -> bool:
    """Whether this torch build has oneDNN's CPU inner product (x86-64 and aarch64 wheels do): without it the
    linear layers stay F.linear and only attention is row-stable."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed(layer: nn.Linear) -> torch.Tensor:
    """layer.weight [out, in] in oneDNN's blocked layout, packed on first use and again after the weight changes."""
    weight = layer.weight
    key = (weight.data_ptr(), weight._version)
    held = getattr(layer, "_kvviz_packed", None)
    if held is None or held[0] != key:
        held = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT))
        layer._kvviz_packed = held
    return held[1]


def active() -> bool:
    """Whether this context is inside a row_stable block (the innermost one enabled)."""
    return runtime.row_stable_active()


def _inner_product(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's inner product of rows [M, in] with a packed weight -> [M, out], each row the same bits for any M.
    The call runs as `_bucket(M)` rows, the rest zero: a 1-row call rounds apart from the rest for some shapes, so
    it runs as 2; and oneDNN builds a kernel per row count on first use."""
    m = rows.shape[0]
    wide = _bucket(m)
    if wide != m:
        padded = rows.new_empty(wide, rows.shape[1])
        padded[:m] = rows
        padded[m:].zero_()
        rows = padded
    return torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, bias, "none", [], "")[:m]


def _bucket(m: int) -> int:
    """The row count a call of m rows runs as: 2 for 1; up to 64, m; above, m rounded up to one of 8 steps per
    octave (at most 1/8 more rows). oneDNN builds a kernel for each row count it meets, about 2 ms each, and a
    prefix tree brings a new count per layer and batch (SmolLM2's sensitivity map and plan search, 64 tokens:
    about 1 s of their first click); bucketed, a few dozen counts serve every batch."""
    if m <= 64:
        return max(m, 2)
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


class RowStableLinear(nn.Linear):
    """An nn.Linear that reads the row-stable mode: F.linear outside a row_stable block (exactly nn.Linear), the
    packed inner product inside one (a layer as wide as a vocabulary through HeadChunks, so that the LM head has
    one packed copy, in chunks). row_stable gives a model's float32 CPU nn.Linear layers this class (same
    parameters, state dict and repr fields; `isinstance(layer, nn.Linear)` still holds)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not active() or x.dtype != torch.float32 or x.device.type != "cpu" or x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])
        if self.bias is None and self.weight.shape[0] >= HeadChunks.WIDE:
            out = rows.new_empty(rows.shape[0], self.weight.shape[0])
            for start, z in HeadChunks.of(self.weight).logits(rows):
                out[:, start : start + z.shape[1]] = z
        else:
            out = _inner_product(rows, _packed(self), self.bias)  # [M, out]
        return out.reshape(*x.shape[:-1], -1)


def _hold(model: nn.Module) -> None:
    """Make `model` the one whose layers keep packed weights in the current runtime: the previous holder's are
    dropped."""
    rt = runtime.current()
    previous = rt.packed_holder() if rt.packed_holder is not None else None
    if previous is model:
        return
    if previous is not None:
        for module in previous.modules():
            module.__dict__.pop("_kvviz_packed", None)
    rt.packed_head = None
    rt.packed_holder = weakref.ref(model)


def _install(model: nn.Module) -> None:
    """Give every float32 CPU nn.Linear of `model` the class RowStableLinear (once; F.linear outside row_stable).
    A layer whose instance already overrides forward (another library's hook) keeps it."""
    if model.__dict__.get("_kvviz_row_stable"):  # a streamed run enters row_stable once per item
        return
    for module in model.modules():
        if (type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"
                and "forward" not in module.__dict__):
            module.__class__ = RowStableLinear
    model.__dict__["_kvviz_row_stable"] = True


@contextlib.contextmanager
def row_stable(model: nn.Module, enabled: bool = True):
    """Inside the block, in this context: `model`'s batches row-stable (see the module docstring); with
    enabled=False, F.linear and batched attention again (a timed decode inside a row-stable run times what a server
    runs). Other threads using the same model meanwhile run as before."""
    if enabled and available():
        _hold(model)
        _install(model)
    with runtime.scope_row_stable(enabled):
        yield model


def row_stable_steps(model: nn.Module, steps: Iterator[T]) -> Iterator[T]:
    """A generator's items, each computed inside row_stable(model) on whichever thread asks for it (a streaming
    UI resumes a generator from a worker thread per item, so one block around the loop would not hold)."""
    while True:
        with row_stable(model):
            try:
                item = next(steps)
            except StopIteration:
                return
        yield item


class HeadChunks:
    """A linear head's logits z = h W^T a chunk of the vocabulary at a time, for reductions over the vocabulary
    (a log-sum-exp) that never hold the whole [N, vocab]: at Gemma 3's 262K vocabulary that array is 132 MB per
    128 positions, and a fresh one's pages cost about as much as the product. weight: [vocab, hidden], packed once
    for oneDNN chunk by chunk (a second copy of the head); without oneDNN, torch.mm on slices of it. Each row's
    logits are the same bits whatever the row count, as in row_stable.

    `HeadChunks.of(weight)` keeps one head packed per runtime (kvviz.runtime; the last asked for; packing Gemma 3's takes
    0.8 s), which a row-stable model's LM head also runs through: the baseline's logits and every candidate's are
    the same products, and the head has one packed copy.

        for start, z in HeadChunks.of(weight).logits(hidden):   # hidden [N, hidden] -> z [N, chunk] per chunk
    """

    CHUNK = 4096  # vocabulary rows per product: [128, 4096] float32 is 2 MB, reused from the heap
    WIDE = 4 * CHUNK  # a linear layer with this many outputs or more is a vocabulary head (row_stable's _forward)
    @classmethod
    def of(cls, weight: torch.Tensor) -> "HeadChunks":
        """The chunks of `weight`, packed on first use and kept until another head is asked for, the weight
        changes, or row_stable moves to another model."""
        key = (weight.data_ptr(), weight._version, tuple(weight.shape))
        rt = runtime.current()
        held = rt.packed_head  # (weight ref, its version key, its chunks)
        if held is None or held[0]() is not weight or held[1] != key:
            held = (weakref.ref(weight), key, cls(weight))
            rt.packed_head = held
        return held[2]

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.packed = None
        if available() and weight.dtype == torch.float32 and weight.device.type == "cpu":
            self.packed = [torch.ops.mkldnn._reorder_linear_weight(weight[i : i + self.CHUNK].detach(), _ROWS_HINT)
                           for i in range(0, weight.shape[0], self.CHUNK)]

    def logits(self, hidden: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """(first vocabulary index, logits [N, chunk]) per chunk of hidden [N, hidden] (the weight's dtype)."""
        if self.packed is None:
            for i in range(0, self.weight.shape[0], self.CHUNK):
                yield i, torch.mm(hidden, self.weight[i : i + self.CHUNK].T)
            return
        for n, packed in enumerate(self.packed):
            yield n * self.CHUNK, _inner_product(hidden, packed, None)

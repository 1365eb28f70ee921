"""Image-caption similarities shared by the losses and the evaluation.

Both functions take a block of images and a block of captions and return the (N, M) matrix of
similarities; larger is more similar. The evaluation calls them on bounded blocks, the losses on
a training batch.

Order violation (Vendrov et al., 2016): images sit *below* captions in the partial order (a
caption is an abstraction of its image), so a pair is penalised for every caption component that
exceeds the image's:

    S_OE(i, c) = -|| max(0, c - i) ||^2

This is the direction of Vendrov et al., of the FNE paper's Eq. (3) and of the released
CHAIN-VSE/SEAM code, although the CHAIN-VSE and SEAM papers write ``s(x, y) = -|max(0, y - x)|^2``
with the arguments the other way round. The released code also takes the square root of the sum
(``sqrt=True``): rankings are the same, the loss is not. The default is the squared form of the
papers' equations.

Four kernels compute the order violation. The eager one materialises the (N, m_chunk, d) broadcast
and makes four passes over it; it carries gradients and is the one used on CUDA and for small blocks
(training batches up to :data:`BOUNDED_MIN_ELEMS` broadcast elements: every batch of 128 at d <= 1024).
A larger training batch (batch 512 or 1,024) takes the *bounded* kernel
(:func:`bounded_squared_violation`): the same expression chunked over d, with a backward pass of its
own that recomputes each chunk instead of keeping the B x B x d broadcast for the gradient, so its
memory is about :data:`BOUNDED_CHUNK_ELEMS` elements whatever the batch (eager autograd keeps two
B x B x d tensors: 8 GiB at B = 1,024, d = 1,024). Gradient-free float32 CPU blocks (the evaluation, queries
over a gallery) take a *fused* kernel that never builds the broadcast: the *blocked* one here
(:func:`squared_violation_blocked`, plain torch ops on cache-sized sub-tiles, no compiler, no state),
or one given as ``squared``: the evaluator passes the *compiled* kernel of its
:class:`train.retrieval.evaluate.order_kernel.OrderKernel` (``torch.compile`` of
:func:`squared_violation_expr`,
which owns the compilation and decides when it pays). The fused kernels differ from the eager one
only in the order of the float32 summation over d: relative differences of about 1e-7 to 1e-6 of
``||max(0, c - i)||^2`` (bounded by ``d * 2**-24`` in the worst case), so rankings agree except
between candidates whose scores are within that rounding of each other. Each kernel gives a pair the
same bits whatever block it is computed in (the sum over d runs in the same order for every pair).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: caption-dimension chunk for the order-violation broadcast, bounding memory at N x chunk x d
_ORDER_CHUNK_ELEMS = 1 << 24

#: N x M x d from which a gradient-free CPU float32 call takes a fused kernel by default: the blocked
#: kernel ran 2.5x (1,000 x 5,000 at d = 64, bench_evaluate.py) to 4x (d = 1024) faster than the eager
#: broadcast on 2 cores, but its Python loop over d costs a few ms per call, more than the eager kernel
#: needs for a tiny block
FUSED_MIN_WORK = 1 << 22

#: the blocked kernel's (images x captions) sub-tile: under torch's 32768-element grain size, so
#: each of its small ops runs in the calling thread. Parallel ops this small spend more time in
#: thread synchronisation than in work, and on a loaded machine each barrier can wait a whole
#: scheduler time slice (measured: 0.01 G elements/s with 2 threads vs 2 G with serial ops).
BLOCK_IMAGES, BLOCK_CAPTIONS = 128, 255

#: N x M x d above which a call that needs gradients (a training batch) takes the bounded kernel: every
#: batch of 128 at d <= 1,024 (the papers' sizes, every result of the README) stays on the eager kernel
BOUNDED_MIN_ELEMS = 1 << 24
#: N x M x (d chunk) of one chunk of the bounded kernel: its working memory, about 3 x 64 MiB in float32
BOUNDED_CHUNK_ELEMS = 1 << 24

#: a fused kernel: images (N, d), captions (M, d) -> ``||max(0, c - i)||^2`` (N, M), no broadcast
SquaredViolation = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cosine(images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of L2-normalised embeddings: ``images (N, d) @ captions (M, d).T -> (N, M)``."""
    return images @ captions.t()


def order_violation(images: torch.Tensor, captions: torch.Tensor, sqrt: bool = False,
                    fused: bool | None = None, squared: SquaredViolation | None = None) -> torch.Tensor:
    """Negative order violation ``-||max(0, c - i)||^2`` of every pair.

    Args:
        images: (N, d) image embeddings (non-negative in the order-embedding models).
        captions: (M, d) caption embeddings.
        sqrt: take the square root of the summed squared violation (the released code's form).
        fused: ``None`` (default) takes a fused CPU kernel when no gradient is needed, both
            inputs are float32 on the CPU and ``N * M * d >= FUSED_MIN_WORK``; ``True`` takes it
            whenever no gradient is needed and the inputs are float32 on the CPU (the evaluation,
            so that all its tiles use one kernel); ``False`` always takes the eager kernel.
        squared: the fused kernel (default :func:`squared_violation_blocked`); the evaluator
            passes its compiled one (:class:`train.retrieval.evaluate.order_kernel.OrderKernel`).

    Returns:
        (N, M) similarities, ``<= 0``; 0 where the caption lies entirely below the image.
        Memory: the eager kernel processes captions in chunks of about 16M broadcast elements;
        the fused kernels need only the (N, M) output (plus about 1 MB).
    """
    if _wants_fused(images, captions, fused):
        out = (squared or squared_violation_blocked)(images, captions)
        return -(out.sqrt_() if sqrt else out)
    if _wants_bounded(images, captions):
        out = bounded_squared_violation(images, captions)
        # the epsilon keeps the gradient finite where there is no violation at all (as the eager kernel)
        return -(out.clamp_min(1e-12).sqrt() if sqrt else out)
    return _eager_order_violation(images, captions, sqrt)


def _wants_bounded(images: torch.Tensor, captions: torch.Tensor) -> bool:
    """A call that needs gradients and whose broadcast exceeds :data:`BOUNDED_MIN_ELEMS`."""
    if not (torch.is_grad_enabled() and (images.requires_grad or captions.requires_grad)):
        return False
    return images.shape[0] * captions.shape[0] * images.shape[1] > BOUNDED_MIN_ELEMS


def _wants_fused(images: torch.Tensor, captions: torch.Tensor, fused: bool | None) -> bool:
    if fused is False:
        return False
    if torch.is_grad_enabled() and (images.requires_grad or captions.requires_grad):
        return False  # only the eager kernel carries gradients
    if images.device.type != "cpu" or captions.device.type != "cpu":
        return False  # on CUDA the eager broadcast is already fast
    if images.dtype != torch.float32 or captions.dtype != torch.float32:
        return False
    if fused:
        return True
    return images.shape[0] * captions.shape[0] * images.shape[1] >= FUSED_MIN_WORK


def _eager_order_violation(images: torch.Tensor, captions: torch.Tensor, sqrt: bool) -> torch.Tensor:
    """The reference kernel: (N, M), through the (N, m_chunk, d) broadcast."""
    n, d = images.shape
    m = captions.shape[0]
    step = max(1, _ORDER_CHUNK_ELEMS // max(1, n * d))
    parts = []
    for start in range(0, m, step):
        c = captions[start:start + step]
        diff = c.unsqueeze(0) - images.unsqueeze(1)  # (N, m_chunk, d)
        if torch.is_grad_enabled() and (images.requires_grad or captions.requires_grad):
            v = diff.clamp_min(0).pow(2).sum(dim=2)
        else:  # evaluation: reuse the buffer
            v = diff.clamp_min_(0).pow_(2).sum(dim=2)
        parts.append(v)
    out = torch.cat(parts, dim=1) if len(parts) != 1 else (parts[0] if parts else images.new_zeros(n, 0))
    if sqrt:
        # the epsilon keeps the gradient finite where there is no violation at all
        out = out.clamp_min(1e-12).sqrt() if out.requires_grad else out.sqrt()
    return -out


def squared_violation_expr(images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    """``||max(0, c - i)||^2`` as one expression (N, M): what ``torch.compile`` fuses."""
    return (captions.unsqueeze(0) - images.unsqueeze(1)).clamp_min(0).square().sum(dim=2)


def _dim_chunks(n: int, m: int, d: int, chunk_elems: int) -> list[slice]:
    """Slices of the d components, each holding at most ``chunk_elems`` elements of the N x M broadcast."""
    step = max(1, chunk_elems // max(1, n * m))
    return [slice(k, min(d, k + step)) for k in range(0, d, step)]


class _BoundedSquaredViolation(torch.autograd.Function):
    """``||max(0, c - i)||^2`` (N, M) whose forward and backward hold one chunk of d at a time.

    With ``r = max(0, c_j - i_i)`` (per component) and ``g = dL/dv`` (N, M): ``dL/di_i = -2 sum_j g_ij r_ij``
    and ``dL/dc_j = 2 sum_i g_ij r_ij``; each chunk's ``r`` is recomputed in the backward pass.
    """

    @staticmethod
    def forward(ctx: Any, images: torch.Tensor, captions: torch.Tensor, chunk_elems: int) -> torch.Tensor:
        n, d = images.shape
        m = captions.shape[0]
        ctx.save_for_backward(images, captions)
        ctx.chunk_elems = chunk_elems
        out = images.new_zeros(n, m)
        for k in _dim_chunks(n, m, d, chunk_elems):
            out += squared_violation_expr(images[:, k], captions[:, k])
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        images, captions = ctx.saved_tensors
        n, d = images.shape
        m = captions.shape[0]
        grad_images = torch.empty_like(images) if ctx.needs_input_grad[0] else None
        grad_captions = torch.empty_like(captions) if ctx.needs_input_grad[1] else None
        twice = 2 * grad
        for k in _dim_chunks(n, m, d, ctx.chunk_elems):
            r = (captions[:, k].unsqueeze(0) - images[:, k].unsqueeze(1)).clamp_min_(0)  # (N, M, chunk)
            if grad_images is not None:
                grad_images[:, k] = -torch.einsum("nm,nmk->nk", twice, r)
            if grad_captions is not None:
                grad_captions[:, k] = torch.einsum("nm,nmk->mk", twice, r)
        return grad_images, grad_captions, None


def bounded_squared_violation(images: torch.Tensor, captions: torch.Tensor,
                              chunk_elems: int = BOUNDED_CHUNK_ELEMS) -> torch.Tensor:
    """``||max(0, c - i)||^2`` (N, M) of images (N, d) and captions (M, d), with gradients, never holding
    more than about ``chunk_elems`` elements of the N x M x d broadcast (forward or backward): the
    training loss of large batches. Any device; the sum over d runs chunk by chunk, so it differs from the
    eager kernel's in the last bits only (relative ~1e-7)."""
    return _BoundedSquaredViolation.apply(images, captions, chunk_elems)


def squared_violation_blocked(images: torch.Tensor, captions: torch.Tensor, block_images: int = BLOCK_IMAGES,
                              block_captions: int = BLOCK_CAPTIONS) -> torch.Tensor:
    """``||max(0, c - i)||^2`` (N, M) of images (N, d) and captions (M, d), without a compiler and
    without the N x M x d broadcast.

    Loops over sub-tiles of the output and, inside one, over the d components: the update
    ``out += max(0, c_k - i_k)^2`` touches one (images x captions) block that stays in cache, so
    the three ops per component (subtract, clamp, multiply-add) run at cache speed instead of
    streaming a broadcast through memory four times. Components are summed one after the other
    (not pairwise), hence the ``d * 2**-24`` bound on the relative rounding. The sub-tile is at most
    ``block_images`` x ``block_captions`` (their product, for fewer images).
    """
    n, d = images.shape
    m = captions.shape[0]
    out = torch.zeros(n, m, dtype=torch.float32)
    rows = max(1, min(n, block_images))
    cols = min(m, max(block_captions, (block_images * block_captions) // rows))
    for c0 in range(0, m, max(1, cols)):
        c_t = captions[c0:c0 + cols].t().contiguous()  # (d, cols): component k is a contiguous row
        for i0 in range(0, n, rows):
            i_t = images[i0:i0 + rows].t().contiguous()  # (d, rows)
            acc = torch.zeros(i_t.shape[1], c_t.shape[1], dtype=torch.float32)
            b = torch.empty_like(acc)
            for k in range(d):
                torch.sub(c_t[k].unsqueeze(0), i_t[k].unsqueeze(1), out=b)
                b.clamp_min_(0)
                acc.addcmul_(b, b)
            out[i0:i0 + rows, c0:c0 + cols] = acc
    return out


def similarity(images: torch.Tensor, captions: torch.Tensor, measure: str, order_sqrt: bool = False,
               fused: bool | None = None, squared: SquaredViolation | None = None) -> torch.Tensor:
    """Dispatch on ``measure`` (``"order"`` or ``"cosine"``): images (N, d), captions (M, d) -> (N, M).

    ``fused`` and ``squared`` choose the order-violation kernel (see :func:`order_violation`).
    """
    if measure == "cosine":
        return cosine(images, captions)
    if measure == "order":
        return order_violation(images, captions, sqrt=order_sqrt, fused=fused, squared=squared)
    raise ValueError(f"unknown similarity measure {measure!r} (expected 'order' or 'cosine')")

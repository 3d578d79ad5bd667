"""The training objective: label-smoothed cross-entropy (Section 5.4), plain and fused with the
pre-softmax projection."""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = 0
                            ) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-entropy against the smoothed target (Sec. 5.4, label smoothing of value epsilon_ls).

    The true class gets 1 - epsilon and every other class epsilon / (V - 1), as in tensor2tensor and
    fairseq's ``label_smoothed_cross_entropy``. Padding positions are ignored.
    Returns (summed smoothed loss, summed NLL, number of target tokens); computed in fp32.

    torch's fused ``cross_entropy`` spreads its ``label_smoothing`` over all V classes (true one included),
    so epsilon * V / (V - 1) there is exactly the distribution above, and faster than log_softmax + gather
    (one fused kernel). The NLL (for perplexity) is computed without gradient.
    """
    vocab = logits.shape[-1]
    flat = logits.float().reshape(-1, vocab)
    target = target.reshape(-1)
    keep = target != ignore_index
    loss = F.cross_entropy(flat, target, ignore_index=ignore_index, reduction="sum",
                           label_smoothing=epsilon * vocab / (vocab - 1))
    with torch.no_grad():
        true_logit = flat.gather(1, target[:, None]).squeeze(1)
        nll = ((torch.logsumexp(flat, dim=-1) - true_logit) * keep).sum()
    return loss, nll, keep.sum()


def fused_label_smoothed_nll_loss(hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float,
                                  ignore_index: int = 0, chunk: int = 128) -> tuple[Tensor, Tensor, Tensor]:
    """``label_smoothed_nll_loss(F.linear(hidden, weight), ...)`` in one (tokens x V) buffer, the gradient's.

    A speed path (tests/test_speed_paths.py checks loss, NLL and both gradients against the plain path):
    the smoothed loss and its gradients are computed ``chunk`` target positions at a time while the chunk's
    logits are in cache, and the gradients are kept for the backward pass (the "fused linear cross-entropy" of
    Liger-Kernel / Apple's cut-cross-entropy, done eagerly). Projection + loss + backward take about half the time
    of the plain path, which matters because they are a large part of a training step at small d_model and a large
    vocabulary.
    Under autocast the matrix products run in the autocast dtype, the softmax and sums in fp32.
    Without gradients (validation) only the losses are computed, chunk by chunk.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1)
    keep = (t != ignore_index).nonzero().squeeze(1)  # padding positions take no part (no loss, no gradient)
    device = h.device.type
    cd = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
    need_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    with torch.autocast(device, enabled=False):
        if need_grad:
            loss, nll = _FusedLinearSmoothedLoss.apply(h, weight, t, keep, epsilon, chunk, cd)
        else:
            loss, nll, _, _ = _fused_loss_chunks(h.index_select(0, keep).to(cd), weight.to(cd), t[keep], epsilon,
                                                 chunk, False)
    return loss, nll, keep.new_tensor(keep.numel())


_SCRATCH = threading.local()  # .buffers: {dtype: flat tensor}, each thread its own


def _grad_logits_buffer(rows: int, cols: int, like: Tensor) -> Tensor:
    """An uninitialised (rows x cols) tensor for the loss's d/d(logits). On CPU one flat buffer per dtype and thread,
    kept and grown: the (tokens x V) tensor (48 MB at the protocol's 1,500 tokens x 8,000) is above glibc's largest
    mmap threshold (32 MB), so a fresh one each step came from a fresh mmap and paid its page faults again (writing
    48 MB: 37 ms fresh against 6 ms kept, one thread, reports/timing.md). Elsewhere torch's caching allocator
    reuses memory. Nothing keeps the tensor past :func:`_fused_loss_chunks`, so the next call may take it."""
    if like.device.type != "cpu":
        return torch.empty(rows, cols, dtype=like.dtype, device=like.device)
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    flat = buffers.get(like.dtype)
    if flat is None or flat.numel() < rows * cols:
        flat = buffers[like.dtype] = torch.empty(rows * cols, dtype=like.dtype)
    return flat[:rows * cols].view(rows, cols)


def _fused_loss_chunks(h: Tensor, w: Tensor, target: Tensor, epsilon: float, chunk: int, grads: bool):
    """Smoothed loss and NLL sums over the rows of ``h @ w.T``, chunk by chunk; with ``grads``, also
    d(loss)/d(logits), written into the kept buffer (:func:`_grad_logits_buffer`) and turned into d/dh and d/dw.
    Each chunk's logits are one fp32 tensor worked in place (the max taken off, then their exp, then the gradient).
    In fp32 with ``grads`` the logits are whole products into that buffer and d/dh whole products out of it
    (:func:`_whole_chunks`): one product of many rows runs nearer the machine's peak than one per chunk (K is only
    d_model; reports/timing.md). Otherwise (bf16, or no gradient) each chunk's logits are its own product, cast to
    fp32, and its d/dh too."""
    V = w.shape[0]
    conf, other = 1.0 - epsilon, epsilon / (V - 1)  # the smoothed target distribution (see above)
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    nll = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_logits = _grad_logits_buffer(h.shape[0], V, h) if grads else None
    whole = grads and h.dtype == torch.float32  # the logits in one product, into the buffer of their gradient
    if whole:
        for part in _whole_chunks(h.shape[0], chunk):
            torch.mm(h[part], w.t(), out=grad_logits[part])
    grad_h = torch.empty_like(h) if grads else None
    for s in range(0, h.shape[0], chunk):
        tc = target[s:s + chunk, None]
        # the chunk's slot of the whole product, or a fresh tensor (the chunk's product, or its fp32 copy)
        z = grad_logits[s:s + chunk] if whole else (h[s:s + chunk] @ w.t()).float()
        z.sub_(z.amax(1, keepdim=True))
        z_y, z_sum = z.gather(1, tc), z.sum(1, keepdim=True)
        e = z.exp_()
        se = e.sum(1, keepdim=True)
        lse = se.log()
        logp_y = z_y - lse
        sum_logp = z_sum - V * lse
        loss -= (conf * logp_y + other * (sum_logp - logp_y)).sum()
        nll -= logp_y.sum()
        if grads:  # softmax(z) - q, q = conf on the target and other elsewhere
            g = e.div_(se).sub_(other).scatter_add_(1, tc, torch.full_like(logp_y, other - conf))
            if not whole:  # stored in the compute dtype, then the chunk's rows of d/dh
                gc = grad_logits[s:s + chunk]
                gc.copy_(g)
                torch.mm(gc, w, out=grad_h[s:s + chunk])
    if whole:
        for part in _whole_chunks(h.shape[0], chunk):
            torch.mm(grad_logits[part], w, out=grad_h[part])
    grad_w = grad_logits.t() @ h if grads else None
    return loss, nll, grad_h, grad_w


def _whole_chunks(rows: int, chunk: int) -> list[slice]:
    """The rows of whole chunks as one slice, then the last partial chunk's: a product of few rows takes another
    kernel, so the last chunk gets its own product, as chunk by chunk (with MKL the same numbers bit for bit as a
    product per chunk: reports/timing.md)."""
    full = rows - rows % chunk
    return [part for part in (slice(0, full), slice(full, rows)) if part.stop > part.start]


class _FusedLinearSmoothedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, target, keep, epsilon, chunk, cd):
        loss, nll, grad_kept, grad_w = _fused_loss_chunks(h.index_select(0, keep).to(cd), weight.to(cd),
                                                          target.index_select(0, keep), epsilon, chunk, True)
        ctx.save_for_backward(grad_kept, grad_w, keep)
        ctx.shape, ctx.dtypes = h.shape, (h.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        grad_kept, grad_w, keep = ctx.saved_tensors
        grad_h = grad_kept.new_zeros(ctx.shape).index_copy_(0, keep, grad_kept)
        return ((grad_h * grad_loss).to(ctx.dtypes[0]), (grad_w.to(ctx.dtypes[1]) * grad_loss),
                None, None, None, None, None)

"""Label smoothing (Sec. 5.4) and the learning-rate schedule (Sec. 5.3, Eq. 3)."""
import math

import pytest
import torch

from lightning_tfm.training.config.config import TrainConfig
from lightning_tfm.training.loss import label_smoothed_nll_loss
from lightning_tfm.training.optim import make_optimizer, noam_lr


def test_label_smoothed_loss_against_a_hand_computation():
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]]])
    target = torch.tensor([[2, 0]])  # second position is padding (id 0) and must be ignored
    eps = 0.1
    loss, nll, ntok = label_smoothed_nll_loss(logits, target, eps, ignore_index=0)
    z = [2.0, 0.5, -1.0, 0.0]
    logz = math.log(sum(math.exp(x) for x in z))
    logp = [x - logz for x in z]
    q = [eps / 3, eps / 3, 1 - eps, eps / 3]  # true class 1 - eps, the other V-1 classes eps/(V-1)
    expected = -sum(qi * lp for qi, lp in zip(q, logp))
    assert ntok.item() == 1
    assert nll.item() == pytest.approx(-logp[2], rel=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_no_smoothing_is_plain_cross_entropy():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    loss, nll, n = label_smoothed_nll_loss(logits, target, 0.0)
    ce = torch.nn.functional.cross_entropy(logits.view(-1, 11), target.view(-1), reduction="sum")
    assert loss.item() == pytest.approx(ce.item(), rel=1e-5) and nll.item() == pytest.approx(ce.item(), rel=1e-5)


def test_schedule_values():
    d, w = 512, 4000
    assert noam_lr(1, d, w) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert noam_lr(w, d, w) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # the peak, ~7e-4
    assert noam_lr(w, d, w) == pytest.approx(6.987712429686844e-4)
    assert noam_lr(16000, d, w) == pytest.approx(512 ** -0.5 * 16000 ** -0.5)
    assert noam_lr(2000, d, w, scale=2.0) == pytest.approx(2 * 512 ** -0.5 * 2000 * 4000 ** -1.5)
    rising = [noam_lr(s, d, w) for s in range(1, w + 1, 100)]
    assert rising == sorted(rising)


def test_optimizer_follows_the_schedule_step_by_step():
    p = torch.nn.Parameter(torch.zeros(3))
    cfg = TrainConfig(adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-9, warmup=10, lr_scale=1.0)
    opt, sched = make_optimizer([p], cfg, d_model=64)
    assert opt.param_groups[0]["betas"] == (0.9, 0.98) and opt.param_groups[0]["eps"] == 1e-9
    for step in range(1, 30):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam_lr(step, 64, 10))
        p.grad = torch.ones(3)
        opt.step()
        sched.step()

"""HOC/CL2R as the released code trains it: the fine-tuning learning rate, balanced replay batches, masked negatives."""
import math

import pytest
import torch
from torch import nn

from engine.methods import training
from engine.core.config import TrainingConfig
from engine.methods import ER, BCTER, DSimplexFD, DSimplexHOC, StepContext, build_method
from engine.models import DSimplexHead, ModelOutput, Net, dsimplex_prototypes
from engine.models.net import ModelSpec
from engine.methods.training import epoch_batches, train_step


def log_sum_exp(values) -> float:
    return math.log(sum(math.exp(v) for v in values))


def tiny_net(num_classes: int = 4, in_dim: int = 3, seed: int = 0) -> Net:
    torch.manual_seed(seed)
    head = DSimplexHead(num_classes)
    spec = ModelSpec(backbone="small_cnn", head="dsimplex", num_classes=num_classes, feature_dim=head.feature_dim)
    return Net(spec, nn.Linear(in_dim, head.feature_dim, bias=False), None, head)


FINETUNE = StepContext(step=2, seen_classes=(0, 1, 2, 3), new_classes=(2, 3), fine_tunes=True, replay_classes=(0, 1))
SCRATCH = StepContext(step=2, seen_classes=(0, 1, 2, 3), new_classes=(2, 3), replay_classes=(0, 1))


# ---------------------------------------------------------------------------------------------
# negatives: the printed Eq. 4 against the released HocLoss, on a batch where two samples share a class


def test_hoc_default_is_the_released_code_and_both_negatives_by_hand():
    old = tiny_net().frozen_copy()
    W = dsimplex_prototypes(4)  # 3-d features
    new_f = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    old_f = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    targets = torch.tensor([0, 0, 2])  # samples 0 and 1 share class 0
    out, old_out = ModelOutput(new_f, new_f @ W.T), ModelOutput(old_f, old_f @ W.T)
    ctx = StepContext(step=2, seen_classes=(0, 1, 2), new_classes=(2,), old_model=old)
    rho = 10.0
    # cos(old_i, new_j): row 0 = (1, 0, 0), row 1 = (1, 0, 0), row 2 = (0, 0, 1)
    s = [[rho, 0.0, 0.0], [rho, 0.0, 0.0], [0.0, 0.0, rho]]
    # paper (Eq. 4 as printed): -s_ii + log sum_{j != i} exp(s_ij), same class or not
    paper = [-s[0][0] + log_sum_exp([s[0][1], s[0][2]]),
             -s[1][1] + log_sum_exp([s[1][0], s[1][2]]),
             -s[2][2] + log_sum_exp([s[2][0], s[2][1]])]
    # repo (iamcl2r HocLoss): same-class entries, diagonal included, set to 0 and kept in the sum over the row
    repo = [-s[0][0] + log_sum_exp([0.0, 0.0, s[0][2]]),
            -s[1][1] + log_sum_exp([0.0, 0.0, s[1][2]]),
            -s[2][2] + log_sum_exp([s[2][0], s[2][1], 0.0])]
    assert DSimplexHOC().negatives == "repo"
    _, parts = DSimplexHOC(rho=rho).loss(out, targets, ctx, old_out)
    assert parts["nce"] == pytest.approx(sum(repo) / 3, rel=1e-6)
    _, parts = DSimplexHOC(rho=rho, negatives="paper").loss(out, targets, ctx, old_out)
    assert parts["nce"] == pytest.approx(sum(paper) / 3, rel=1e-6)
    # sample 1's positive is no closer than its same-class neighbour: the paper penalises it (a negative at
    # rho), the released code does not
    assert paper[1] == pytest.approx(rho + math.log(1 + math.exp(-rho)))
    assert repo[1] == pytest.approx(math.log(3))


# ---------------------------------------------------------------------------------------------
# fine-tuning learning rate and balanced batches: when they apply


@pytest.mark.parametrize("cls", [DSimplexHOC, DSimplexFD, BCTER, ER])
def test_finetune_lr_and_balance_apply_only_to_fine_tuning_steps(cls):
    method = cls(finetune_lr=0.001, balanced_replay=True)
    assert method.step_lr(0.1, FINETUNE) == 0.001
    assert method.step_lr(0.1, SCRATCH) == 0.1  # first step or replacement retrained from scratch
    assert method.balances_replay(FINETUNE) and not method.balances_replay(SCRATCH)
    no_replay = StepContext(step=2, seen_classes=(0, 1), new_classes=(1,), fine_tunes=True)
    assert not method.balances_replay(no_replay)
    default = cls()  # the released code: balanced batches, one learning rate
    assert default.step_lr(0.1, FINETUNE) == 0.1 and default.balances_replay(FINETUNE)
    assert not cls(balanced_replay=False).balances_replay(FINETUNE)
    assert build_method("independent").step_lr(0.1, FINETUNE) == 0.1


def test_finetuning_options_are_validated():
    with pytest.raises(ValueError, match="finetune_lr must be greater than 0"):
        build_method("dsimplex_hoc", finetune_lr=0.0)
    with pytest.raises(ValueError, match="balanced_replay must be true or false"):
        build_method("er", balanced_replay="yes")


# ---------------------------------------------------------------------------------------------
# epoch_batches


def test_plain_batches_are_the_seeded_permutation_cut_into_full_batches():
    got = epoch_batches(10, 4, torch.Generator().manual_seed(3))
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    assert [b.tolist() for b in got] == [perm[:4].tolist(), perm[4:8].tolist()]


@pytest.mark.parametrize("batch", [8, 7])
def test_balanced_batches_hold_half_memory_and_use_every_new_sample_once(batch):
    memory = torch.zeros(50, dtype=torch.bool)
    memory[torch.arange(0, 50, 5)] = True  # 10 replay samples, 40 new ones
    got = epoch_batches(50, batch, torch.Generator().manual_seed(0), memory)
    half, other = batch // 2, batch - batch // 2
    assert len(got) == 40 // other
    for b in got:
        assert len(b) == batch
        assert memory[b].sum().item() == half  # the stated split: batch // 2 from the memory
    new_used = torch.cat([b[~memory[b]] for b in got]).tolist()
    assert len(new_used) == len(set(new_used)) == len(got) * other  # no new sample twice in an epoch
    mem_used = torch.cat([b[memory[b]] for b in got])
    counts = torch.bincount(mem_used, minlength=50)[memory]
    assert counts.max() - counts.min() <= 1  # the memory is cycled evenly


def test_balanced_batches_refuse_what_cannot_be_balanced():
    with pytest.raises(ValueError, match="at least 1 replay image"):
        epoch_batches(6, 4, torch.Generator(), torch.zeros(6, dtype=torch.bool))
    with pytest.raises(ValueError, match="replay mask has shape"):
        epoch_batches(6, 4, torch.Generator(), torch.zeros(5, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# the loop uses both


def test_train_step_balances_batches_and_uses_the_finetune_lr(monkeypatch):
    seen_batches, lrs = [], []

    class Recording(ER):
        def loss(self, out, targets, ctx, old_out):
            seen_batches.append(targets.clone())
            return super().loss(out, targets, ctx, old_out)

    real = training.make_optimizer

    def spy(net, cfg):
        opt = real(net, cfg)
        lrs.append(opt.param_groups)
        return opt

    monkeypatch.setattr(training, "make_optimizer", spy)
    net = tiny_net()
    labels = torch.tensor([0, 1] * 3 + [2, 3] * 12)  # 6 replay images of classes 0-1, 24 new ones
    images = torch.randn(len(labels), 3, generator=torch.Generator().manual_seed(1))
    cfg = TrainingConfig(epochs=1, batch_size=8, lr=0.1, lr_schedule="constant")
    train_step(net, Recording(finetune_lr=0.002, balanced_replay=True), images, labels, FINETUNE, cfg,
               device=torch.device("cpu"), seed=0, augment_images=False)
    assert lrs[0][0]["lr"] == 0.002
    assert len(seen_batches) == 24 // 4
    for targets in seen_batches:
        old = torch.isin(targets, net.head.class_to_output(torch.tensor([0, 1])))
        assert old.sum().item() == 4

"""Each method's loss on tiny hand-checkable batches, its first step, and where gradients go."""
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from engine.methods import (
    BCT,
    BCTER,
    ER,
    ETF,
    MeanAlign,
    LSP,
    PSP,
    CoReS,
    DSimplexFD,
    DSimplexHOC,
    Independent,
    METHODS,
    StepContext,
    build_method,
)
from engine.models import DSimplexHead, ETFHead, LinearHead, ModelOutput, Net, build_model, dsimplex_prototypes
from engine.models.net import ModelSpec


def log_sum_exp(values) -> float:
    return math.log(sum(math.exp(v) for v in values))


def tiny_net(head: nn.Module, in_dim: int = 3, seed: int = 0) -> Net:
    """Linear backbone straight into ``head`` (no projection)."""
    torch.manual_seed(seed)
    dim = head.feature_dim
    spec = ModelSpec(backbone="small_cnn", head="linear", num_classes=head.num_outputs, feature_dim=dim)
    return Net(spec, nn.Linear(in_dim, dim, bias=False), None, head)


def inputs(n: int = 4, in_dim: int = 3) -> torch.Tensor:
    return torch.randn(n, in_dim, generator=torch.Generator().manual_seed(7))


def ctx_step2(old_model, seen=(0, 1, 2, 3), new=(2, 3)) -> StepContext:
    return StepContext(step=2, seen_classes=seen, new_classes=new, old_model=old_model)


CTX_STEP1 = StepContext(step=1, seen_classes=(0, 1), new_classes=(0, 1), old_model=None)


# ---------------------------------------------------------------------------------------------
# step context


def test_step_context_old_classes_and_validation():
    ctx = StepContext(step=3, seen_classes=(4, 0, 2, 7), new_classes=(2,))
    assert ctx.old_classes == (4, 0, 7)
    with pytest.raises(ValueError, match="numbered from 1"):
        StepContext(step=0, seen_classes=(0,), new_classes=(0,))
    with pytest.raises(ValueError, match="not among the seen"):
        StepContext(step=1, seen_classes=(0,), new_classes=(0, 1))


# ---------------------------------------------------------------------------------------------
# plain cross-entropy methods


def test_independent_er_and_cores_are_plain_mean_cross_entropy_over_all_outputs():
    features = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    W = dsimplex_prototypes(3)  # K = 3 pre-allocated, d = 2
    logits = features @ W.T
    targets = torch.tensor([0, 1])
    out = ModelOutput(features, logits)
    by_hand = sum(-logits[i, t].item() + log_sum_exp(logits[i].tolist()) for i, t in enumerate([0, 1])) / 2
    for method in (Independent(), ER(), CoReS()):
        value, parts = method.loss(out, targets, CTX_STEP1, None)
        assert value.item() == pytest.approx(by_hand, rel=1e-6)
        torch.testing.assert_close(value, F.cross_entropy(logits, targets))
        assert parts == {"ce": pytest.approx(by_hand, rel=1e-6), "loss": pytest.approx(by_hand, rel=1e-6)}
    # the future class (output 2) stays in the CoReS denominator: dropping it changes the loss
    seen_only = F.cross_entropy(logits[:, :2], targets)
    assert not torch.isclose(CoReS().loss(out, targets, CTX_STEP1, None)[0], seen_only)


def test_psp_and_lsp_cross_entropy_with_temperature():
    logits = torch.tensor([[3.0, -1.0, 0.5]])
    out = ModelOutput(torch.zeros(1, 2), logits)
    target = torch.tensor([2])
    by_hand = -0.5 / 12 + log_sum_exp([3.0 / 12, -1.0 / 12, 0.5 / 12])
    for cls in (PSP, LSP):
        assert cls(temperature=12.0).loss(out, target, CTX_STEP1, None)[0].item() == pytest.approx(by_hand, rel=1e-6)
        torch.testing.assert_close(cls().loss(out, target, CTX_STEP1, None)[0], F.cross_entropy(logits, target))
    assert PSP.default_views == ("psp",) and LSP.default_views == ("lsp",)


def test_etf_ce_and_dot_regression():
    head = ETFHead(4, 5, seed=1)
    features = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([0, 3, 1])
    out = ModelOutput(features, head(features))
    torch.testing.assert_close(ETF().loss(out, targets, CTX_STEP1, None)[0], F.cross_entropy(out.logits, targets))
    dr, parts = ETF(objective="dr").loss(out, targets, CTX_STEP1, None)
    unit = F.normalize(features, dim=1)
    expected = 0.5 * ((unit * head.prototypes[targets]).sum(1) - 1).pow(2).mean()
    torch.testing.assert_close(dr, expected)
    assert set(parts) == {"dr", "loss"}


def test_fixed_heads_receive_no_gradient():
    for method, head in ((CoReS(), DSimplexHead(4)), (ETF(objective="dr"), ETFHead(4, 3)), (ETF(), ETFHead(4, 3))):
        net = tiny_net(head)
        before = head.prototypes.clone()
        value, _ = method.loss(net(inputs()), torch.tensor([0, 1, 2, 3]), CTX_STEP1, None)
        value.backward()
        assert list(head.parameters()) == [] and not head.prototypes.requires_grad
        assert head.prototypes.grad is None
        assert net.backbone.weight.grad is not None and net.backbone.weight.grad.abs().sum() > 0
        torch.testing.assert_close(head.prototypes, before)


# ---------------------------------------------------------------------------------------------
# BCT


def test_bct_influence_is_ce_of_old_head_on_new_features_for_old_classes():
    old = tiny_net(LinearHead(2, 2)).frozen_copy()  # knew classes 0 and 1
    new = tiny_net(LinearHead(2, 4), seed=1)
    out = new(inputs())
    targets = torch.tensor([0, 2, 1, 3])  # samples 0 and 2 are old classes
    value, parts = BCT(lam=0.5).loss(out, targets, ctx_step2(old), None)
    ce = F.cross_entropy(out.logits, targets)
    influence = F.cross_entropy(old.head(out.features[[0, 2]]), targets[[0, 2]])
    torch.testing.assert_close(value, ce + 0.5 * influence)
    assert parts["influence"] == pytest.approx(influence.item(), rel=1e-6)
    assert parts["ce"] == pytest.approx(ce.item(), rel=1e-6)


def test_bct_by_hand_with_a_known_old_classifier():
    old_head = LinearHead(2, 2)
    with torch.no_grad():
        old_head.fc.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    old = tiny_net(old_head).frozen_copy()
    features = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    out = ModelOutput(features, torch.zeros(2, 3))  # new logits all equal: CE = log 3
    targets = torch.tensor([1, 2])  # only sample 0 is an old class; old logits (2, 0), target 1
    value, parts = BCT().loss(out, targets, ctx_step2(old, seen=(0, 1, 2), new=(2,)), None)
    influence = -0.0 + log_sum_exp([2.0, 0.0])
    assert parts["influence"] == pytest.approx(influence, rel=1e-6)
    assert value.item() == pytest.approx(math.log(3) + influence, rel=1e-6)


def test_bct_gradients_reach_new_features_but_never_the_old_model():
    old = tiny_net(LinearHead(2, 2))  # deliberately NOT frozen: the method must still not touch it
    new = tiny_net(LinearHead(2, 4), seed=1)
    value, _ = BCTER().loss(new(inputs()), torch.tensor([0, 1, 2, 3]), ctx_step2(old), None)
    value.backward()
    assert all(p.grad is None for p in old.parameters())
    assert new.backbone.weight.grad is not None and new.head.fc.weight.grad is not None


def test_bct_without_old_classes_in_batch_first_step_and_errors():
    old = tiny_net(LinearHead(2, 2)).frozen_copy()
    out = tiny_net(LinearHead(2, 4), seed=1)(inputs())
    value, parts = BCT().loss(out, torch.tensor([2, 3, 2, 3]), ctx_step2(old), None)
    assert parts["influence"] == 0.0
    torch.testing.assert_close(value, F.cross_entropy(out.logits, torch.tensor([2, 3, 2, 3])))
    first, parts = BCT().loss(out, torch.tensor([0, 1, 2, 3]), CTX_STEP1, None)
    torch.testing.assert_close(first, F.cross_entropy(out.logits, torch.tensor([0, 1, 2, 3])))
    assert parts["influence"] == 0.0

    wide_old = tiny_net(LinearHead(5, 2)).frozen_copy()
    with pytest.raises(ValueError, match="same feature size"):
        BCT().loss(out, torch.tensor([0, 1, 2, 3]), ctx_step2(wide_old), None)
    with pytest.raises(ValueError, match="old-head outputs"):
        BCT().loss(out, torch.tensor([0, 1, 2, 3]), ctx_step2(old, seen=(0, 1, 2, 3), new=(3,)), None)


# ---------------------------------------------------------------------------------------------
# old-model methods: first step, contract, detached old outputs


@pytest.mark.parametrize("method", [DSimplexFD(), DSimplexHOC(), MeanAlign()], ids=lambda m: m.name)
def test_first_step_is_plain_cross_entropy(method):
    out = tiny_net(DSimplexHead(4))(inputs())
    targets = torch.tensor([0, 1, 2, 3])
    value, parts = method.loss(out, targets, CTX_STEP1, None)
    torch.testing.assert_close(value, F.cross_entropy(out.logits, targets))
    assert parts["loss"] == pytest.approx(parts["ce"])


@pytest.mark.parametrize("method", [DSimplexFD(), DSimplexHOC(), MeanAlign()], ids=lambda m: m.name)
def test_old_model_methods_need_old_outputs_and_matching_sizes(method):
    old = tiny_net(DSimplexHead(4)).frozen_copy()
    out = tiny_net(DSimplexHead(4), seed=1)(inputs())
    with pytest.raises(ValueError, match="no old outputs"):
        method.loss(out, torch.tensor([0, 1, 2, 3]), ctx_step2(old), None)
    wrong = ModelOutput(torch.zeros(4, 5), torch.zeros(4, 6))
    with pytest.raises(ValueError, match="5-d features"):
        method.loss(out, torch.tensor([0, 1, 2, 3]), ctx_step2(old), wrong)


@pytest.mark.parametrize(
    "method", [DSimplexFD(distill_on="all"), DSimplexHOC(), MeanAlign(alpha=1.0, beta=1.0)], ids=lambda m: m.name
)
def test_no_gradient_flows_into_old_outputs_or_old_model(method):
    old = tiny_net(DSimplexHead(4))  # not frozen on purpose
    x = inputs()
    old_out = old(x)  # computed WITH grad, as a careless loop might
    new = tiny_net(DSimplexHead(4), seed=1)
    value, _ = method.loss(new(x), torch.tensor([0, 1, 2, 0]), ctx_step2(old), old_out)
    value.backward()
    assert old.backbone.weight.grad is None
    assert new.backbone.weight.grad is not None and new.backbone.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# d-Simplex-FD


def test_fd_is_zero_when_features_equal():
    old = tiny_net(DSimplexHead(4)).frozen_copy()
    x = inputs()
    out = old(x)
    targets = torch.tensor([0, 1, 2, 3])
    for distance in ("l2", "cosine"):
        for distill_on in ("all", "old_classes"):
            method = DSimplexFD(distance=distance, distill_on=distill_on)
            value, parts = method.loss(out, targets, ctx_step2(old), out)
            assert parts["distill"] == pytest.approx(0.0, abs=1e-6)
            torch.testing.assert_close(value, F.cross_entropy(out.logits, targets))


def test_fd_by_hand_weight_schedule_and_old_class_subset():
    old = tiny_net(DSimplexHead(3)).frozen_copy()
    new_features = torch.tensor([[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]])
    old_features = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    out = ModelOutput(new_features, torch.zeros(3, 3))  # CE = log 3
    old_out = ModelOutput(old_features, torch.zeros(3, 3))
    targets = torch.tensor([0, 1, 2])
    ctx = StepContext(step=2, seen_classes=(0, 1, 2), new_classes=(2,), old_model=old)  # 2 old, 1 new

    constant = DSimplexFD(weight=2.0, distance="l2", distill_on="all", weight_schedule="constant")
    value, parts = constant.loss(out, targets, ctx, old_out)
    assert parts["distill"] == pytest.approx((5 + 5 + 162) / 3)
    assert value.item() == pytest.approx(math.log(3) + 2.0 * (5 + 5 + 162) / 3, rel=1e-6)

    # old classes only (samples 0 and 1), weight 10 * sqrt(1 new / 2 old)
    scheduled = DSimplexFD(weight=10.0, distance="l2")
    assert scheduled.step_weight(ctx) == pytest.approx(10 / math.sqrt(2))
    value, parts = scheduled.loss(out, targets, ctx, old_out)
    assert parts["distill"] == pytest.approx(5.0)
    assert value.item() == pytest.approx(math.log(3) + 10 / math.sqrt(2) * 5.0, rel=1e-6)

    cosine = DSimplexFD(weight=1.0, weight_schedule="constant")
    _, parts = cosine.loss(out, targets, ctx, old_out)
    # sample 0 against a zero old feature has cosine 0 (F.cosine_similarity's eps), sample 1: 1/sqrt2
    assert parts["distill"] == pytest.approx(((1 - 0) + (1 - 1 / math.sqrt(2))) / 2, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# d-Simplex-HOC


def test_hoc_two_samples_in_2d_by_hand():
    old = tiny_net(DSimplexHead(3)).frozen_copy()  # K = 3, d = 2
    W = dsimplex_prototypes(3)
    new_features = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    old_features = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = ModelOutput(new_features, new_features @ W.T)
    old_out = ModelOutput(old_features, old_features @ W.T)
    targets = torch.tensor([0, 1])
    ctx = StepContext(step=2, seen_classes=(0, 1), new_classes=(1,), old_model=old)

    logits = out.logits.tolist()
    ce = sum(-logits[i][t] + log_sum_exp(logits[i]) for i, t in enumerate([0, 1])) / 2
    rho, lam = 5.0, 0.1
    c = 1 / math.sqrt(2)  # cos(o1, n2) = cos(o2, n2); cos(o1, n1) = 1; cos(o2, n1) = 0
    paper_nce = (-math.log(math.exp(rho) / math.exp(rho * c)) - math.log(math.exp(rho * c) / math.exp(0.0))) / 2
    value, parts = DSimplexHOC(lam=lam, rho=rho, negatives="paper").loss(out, targets, ctx, old_out)
    assert parts["ce"] == pytest.approx(ce, rel=1e-6)
    assert parts["nce"] == pytest.approx(paper_nce, rel=1e-6)
    assert value.item() == pytest.approx(lam * ce + (1 - lam) * paper_nce, rel=1e-6)

    repo_nce = ((-rho + log_sum_exp([0.0, rho * c])) + (-rho * c + log_sum_exp([0.0, 0.0]))) / 2
    value, parts = DSimplexHOC(lam=lam, rho=rho, negatives="repo").loss(out, targets, ctx, old_out)
    assert parts["nce"] == pytest.approx(repo_nce, rel=1e-6)
    assert value.item() == pytest.approx(lam * ce + (1 - lam) * repo_nce, rel=1e-6)


def test_hoc_limits_of_lambda():
    old = tiny_net(DSimplexHead(4)).frozen_copy()
    x = inputs()
    out, old_out = tiny_net(DSimplexHead(4), seed=1)(x), old(x)
    targets = torch.tensor([0, 1, 2, 3])
    only_ce, parts = DSimplexHOC(lam=1.0).loss(out, targets, ctx_step2(old), old_out)
    torch.testing.assert_close(only_ce, F.cross_entropy(out.logits, targets))
    only_nce, parts = DSimplexHOC(lam=0.0).loss(out, targets, ctx_step2(old), old_out)
    assert only_nce.item() == pytest.approx(parts["nce"], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# LCE


def test_mean_align_is_zero_beyond_ce_when_means_align_and_classes_collapse():
    old = tiny_net(LinearHead(2, 2)).frozen_copy()
    features = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]])
    out = ModelOutput(features, torch.zeros(4, 4))
    targets = torch.tensor([0, 0, 1, 3])
    value, parts = MeanAlign(alpha=3.0, beta=2.0).loss(out, targets, ctx_step2(old), ModelOutput(features, out.logits))
    assert parts["align"] == 0.0 and parts["compact"] == 0.0
    assert value.item() == pytest.approx(math.log(4), rel=1e-6)


def test_mean_align_by_hand_aligns_old_classes_only():
    old = tiny_net(LinearHead(2, 2)).frozen_copy()
    new_features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [5.0, 5.0]])
    old_features = torch.zeros(3, 2)
    out = ModelOutput(new_features, torch.zeros(3, 3))
    targets = torch.tensor([0, 0, 2])  # class 2 is new: not aligned, but compacted
    ctx = StepContext(step=2, seen_classes=(0, 1, 2), new_classes=(2,), old_model=old)
    value, parts = MeanAlign(alpha=0.5, beta=3.0).loss(out, targets, ctx, ModelOutput(old_features, out.logits))
    assert parts["align"] == pytest.approx(4.0)  # ||(2, 0) - (0, 0)||^2
    assert parts["compact"] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3
    assert value.item() == pytest.approx(math.log(3) + 0.5 * 4.0 + 3.0 * 2 / 3, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# every registered method, one optimisation step on real networks


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_takes_an_sgd_step_on_a_small_network(name):
    method = build_method(name)
    num_outputs = 4 if method.head == "linear" else 5  # linear: seen classes; fixed: K pre-allocated
    small = dict(backbone="small_cnn", head=method.head, in_channels=1, width=8)
    old = build_model(num_classes=2 if method.head == "linear" else 5, **small).frozen_copy()
    net = build_model(num_classes=num_outputs, seed=1, **small)
    if method.head == "linear":
        net.head.fc.weight.data[:2] = old.head.fc.weight  # as the loop would after expand()
    ctx = ctx_step2(old if method.needs_old_model else None)
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0, 1, 2, 3, 0, 2])
    with torch.no_grad():
        old_out = old(x) if method.needs_old_model else None
    optimiser = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in old.parameters()]
    value, parts = method.loss(net(x), targets, ctx, old_out)
    assert value.ndim == 0 and math.isfinite(value.item())
    assert parts["loss"] == pytest.approx(value.item(), rel=1e-5)
    value.backward()
    optimiser.step()
    assert all(torch.equal(p, b) for p, b in zip(old.parameters(), before))

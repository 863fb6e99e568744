"""The named table cells a reduced-scale run reproduces: the paper's values and convention, and ours.

Values are quoted from ``/work/shared/papers`` (the extractions cite the tables). A cell is either a margin
``C[t, k] - C[k, k]`` of one cross-test (row t = the query model, column k = the gallery model; 0-based here,
``(phi_{t+1}, phi_{k+1})`` in the papers) or the AC of the whole matrix (``cell = None``). The negative control is
the same study's ``independent`` models (trained on their own): a claim whose test does not make them fail cannot
tell a compatible method from an incompatible one. A claim's :class:`Reading` s are the same cells read another way
beside its own (other eval classes, or one part of each cell's items), and its ``notes`` what a reader must know to
weigh the verdict (printed under it, as its deviations are).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.kinds import RANK_TIE_RULES, check_rank_ties

CONTROL = "independent"  # the negative control: independently trained encoders
SCALES = ("smoke", "reduced", "paper")
PARTS = {  # a reading's part of each cell's items (engine.reproduce.outcomes.part_mask): its words in the table
    "trained": "items of classes both models trained",
    "untrained": "items of a class one of the models did not train",
}


@dataclass(frozen=True)
class Reading:
    """The claim's cells under ``eval_classes``, on every item or on one ``part`` of each cell's (:data:`PARTS`), with
    Recall@k's rank-tie rule ``rank_ties`` (the stored matrices' is pessimistic: a tie is a miss; optimistic: a hit)."""

    eval_classes: str
    part: str | None = None
    rank_ties: str = "pessimistic"

    def __post_init__(self) -> None:
        if self.eval_classes not in ("all", "seen"):
            raise ValueError(f"unknown eval classes {self.eval_classes!r}; use all or seen")
        if self.part is not None and self.part not in PARTS:
            raise ValueError(f"unknown part {self.part!r}; use one of {', '.join(PARTS)}")
        check_rank_ties(self.rank_ties)

    @property
    def label(self) -> str:
        words = [self.eval_classes] + ([PARTS[self.part]] if self.part else [])
        return ", ".join(words + ([f"ties {self.rank_ties}"] if self.rank_ties != RANK_TIE_RULES[0] else []))


@dataclass(frozen=True)
class PaperCell:
    """One printed number: ``method``'s margin of cross-test ``cell`` = (t, k), or its AC when ``cell`` is None;
    ``gain``: the paper's own gain behind a margin, M(t, t) - M(k, k) (the denominator of paper 002's Update Gain),
    where the paper prints both self-tests."""

    method: str
    label: str
    value: float
    cell: tuple[int, int] | None = None
    gain: float | None = None


@dataclass(frozen=True)
class Claim:
    """A named table of a paper, reproduced on our closest setting.

    ``paper_convention`` / ``our_convention``: protocol (open / closed set), eval classes (seen / all), gallery
    (instance / template) and metric; ``differs``: every way our setting departs from the paper's;
    ``views``: the stored view read per method (PSP / LSP have their own); ``scenario`` / ``model`` / ``method_params``:
    the study config's sections, ``training`` overrides (the dataset, epochs and seeds come from the scale);
    ``readings``: the same cells read other ways beside ours; ``notes``: printed under the deviations."""

    name: str
    source: str
    paper_convention: dict[str, str]
    our_convention: dict[str, str]
    differs: tuple[str, ...]
    cells: tuple[PaperCell, ...]
    scenario: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    readings: tuple[Reading, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def methods(self) -> tuple[str, ...]:
        """The claim's methods in table order, then the negative control."""
        named = tuple(dict.fromkeys(c.method for c in self.cells))
        return named + ((CONTROL,) if CONTROL not in named else ())

    def view(self, method: str) -> str:
        return self.views.get(method, "encoder")


def _conv(protocol: str, eval_classes: str, gallery: str, metric: str) -> dict[str, str]:
    return {"protocol": protocol, "eval_classes": eval_classes, "gallery": gallery, "metric": metric}


_FASHION = "Fashion-MNIST (10 classes, a small CNN: the scale's backbone) instead of "
# paper 002 Table 2's cells (values and sources: the comment above "P2-Tab2"), shared by its two protocols
P2_TAB2_CELLS = (PaperCell("cores", "(phi2, phi1) margin", 0.02, (1, 0), gain=0.63 - 0.59),
                 PaperCell("cores", "(phi3, phi1) margin", 0.01, (2, 0), gain=0.65 - 0.59),
                 PaperCell("cores", "(phi3, phi2) margin", -0.02, (2, 1), gain=0.65 - 0.63),
                 PaperCell("cores", "AC", 2 / 3),
                 PaperCell("bct", "(phi2, phi1) margin", 0.0, (1, 0), gain=0.61 - 0.59),
                 PaperCell("bct", "(phi3, phi1) margin", -0.01, (2, 0), gain=0.64 - 0.59),
                 PaperCell("bct", "(phi3, phi2) margin", -0.02, (2, 1), gain=0.64 - 0.61),
                 PaperCell("bct", "AC", 1 / 3))
# the closed-set pairs split by the classes' status: all, then its pairs both models trained, then the others
BY_PAIR_TYPE = (Reading("all"), Reading("all", "trained"), Reading("all", "untrained"))
PSP_TEMPERATURE = 12.0  # paper 000 A.9: "a temperature factor of 12 in the cross-entropy loss" (logits / 12)
CLAIMS: dict[str, Claim] = {
    # paper 002 Table 2: CIFAR-100/10, 2 upgrades (34/33/33 % of the classes), open-set CIFAR-10 pair verification.
    # CoReS M: (1,1) 0.59, (2,1) 0.61, (3,1) 0.60, (2,2) 0.63, (3,2) 0.61, (3,3) 0.65 -> margins +2 / +1 / -2, AC 2/3
    # (also Table 11, K = 100: 2-up AC 0.67). BCT M: (1,1) 0.59, (2,1) 0.59 (marked as passing), (3,1) 0.58,
    # (2,2) 0.61, (3,2) 0.59, (3,3) 0.64 -> margins 0 / -1 / -2, AC 1/3.
    "P2-Tab2": Claim(
        name="P2-Tab2", source="paper 002 (CoReS) Tab. 2, CIFAR-100/10, 2 upgrades, SENet-18, d-Simplex K = 100",
        paper_convention=_conv("open-set (CIFAR-10 pairs)", "all", "pairs", "verification"),
        our_convention=_conv("closed-set (test pairs)", "seen", "pairs", "verification"),
        differs=(_FASHION + "CIFAR-100 / SENet-18; 4 + 3 + 3 classes for 34 + 33 + 33",
                 "closed-set test pairs of the gallery model's classes (eval classes seen) for open-set CIFAR-10 pairs "
                 "(Fashion-MNIST has no disjoint 1-channel open-set partner here): in both, the two models of a "
                 "cross-test share each pair's classes' status (here both trained them, there neither did); eval "
                 "classes all mixes in classes only the newer model trained (rows below: all, then split by pair type)",
                 "d-Simplex of K = 10 (the classes) for K = 100; Frobenius scaling and best-validation epoch as paper "
                 "002's released code, for BCT and the control too (one study)"),
        cells=P2_TAB2_CELLS,
        scenario=dict(initial_classes=4, increment=3, num_steps=3),
        model=dict(dsimplex_normalization="frobenius_uncentred"),
        training=dict(select="best_val"),  # paper 002's released code keeps each step's best-validation epoch
        readings=BY_PAIR_TYPE,
        notes=("the paper's margins presume upgrades that are better at the evaluation (its own gains: +4 / +6 / +2 "
               "points); under seen a newer model must also tell the old classes from the ones it added, and may be "
               "worse on them than the old model was (the own gain column measures it): the open-set variant "
               "P2-Tab2-open tests on classes no model trained, as the paper does",),
    ),
    # The same cells on paper 002's protocol: open-set pairs, here from 3 Fashion-MNIST classes no model trains on
    # (scenario.held_out_classes; the class order's seed names them), 3 + 2 + 2 trained classes for 34 + 33 + 33 %.
    "P2-Tab2-open": Claim(
        name="P2-Tab2-open", source="paper 002 (CoReS) Tab. 2, CIFAR-100/10, 2 upgrades, SENet-18, d-Simplex K = 100",
        paper_convention=_conv("open-set (CIFAR-10 pairs)", "all", "pairs", "verification"),
        our_convention=_conv("open-set (3 held-out classes' pairs)", "all", "pairs", "verification"),
        differs=(_FASHION + "CIFAR-100 / SENet-18; 3 + 2 + 2 trained classes for 34 + 33 + 33, 3 held out",
                 "open-set pairs from 3 held-out Fashion-MNIST classes (query: their training images, gallery: their "
                 "test images) for CIFAR-10's test pairs",
                 "d-Simplex of K = 7 (the trained classes) for K = 100; Frobenius scaling and best-validation epoch as "
                 "paper 002's released code, for BCT and the control too (one study)"),
        cells=P2_TAB2_CELLS,
        scenario=dict(initial_classes=3, increment=2, num_steps=3, held_out_classes=3),
        model=dict(dsimplex_normalization="frobenius_uncentred"),
        training=dict(select="best_val"),
    ),
    # paper 000 Table 1a: CIFAR-100, ResNet18, Recall@1 (AC only is printed). The 2-step column (50 + 50 classes):
    # PSP 1, LSP 1, BCT 1, CoReS 0, Baseline 0. Its 5-step column (PSP 0.90, LSP 0.70, BCT 0.40, CoReS 0) would
    # need 2 classes a step here, where a 2-class model's PSP feature takes two values and ties decide Recall@1.
    # Eval classes: the paper does not say; its baseline's AA (29.63 at 2 steps, 2.29 at 50) fits all test classes.
    "P0-Tab1a": Claim(
        name="P0-Tab1a", source="paper 000 (PSP) Tab. 1a, CIFAR-100, 2 steps, ResNet18",
        paper_convention=_conv("closed-set", "all (not said; the baseline's AA fits all)", "instance", "recall@1"),
        our_convention=_conv("closed-set", "all", "instance", "recall@1"),
        differs=(_FASHION + "CIFAR-100 / ResNet18; 5 + 5 classes for 50 + 50 (the 2-step column: the 5-step one "
                 "needs 2-class models, whose PSP feature takes two values, so ties decide it)",
                 "PSP / LSP trained at temperature 12 as paper 000 A.9 (logits / 12), the stored softmax at that "
                 "temperature too (the other reading of A.9): the plain softmax of a model that fits its training "
                 "images at temperature 12 is one-hot in float32 for most images, so ties would decide Recall@1",
                 "eval classes seen beside ours (rows below): the paper does not say which"),
        notes=("a model that fits its training images gives a softmax that is one-hot to float32 precision for many "
               "test images, so PSP features tie (a negative scores exactly the best positive); the rows are given "
               "under both tie rules (pessimistic: a tie is a miss, as stored; optimistic: a hit): a verdict both "
               "give does not depend on how ties are broken (the paper's faiss search breaks them arbitrarily)",),
        cells=(PaperCell("psp", "AC", 1.0), PaperCell("lsp", "AC", 1.0), PaperCell("bct", "AC", 1.0),
               PaperCell("cores", "AC", 0.0)),
        scenario=dict(initial_classes=5, increment=5, num_steps=2),
        views={"psp": "psp", "lsp": "lsp"},
        method_params={m: {"temperature": PSP_TEMPERATURE, "extraction_temperature": "training"} for m in ("psp", "lsp")},
        readings=(Reading("all", rank_ties="optimistic"), Reading("seen"), Reading("seen", rank_ties="optimistic")),
    ),
    # paper 001 Table II: CL2R on CIFAR-100/10, 2 tasks (10 + 90 classes), fine-tuning with replay (20 images a
    # class), 1:N search on open-set CIFAR-10 against class-mean templates; AC 1 for every method in the 2-task column
    # (ER, FAN, BCT-ER, LCE-ER, AdvBCT-ER, CVS, d-Simplex-FD, d-Simplex-HOC). Sec. 6: lambda 0.1, rho 5 for CIFAR.
    # The 7 / 16 / 31-task columns, where HOC stands apart, need more classes than Fashion-MNIST has.
    "P1-TabII": Claim(
        name="P1-TabII", source="paper 001 (CL2R) Tab. II, CIFAR-100/10, 2 tasks, ResNet32",
        paper_convention=_conv("open-set (CIFAR-10)", "all", "template", "recall@1"),
        our_convention=_conv("open-set (3 held-out classes)", "all", "template", "recall@1"),
        differs=(_FASHION + "CIFAR-100 / ResNet32; 4 + 3 trained classes for 10 + 90, 3 held out",
                 "open-set search on 3 held-out Fashion-MNIST classes (query: their training images, gallery: class "
                 "means of their test images) for CIFAR-10",
                 "d-Simplex of K = 7 (the trained classes) for K = 100",
                 "only the 2-task column: 7 / 16 / 31 tasks need more than 10 classes"),
        cells=(PaperCell("dsimplex_hoc", "AC", 1.0), PaperCell("er", "AC", 1.0), PaperCell("bct_er", "AC", 1.0)),
        scenario=dict(initial_classes=4, increment=3, num_steps=2, held_out_classes=3, training="finetune",
                      replay_per_class=20),
        method_params={"dsimplex_hoc": {"lam": 0.1, "rho": 5.0}},  # paper 001 Sec. 6, CIFAR-100/10
        notes=("in the paper's 2-task column every method has AC 1, plain replay (ER) included, so this column "
               "cannot single out HOC: it tests that fine-tuning once with replay keeps compatibility",),
    ),
}
GROUPS = {"demo": ("P2-Tab2", "P2-Tab2-open", "P0-Tab1a", "P1-TabII")}  # `reproduce demo --table`: the README's rows


def claim_names(name: str) -> tuple[str, ...]:
    """The claims a NAME stands for (a claim or a group); one-line ValueError for an unknown one."""
    if name in CLAIMS:
        return (name,)
    if name in GROUPS:
        return GROUPS[name]
    raise ValueError(f"unknown table cell {name!r}; known: {', '.join([*CLAIMS, *GROUPS])}")

"""How often is check-upgrade's verdict wrong? Synthetic upgrades whose true gap is known, judged as check-upgrade judges.

Each *configuration* is a population (Gaussian classes in a small latent space; an old and a new embedding of
every item) plus the sizes a user has (queries, gallery items). Its **true gap** is the expected paired
difference the check estimates: new-query/old-gallery Recall@1 minus old/old, per query, when the queries
and the gallery are both drawn from the population at the user's sizes,

    gap = E_{Q, G ~ population} [ sum_q valid_q (hit_new/old(q; G) - hit_old/old(q; G)) ] / E [ sum_q valid_q ]

(valid: the query's class has an item in G). It is computed on ``TRUTH_DRAWS`` = 100 independent draws of
the gallery at the sample's size (each with up to 1,000 queries): a population 100x the gallery the check
sees. Not one 100x gallery: Recall@1 rises with the gallery's density, so a 100x gallery answers another
question than the one a sample of n_g items can estimate. Its standard error is printed.

Each configuration is then sampled ``replicates`` times; each sample goes through
:func:`engine.upgrade.verdict.check_upgrade` (the function check-upgrade calls, default options; the
backfill curves are skipped: ``orderings=()``, which does not touch the verdict) and, for comparison, the
interval check-upgrade computed before (percentile bootstrap over the queries alone). A verdict is false
when it says "compatible" and the true gap is <= 0 (strict ECC), or "not compatible" and the true gap is > 0.

    OMP_NUM_THREADS=1 python bench/calibrate_verdict.py            # >= 500 scenarios, a few minutes on one core
    python bench/calibrate_verdict.py --configs 2 --replicates 2   # a quick look
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.metrics.compatibility import CellFeatures
from engine.upgrade.evidence import clopper_pearson_upper
from engine.upgrade.rule import Rule
from engine.upgrade.verdict import check_upgrade, compare, per_query_scores

DIM = 16
TRUTH_DRAWS = 100
TRUTH_QUERIES = 1000
# (queries, gallery items) a user has, and how often a configuration gets them
SIZES = ((200, 200), (400, 1000), (1000, 1000), (2000, 2000), (2000, 2000), (2000, 5000))
BIG = (20000, 2000)
TARGETS = {"false_compatible": 0.05, "false_not_compatible": 0.05, "coverage": 0.93, "too_close": 0.20}


@dataclass(frozen=True)
class Population:
    """Gaussian classes in a DIM-d latent space; the old and the new model's embeddings of an item."""

    family: str
    variant: str
    centers: np.ndarray  # (C, d)
    weights: np.ndarray  # (C,) class probabilities
    spread: np.ndarray  # (d,) per-direction scale of the within-class and model noise (anisotropy)
    sigma: float = 1.0  # within-class spread of the items (the image)
    old_noise: float = 0.6  # each model's own noise on an item (fresh for the new model unless reuse_old)
    new_noise: float = 0.6
    reuse_old: bool = False  # new = map(old features): a rotation or quantisation of the old model itself
    new_map: np.ndarray | None = None  # (d, d') linear map of the new features
    shift: np.ndarray | None = None  # (C, d): class drift of the new model
    quant: str | None = None  # "fp16" | "int8" (per-tensor scale)
    scale: float = 1.0  # int8 scale
    offset: np.ndarray = field(default_factory=lambda: np.zeros(DIM))  # common direction (text-like cone)

    def draw(self, rng: np.random.Generator, n: int, *, new_too: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(labels, old features, new features)`` of n items drawn from the population (new: None unless ``new_too``)."""
        labels = rng.choice(len(self.weights), size=n, p=self.weights)
        normal = lambda: rng.standard_normal(size=(n, DIM), dtype=np.float32) * self.spread  # noqa: E731
        x = self.centers[labels] + self.sigma * normal() + self.offset
        old = x + self.old_noise * normal()
        if not new_too:
            return labels, old.astype(np.float32), None
        new = old if self.reuse_old else x + self.new_noise * normal()
        if self.shift is not None:
            new = new + self.shift[labels]
        if self.new_map is not None:
            new = new @ self.new_map
        if self.quant == "fp16":
            new = new.astype(np.float16)
        elif self.quant == "int8":
            new = np.clip(np.round(new / self.scale), -127, 127) * self.scale
        return labels, old.astype(np.float32), new.astype(np.float32)


def _rotation(rng: np.random.Generator, theta_deg: float) -> np.ndarray:
    """A rotation that turns every vector by theta: the same angle in d/2 orthogonal planes of a random basis."""
    q, _ = np.linalg.qr(rng.normal(size=(DIM, DIM)))
    t = math.radians(theta_deg)
    block = np.zeros((DIM, DIM))
    for i in range(0, DIM, 2):
        block[i:i + 2, i:i + 2] = [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]
    return q @ block @ q.T


def _base(rng: np.random.Generator, classes: int = 50, *, zipf: float = 0.0, spectrum: float = 0.0) -> dict:
    centers = rng.normal(size=(classes, DIM)) * 1.2
    weights = np.arange(1, classes + 1, dtype=float) ** -zipf
    spread = np.arange(1, DIM + 1, dtype=float) ** -spectrum
    spread = spread / np.sqrt(np.mean(spread ** 2))
    return {"centers": centers * spread, "weights": weights / weights.sum(), "spread": spread}


def _noise(rng, v):  # the same space, less or more noise than the old model's 0.6
    return Population("noise", f"new noise {v:g}", **_base(rng), new_noise=v)


def _rotate(rng, v):  # the old model's features rotated by v degrees, with a less noisy new model (0.45)
    return Population("rotation", f"{v:g} deg", **_base(rng), new_noise=0.45, new_map=_rotation(rng, v), reuse_old=v == 0)


def _drift(rng, v):  # a fraction v of the classes moves in the new space; the new model is less noisy
    base = _base(rng)
    moved = rng.random(len(base["centers"])) < v
    shift = rng.normal(size=base["centers"].shape) * 1.2 * moved[:, None]
    return Population("drift", f"{v:.0%} classes", **base, new_noise=0.5, shift=shift)


def _quant(rng, v):  # v = "fp16" | "int8" | "int8 coarse": the old model's own features, quantised
    base = _base(rng)
    scale = 6.0 / 127 * (8 if "coarse" in v else 1)
    return Population("quantised", v, **base, reuse_old=True, quant=v.split()[0], scale=scale)


def _imbalance(rng, v):  # Zipf class sizes (exponent 1.5: the largest class ~ 40% of the items)
    return Population("imbalance", f"new noise {v:g}", **_base(rng, zipf=1.5), new_noise=v)


def _anisotropic(rng, v):  # a few dominant directions and a common offset (a text-like cone)
    base = _base(rng, spectrum=1.0)
    return Population("anisotropic", f"new noise {v:g}", **base, new_noise=v, offset=2.0 * base["spread"] * rng.normal(size=DIM))


def _few(rng, v):
    return Population("5 classes", f"new noise {v:g}", **_base(rng, classes=5), sigma=2.0, new_noise=v)


def _many(rng, v):
    return Population("500 classes", f"new noise {v:g}", **_base(rng, classes=500), sigma=0.6, old_noise=0.3, new_noise=v)


def _dims(rng, v):  # a new model of another dimension: no common space, check-upgrade refuses
    return Population("dimension change", f"16 -> {v}", **_base(rng), new_map=rng.normal(size=(DIM, v)) / 4)


FAMILIES: dict[str, tuple[Callable, Sequence]] = {
    "noise": (_noise, (0.3, 0.45, 0.55, 0.6, 0.65, 0.75, 0.9)),
    "rotation": (_rotate, (0, 5, 10, 20, 30, 45, 60, 90)),
    "drift": (_drift, (0.0, 0.05, 0.1, 0.2, 0.4)),
    "quantised": (_quant, ("fp16", "int8", "int8 coarse")),
    "imbalance": (_imbalance, (0.4, 0.55, 0.6, 0.7, 0.9)),
    "anisotropic": (_anisotropic, (0.4, 0.55, 0.6, 0.7, 0.9)),
    "5 classes": (_few, (0.4, 0.55, 0.6, 0.7, 0.9)),
    "500 classes": (_many, (0.15, 0.25, 0.3, 0.35, 0.5)),
    "dimension change": (_dims, (24,)),
}


def _hits(q: np.ndarray, q_labels: np.ndarray, g: np.ndarray, g_labels: np.ndarray) -> np.ndarray:
    """Recall@1 hit of each query (cosine; continuous features, so no ties)."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    return g_labels[np.argmax(qn @ gn.T, axis=1)] == q_labels


def true_gap(pop: Population, n_q: int, n_g: int, rng: np.random.Generator, draws: int = TRUTH_DRAWS) -> tuple[float, float]:
    """``(gap, standard error)`` over ``draws`` independent galleries of ``n_g`` items (see the module docstring)."""
    num, den = np.zeros(draws), np.zeros(draws)
    for i in range(draws):
        gl, g_old, _ = pop.draw(rng, n_g, new_too=False)
        ql, q_old, q_new = pop.draw(rng, min(n_q, TRUTH_QUERIES))
        valid = np.isin(ql, gl)
        num[i] = np.sum(valid * (_hits(q_new, ql, g_old, gl).astype(float) - _hits(q_old, ql, g_old, gl)))
        den[i] = valid.sum()
    gap = num.sum() / den.sum()
    per_draw = (num - gap * den) / den.mean()  # linearised ratio estimator
    return float(gap), float(per_draw.std(ddof=1) / math.sqrt(draws))


@dataclass
class Outcome:
    family: str
    variant: str
    n_q: int
    n_g: int
    gap: float
    gap_se: float
    verdict: str | None  # None: refused
    lo: float = math.nan
    hi: float = math.nan
    q_lo: float = math.nan  # the query-only interval
    q_hi: float = math.nan
    q_verdict: str | None = None


def run_config(pop: Population, n_q: int, n_g: int, replicates: int, rng: np.random.Generator,
               truth_draws: int = TRUTH_DRAWS) -> list[Outcome]:
    """The true gap of one configuration, then ``replicates`` checks of fresh samples."""
    out = []
    gap, se = (math.nan, math.nan) if pop.new_map is not None and pop.new_map.shape[1] != DIM else \
        true_gap(pop, n_q, n_g, rng, truth_draws)
    for _ in range(replicates):
        gl, g_old, g_new = pop.draw(rng, n_g)
        ql, q_old, q_new = pop.draw(rng, n_q)
        old, new = CellFeatures(q_old, ql, g_old, gl), CellFeatures(q_new, ql, g_new, gl)
        try:
            report = check_upgrade(old, new, names=("old", "new"), orderings=())
        except ValueError as exc:
            if "dimensions" not in str(exc):
                raise
            out.append(Outcome(pop.family, pop.variant, n_q, n_g, gap, se, None))
            continue
        c = report.compatibility
        oo = per_query_scores(q_old, ql, g_old, gl)
        no = per_query_scores(q_new, ql, g_old, gl)
        qc = compare(no, oo, rule=Rule())  # check-upgrade --interval queries
        out.append(Outcome(pop.family, pop.variant, n_q, n_g, gap, se, c.verdict, c.lo, c.hi, qc.lo, qc.hi, qc.verdict))
    return out


def plan(configs: int, seed: int, families: Sequence[str] | None = None, sizes: Sequence[tuple[int, int]] = SIZES,
         big: int = 2) -> list[tuple[str, object, tuple[int, int]]]:
    """(family, variant, sizes) of every configuration: each family's variants cycled, sizes cycled; ``big`` at BIG."""
    rng = np.random.default_rng(seed)
    out = []
    for name in families or FAMILIES:
        variants = FAMILIES[name][1]
        n = 2 if name == "dimension change" else configs
        order = rng.permutation(len(sizes) * max(1, math.ceil(n / len(sizes))))
        for i in range(n):
            out.append((name, variants[i % len(variants)], sizes[order[i] % len(sizes)]))
    for i in range(big):
        name = ("noise", "drift")[i % 2]
        out.append((name, FAMILIES[name][1][1 + i], BIG))
    return out


def run(configs: int = 13, replicates: int = 5, seed: int = 0, families: Sequence[str] | None = None,
        sizes: Sequence[tuple[int, int]] = SIZES, big: int = 2, truth_draws: int = TRUTH_DRAWS,
        progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Every scenario's outcome (configurations from :func:`plan`, seeded)."""
    rng = np.random.default_rng(seed + 1)
    out: list[Outcome] = []
    for i, (name, variant, (n_q, n_g)) in enumerate(plan(configs, seed, families, sizes, big)):
        pop = FAMILIES[name][0](np.random.default_rng([seed, i]), variant)
        out += run_config(pop, n_q, n_g, replicates if (n_q, n_g) != BIG else 2, rng, truth_draws)
        if progress:
            progress(f"{i + 1} configurations, {len(out)} scenarios")
    return out


def rates(outcomes: Sequence[Outcome], *, interval: str = "two-way") -> dict[str, tuple[int, int]]:
    """(count, denominator) of each rate: false compatible, false not compatible, too close, coverage."""
    judged = [o for o in outcomes if o.verdict is not None]
    pick = (lambda o: (o.verdict, o.lo, o.hi)) if interval == "two-way" else (lambda o: (o.q_verdict, o.q_lo, o.q_hi))
    neg = [pick(o)[0] for o in judged if o.gap <= 0]
    pos = [pick(o)[0] for o in judged if o.gap > 0]
    decisive = [pick(o)[0] for o in judged if abs(o.gap) >= 0.02 and min(o.n_q, o.n_g) >= 2000]
    return {"false_compatible": (neg.count("compatible"), len(neg)),
            "false_not_compatible": (pos.count("not compatible"), len(pos)),
            "too_close": (decisive.count("too close to call"), len(decisive)),
            "coverage": (sum(pick(o)[1] <= o.gap <= pick(o)[2] for o in judged), len(judged)),
            "refused": (sum(o.verdict is None for o in outcomes), len(outcomes))}


def _cell(pair: tuple[int, int], bound: bool = False) -> str:
    """``k/n`` as a percentage; ``bound``: with its one-sided 95 % Clopper-Pearson upper bound (0/272 allows 1.1 %)."""
    k, n = pair
    if not n:
        return "–"
    return f"{100 * k / n:5.1f}% ({k}/{n}" + (f"; <= {100 * clopper_pearson_upper(k, n):.1f}%)" if bound else ")")


def table(outcomes: Sequence[Outcome]) -> str:
    """The per-family and overall table (Markdown)."""
    head = ("| family | scenarios | true gap range (pts) | false compatible (95% upper bound) | false not compatible "
            "(95% upper bound) | too close, gap >= 2 pts, n >= 2,000 (95% upper bound) | coverage of the 95% interval "
            "| coverage, old interval (queries only) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    groups = {}
    for o in outcomes:
        groups.setdefault(o.family, []).append(o)
    for name, group in [*groups.items(), ("**all**", list(outcomes))]:
        r, q = rates(group), rates(group, interval="queries")
        gaps = [o.gap for o in group if not math.isnan(o.gap)]
        span = f"{100 * min(gaps):+.1f} to {100 * max(gaps):+.1f}" if gaps else "–"
        if r["refused"][0] == len(group):
            lines.append(f"| {name} | {len(group)} | – | refused: {r['refused'][0]}/{len(group)} (different dimensions) | | | | |")
            continue
        lines.append(f"| {name} | {len(group)} | {span} | {_cell(r['false_compatible'], True)} | "
                     f"{_cell(r['false_not_compatible'], True)} | {_cell(r['too_close'], True)} | {_cell(r['coverage'])} | "
                     f"{_cell(q['coverage'])} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", type=int, default=13, help="configurations per family (default 13)")
    p.add_argument("--replicates", type=int, default=5, help="samples checked per configuration (default 5)")
    p.add_argument("--big", type=int, default=2, help=f"configurations at {BIG[0]:,} queries x {BIG[1]:,} gallery items")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    start = time.perf_counter()
    outcomes = run(args.configs, args.replicates, args.seed, big=args.big,
                   progress=lambda s: print(f"\r{s} ({time.perf_counter() - start:.0f} s)", end="", file=sys.stderr, flush=True))
    print(file=sys.stderr)
    print(table(outcomes))
    r = rates(outcomes)
    worst_se = max((o.gap_se for o in outcomes if not math.isnan(o.gap_se)), default=math.nan)
    print(f"\n{len(outcomes)} scenarios ({r['refused'][0]} refused) in {time.perf_counter() - start:.0f} s; "
          f"true gaps from {TRUTH_DRAWS} galleries per configuration (largest standard error {100 * worst_se:.2f} pts)")
    met = {k: (r[k][0] / r[k][1] <= t if k != "coverage" else r[k][0] / r[k][1] >= t) if r[k][1] else True
           for k, t in TARGETS.items()}
    print("targets " + ("met" if all(met.values()) else "NOT met: " + ", ".join(k for k, v in met.items() if not v)))
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Post-hoc maps from the new embedding space to the old one, fitted on N paired embeddings (issue 29).

``fit_map(kind, new, old, normalise=..., options=...)`` -> :class:`PosthocMap`; ``map.apply(new)`` gives
adapted queries to search the old index with. Row ``i`` of ``new`` and of ``old`` embed the same item. Every
map acts on row vectors, ``y = x W (+ b)`` with ``W`` of shape ``(new_dim, old_dim)``; fits run in float64, the
stored tensors and :meth:`PosthocMap.apply` are float32 (what the ONNX graph computes).

``normalise="l2"`` (default): the new rows are scaled to unit length before the map and the outputs after it, and
the maps are fitted on unit rows of both spaces (cosine retrieval); ``"none"`` maps the raw vectors.

Kinds (:data:`POSTHOC`; each with a frozen options class, unknown options refused):

* ``procrustes``: the orthogonal ``W`` minimising ``||N W - O||_F`` (closed form ``W = U V^T`` from the SVD
  ``N^T O = U S V^T``). When the widths differ, ``dim_mismatch``:
  ``"pad"`` (default) zero-pads the narrower side; this is the same ``W = U V^T`` of the thin SVD (a
  semi-orthogonal map: an isometry of the new space into the old when ``new_dim <= old_dim``, else a rotation
  followed by dropping ``new_dim - old_dim`` directions); ``"project"`` first projects the wider side onto its
  ``min(new_dim, old_dim)`` principal directions on the pairs (uncentred), fits a square rotation there, and maps
  back to old coordinates (``W = P R`` or ``R P^T``).
* ``affine``: ridge regression ``W, b = argmin ||N W + b - O||^2 + ridge ||W||^2`` (bias not penalised; the
  closed form on centred data, as scikit-learn's ``Ridge(alpha=ridge)``).
* ``cluster``: per-cluster Procrustes. k-means (scikit-learn, seeded) on the old vectors of the pairs; one
  Procrustes per cluster on its members (clusters with fewer than ``min_members`` pairs use the global one). A
  query is routed by its global-Procrustes image: the cosine ``s_c`` to each unit centroid; ``routing="hard"``
  uses the cluster of the largest ``s_c`` (the first on a tie), ``"soft"`` mixes the cluster maps with weights
  ``softmax(s / temperature)``.
* ``mlp``: a low-rank residual MLP on top of the Procrustes map, ``y = x W0 + relu(x A + a) B + b`` with ``W0``
  the (fixed) Procrustes solution, ``A`` (new_dim, rank) and ``B`` (rank, old_dim) trained by Adam on the mean
  squared error to the old vectors for ``epochs`` passes (seeded init and batch order; ``B`` starts at zero, so
  training starts at Procrustes).
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.adapters.inputs import as_features, check_same_rows

NORMALISE = ("l2", "none")
EPS = 1e-12  # a zero row stays zero under the L2 normalisation (divided by max(norm, EPS))
APPLY_BLOCK_ROWS = 65536


# ----------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class ProcrustesOptions:
    """``dim_mismatch``: "pad" or "project" (see the module docstring)."""

    dim_mismatch: str = "pad"

    def __post_init__(self) -> None:
        if self.dim_mismatch not in ("pad", "project"):
            raise ValueError(f"procrustes option dim_mismatch must be 'pad' or 'project', got {self.dim_mismatch!r}")


@dataclass(frozen=True)
class AffineOptions:
    """``ridge``: the L2 penalty on ``W`` (0 = least squares)."""

    ridge: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.ridge) and self.ridge >= 0):
            raise ValueError(f"affine option ridge must be a finite number >= 0, got {self.ridge!r}")


# ceilings of the options: a bound stated, not a machine's luck (a rank of 10^8 or 10^9 epochs is a refusal, not a hang)
MAX_CLUSTERS, MAX_RANK, MAX_EPOCHS, MAX_BATCH, MAX_LR = 4096, 8192, 10_000, 1 << 20, 10.0
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 100.0
MAX_ABS_WEIGHT, MIN_SCALE = 1e6, 1e-6  # a map's weights: finite, at most this large, its largest at least this


def check_tensors(tensors: Mapping[str, np.ndarray], where: str) -> None:
    """A map's weights are numbers it can apply in float32: finite, none above :data:`MAX_ABS_WEIGHT` in magnitude
    (identity x 3e38 overflows), each not all below :data:`MIN_SCALE` (x 1e-30 underflows: the outputs lose their unit
    length); one line otherwise (a diverging fit, a tampered file)."""
    for name, t in tensors.items():
        a = np.asarray(t, np.float64)
        if not np.isfinite(a).all():
            raise ValueError(f"{where}: weights {name} hold {int((~np.isfinite(a)).sum())} NaN or infinite values "
                             "(a fit that diverged, or a damaged file)")
        big = float(np.abs(a).max()) if a.size else 0.0
        if big > MAX_ABS_WEIGHT:
            raise ValueError(f"{where}: weights {name} reach {big:.3g}, above {MAX_ABS_WEIGHT:g} (float32 would overflow)")
        if a.size and a.ndim == 2 and big < MIN_SCALE:
            raise ValueError(f"{where}: weights {name} are all below {MIN_SCALE:g} (float32 would underflow)")


@dataclass(frozen=True)
class ClusterOptions:
    """``clusters`` k-means clusters on the old space, ``routing`` hard/soft, ``temperature`` of the soft routing,
    ``min_members`` pairs a cluster needs for its own map, ``seed`` of k-means."""

    clusters: int = 8
    routing: str = "hard"
    temperature: float = 0.05
    min_members: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.clusters <= MAX_CLUSTERS:
            raise ValueError(f"cluster option clusters must be from 1 to {MAX_CLUSTERS}, got {self.clusters}")
        if self.routing not in ("hard", "soft"):
            raise ValueError(f"cluster option routing must be 'hard' or 'soft', got {self.routing!r}")
        if not (np.isfinite(self.temperature) and MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"cluster option temperature must be a number from {MIN_TEMPERATURE:g} to "
                             f"{MAX_TEMPERATURE:g} (a softmax over cosines in float32), got {self.temperature!r}")
        if self.min_members < 1:
            raise ValueError(f"cluster option min_members must be at least 1, got {self.min_members}")


@dataclass(frozen=True)
class MlpOptions:
    """``rank`` hidden units, ``epochs``, ``batch_size``, ``lr`` (Adam), ``weight_decay``, ``seed``."""

    rank: int = 64
    epochs: int = 30
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, high in (("rank", MAX_RANK), ("epochs", MAX_EPOCHS), ("batch_size", MAX_BATCH)):
            if not 1 <= getattr(self, name) <= high:
                raise ValueError(f"mlp option {name} must be from 1 to {high:,}, got {getattr(self, name)}")
        if not (np.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
            raise ValueError(f"mlp option lr must be a number in (0, {MAX_LR:g}], got {self.lr!r}")
        if not (np.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"mlp option weight_decay must be a number >= 0, got {self.weight_decay!r}")


# ----------------------------------------------------------------------------------------------- the map
@dataclass
class PosthocMap:
    """A fitted map: its kind, widths, normalisation, options, float32 tensors and where it was fitted."""

    kind: str
    new_dim: int
    old_dim: int
    normalise: str
    options: Any
    tensors: dict[str, np.ndarray]
    fitted_on: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    def apply(self, new: np.ndarray, *, block_rows: int = APPLY_BLOCK_ROWS) -> np.ndarray:
        """New vectors (n, new_dim) mapped into the old space: float32 (n, old_dim), computed in blocks of rows."""
        x = np.asarray(new)
        if x.ndim != 2 or x.shape[1] != self.new_dim:
            raise ValueError(f"this adapter maps {self.new_dim}-d new vectors, got an array of shape {x.shape}")
        out = np.empty((len(x), self.old_dim), np.float32)
        for lo in range(0, len(x), block_rows):
            block = x[lo: lo + block_rows].astype(np.float32, copy=False)
            if not np.isfinite(block).all():
                raise ValueError(f"rows {lo}..{lo + len(block) - 1} hold a NaN or infinite value")
            y = self.apply_block(block)
            if not np.isfinite(y).all():  # checked before anything is written
                raise ValueError(f"the {self.kind} adapter maps rows {lo}..{lo + len(block) - 1} to NaN or infinite "
                                 "values; nothing was written")
            out[lo: lo + len(block)] = y
        return out

    def apply_block(self, x: np.ndarray) -> np.ndarray:
        """One float32 block through the map (normalisation included), as the ONNX graph computes it."""
        if self.normalise == "l2":
            x = l2_rows(x)
        y = POSTHOC[self.kind].apply(x, self.tensors, self.options)
        return l2_rows(y) if self.normalise == "l2" else y.astype(np.float32, copy=False)


def l2_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by ``max(||row||, EPS)``, returned in float32 (the ONNX graph's normalisation). The norm is taken
    in float64: in float32 a row above about 1.8e19 squares to infinity and becomes all zeros (issue 44), where the
    ONNX graph, in float32, would overflow the same way; below that the two agree to float32 rounding."""
    x64 = np.asarray(x, np.float64)
    norms = np.sqrt(np.sum(x64 * x64, axis=1, keepdims=True))
    return (x64 / np.maximum(norms, EPS)).astype(np.float32)


def _unit64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), EPS)


# ----------------------------------------------------------------------------------------------- fits
def procrustes_weight(new: np.ndarray, old: np.ndarray, dim_mismatch: str = "pad",
                      weights: np.ndarray | None = None) -> np.ndarray:
    """The (new_dim, old_dim) orthogonal / semi-orthogonal ``W`` minimising ``||N W - O||_F`` (float64).

    ``weights`` (n,) weighs each pair's squared error (None: all 1).
    """
    n, o = np.asarray(new, np.float64), np.asarray(old, np.float64)
    if weights is not None:
        n = n * np.sqrt(weights)[:, None]
        o = o * np.sqrt(weights)[:, None]
    dn, do = n.shape[1], o.shape[1]
    if dim_mismatch == "project" and dn != do:
        m = min(dn, do)
        if dn > do:
            basis = np.linalg.svd(n, full_matrices=False)[2][:m].T  # (dn, m) principal directions of the new side
            return basis @ _rotation(n @ basis, o)
        basis = np.linalg.svd(o, full_matrices=False)[2][:m].T  # (do, m) of the old side
        return _rotation(n, o @ basis) @ basis.T
    return _rotation(n, o)


def _rotation(n: np.ndarray, o: np.ndarray) -> np.ndarray:
    u, _, vt = np.linalg.svd(n.T @ o, full_matrices=False)
    return u @ vt


def _fit_procrustes(new: np.ndarray, old: np.ndarray, opts: ProcrustesOptions) -> dict[str, np.ndarray]:
    return {"weight": procrustes_weight(new, old, opts.dim_mismatch)}


def _fit_affine(new: np.ndarray, old: np.ndarray, opts: AffineOptions) -> dict[str, np.ndarray]:
    mean_n, mean_o = new.mean(0), old.mean(0)
    nc, oc = new - mean_n, old - mean_o
    if opts.ridge > 0:
        weight = np.linalg.solve(nc.T @ nc + opts.ridge * np.eye(new.shape[1]), nc.T @ oc)
    else:
        weight = np.linalg.lstsq(nc, oc, rcond=None)[0]
    return {"weight": weight, "bias": mean_o - mean_n @ weight}


def _fit_cluster(new: np.ndarray, old: np.ndarray, opts: ClusterOptions) -> dict[str, np.ndarray]:
    if opts.clusters > len(new):
        raise ValueError(f"cluster option clusters={opts.clusters} is more than the {len(new)} pairs to fit on")
    from sklearn.cluster import KMeans  # loaded by kind_of("cluster") before any fit is timed

    route = procrustes_weight(new, old)
    km = KMeans(n_clusters=opts.clusters, n_init=3, random_state=opts.seed).fit(old)
    centroids = _unit64(km.cluster_centers_)
    maps = []
    for c in range(opts.clusters):
        members = km.labels_ == c
        maps.append(procrustes_weight(new[members], old[members]) if members.sum() >= opts.min_members else route)
    return {"route": route, "centroids": centroids, "stack": np.concatenate(maps, axis=1)}


def _fit_mlp(new: np.ndarray, old: np.ndarray, opts: MlpOptions) -> dict[str, np.ndarray]:
    import torch  # loaded by kind_of("mlp") before any fit is timed

    base = procrustes_weight(new, old)
    g = torch.Generator().manual_seed(opts.seed)
    dn, do = new.shape[1], old.shape[1]
    bound = 1.0 / np.sqrt(dn)
    down = torch.nn.Parameter((torch.rand(dn, opts.rank, generator=g, dtype=torch.float64) * 2 - 1) * bound)
    down_bias = torch.nn.Parameter(torch.zeros(opts.rank, dtype=torch.float64))
    up = torch.nn.Parameter(torch.zeros(opts.rank, do, dtype=torch.float64))
    bias = torch.nn.Parameter(torch.zeros(do, dtype=torch.float64))
    x_all, y_all = torch.from_numpy(new), torch.from_numpy(old)
    w0 = torch.from_numpy(base)
    params = [down, down_bias, up, bias]
    optim = torch.optim.Adam(params, lr=opts.lr, weight_decay=opts.weight_decay)
    for _ in range(opts.epochs):
        order = torch.randperm(len(new), generator=g)
        for lo in range(0, len(new), opts.batch_size):
            rows = order[lo: lo + opts.batch_size]
            x, y = x_all[rows], y_all[rows]
            pred = x @ w0 + torch.relu(x @ down + down_bias) @ up + bias
            loss = ((pred - y) ** 2).sum(1).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
    return {"base": base, "down": down.detach().numpy(), "down_bias": down_bias.detach().numpy(),
            "up": up.detach().numpy(), "bias": bias.detach().numpy()}


# ----------------------------------------------------------------------------------------------- applies (float32)
def _apply_procrustes(x: np.ndarray, t: Mapping[str, np.ndarray], opts: Any) -> np.ndarray:
    return x @ t["weight"]


def _apply_affine(x: np.ndarray, t: Mapping[str, np.ndarray], opts: Any) -> np.ndarray:
    return x @ t["weight"] + t["bias"]


def _apply_cluster(x: np.ndarray, t: Mapping[str, np.ndarray], opts: ClusterOptions) -> np.ndarray:
    k, do = t["centroids"].shape
    scores = (x @ t["route"]) @ t["centroids"].T
    if opts.routing == "hard":  # each row through its own cluster's map only (the ONNX graph mixes with 0/1 weights)
        best = np.argmax(scores, axis=1)
        out = np.empty((len(x), do), np.float32)
        for c in np.unique(best):
            rows = best == c
            out[rows] = x[rows] @ t["stack"][:, c * do: (c + 1) * do]
        return out
    z = scores / np.float32(opts.temperature)
    z = np.exp(z - z.max(1, keepdims=True))
    weights = z / z.sum(1, keepdims=True)
    out = np.zeros((len(x), do), np.float32)
    for c in range(k):  # one cluster at a time: memory of one (rows, old_dim) product, not k of them
        out += weights[:, c:c + 1] * (x @ t["stack"][:, c * do: (c + 1) * do])
    return out


def _apply_mlp(x: np.ndarray, t: Mapping[str, np.ndarray], opts: Any) -> np.ndarray:
    return x @ t["base"] + np.maximum(x @ t["down"] + t["down_bias"], 0) @ t["up"] + t["bias"]


# ----------------------------------------------------------------------------------------------- registry
def _shapes_procrustes(dn: int, do: int, opts: Any) -> dict[str, tuple[int, ...]]:
    return {"weight": (dn, do)}


def _shapes_affine(dn: int, do: int, opts: Any) -> dict[str, tuple[int, ...]]:
    return {"weight": (dn, do), "bias": (do,)}


def _shapes_cluster(dn: int, do: int, opts: ClusterOptions) -> dict[str, tuple[int, ...]]:
    return {"route": (dn, do), "centroids": (opts.clusters, do), "stack": (dn, opts.clusters * do)}


def _shapes_mlp(dn: int, do: int, opts: MlpOptions) -> dict[str, tuple[int, ...]]:
    return {"base": (dn, do), "down": (dn, opts.rank), "down_bias": (opts.rank,), "up": (opts.rank, do), "bias": (do,)}


@dataclass(frozen=True)
class Kind:
    """One post-hoc map kind (``engine.core.kinds.ADAPTERS`` names it): its options class, its fit (float64 pairs ->
    tensors), its apply and tensor shapes, the libraries its fit loads beyond numpy, and its formula as an exported
    adapter's metadata states it (``engine.adapters.artifact``)."""

    options: type
    fit: Callable[[np.ndarray, np.ndarray, Any], dict[str, np.ndarray]]
    apply: Callable[[np.ndarray, Mapping[str, np.ndarray], Any], np.ndarray]
    shapes: Callable[[int, int, Any], dict[str, tuple[int, ...]]]
    min_pairs: int
    needs: tuple[str, ...] = ()
    formula: str = ""


POSTHOC: dict[str, Kind] = {
    "procrustes": Kind(ProcrustesOptions, _fit_procrustes, _apply_procrustes, _shapes_procrustes, 2,
                       formula="old = new @ weight"),
    "affine": Kind(AffineOptions, _fit_affine, _apply_affine, _shapes_affine, 2, formula="old = new @ weight + bias"),
    "cluster": Kind(ClusterOptions, _fit_cluster, _apply_cluster, _shapes_cluster, 2, needs=("sklearn.cluster",),
                    formula="c = argmax((new @ route) @ centroids.T) (hard; soft: softmax of those scores / temperature "
                            "mixes the clusters), old = new @ stack[:, c * old_dim:(c + 1) * old_dim]"),
    "mlp": Kind(MlpOptions, _fit_mlp, _apply_mlp, _shapes_mlp, 2, needs=("torch",),
                formula="old = new @ base + relu(new @ down + down_bias) @ up + bias"),
}


def kind_of(kind: str) -> Kind:
    """The registry entry of ``kind``, the libraries its fit needs loaded (scikit-learn for cluster, torch for mlp: a
    check of the kinds comes before the work, so no fit's time includes loading them); one line naming the kinds
    when unknown."""
    if kind not in POSTHOC:
        raise ValueError(f"unknown adapter kind {kind!r}; use one of {', '.join(POSTHOC)}")
    for module in POSTHOC[kind].needs:
        importlib.import_module(module)
    return POSTHOC[kind]


def options_for(kind: str, values: Mapping[str, Any] | None = None) -> Any:
    """The frozen options of ``kind`` from a mapping (strings from a command line are converted to the field's type);
    an unknown or badly typed option is refused in one line."""
    cls = kind_of(kind).options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = dict(values or {})
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for adapter kind {kind!r}; it takes "
                         f"{', '.join(fields) or 'none'}")
    typed = {}
    for name, value in values.items():
        want = type(getattr(cls(), name))
        if want is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        elif want is float and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not want:
            raise ValueError(f"adapter kind {kind!r}: option {name} must be {want.__name__}, got {value!r}")
        typed[name] = value
    return cls(**typed)


def fit_map(kind: str, new: np.ndarray, old: np.ndarray, *, normalise: str = "l2", options: Any = None,
            fitted_on: Mapping[str, Any] | None = None) -> PosthocMap:
    """Fit a ``kind`` map on paired rows (``new[i]`` and ``old[i]`` embed the same item)."""
    entry = kind_of(kind)
    if normalise not in NORMALISE:
        raise ValueError(f"normalise must be one of {', '.join(NORMALISE)}, got {normalise!r}")
    opts = options if isinstance(options, entry.options) else options_for(kind, options)
    new = as_features(new, "new embeddings").astype(np.float64)
    old = as_features(old, "old embeddings").astype(np.float64)
    check_same_rows(old, new, "the old embeddings", "the new embeddings")
    if len(new) < entry.min_pairs:
        raise ValueError(f"a {kind} adapter needs at least {entry.min_pairs} pairs, got {len(new)}")
    if normalise == "l2":
        new, old = _unit64(new), _unit64(old)
    tensors = {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in entry.fit(new, old, opts).items()}
    shapes = entry.shapes(new.shape[1], old.shape[1], opts)
    assert {n: t.shape for n, t in tensors.items()} == shapes, (kind, {n: t.shape for n, t in tensors.items()}, shapes)
    check_tensors(tensors, f"the fitted {kind} adapter")
    return PosthocMap(kind, new.shape[1], old.shape[1], normalise, opts, tensors, dict(fitted_on or {}))


NEW_TO_OLD, OLD_TO_NEW = "new->old", "old->new"
DIRECTIONS = (NEW_TO_OLD, OLD_TO_NEW)  # a query-side adapter, a corpus transform (``fitted_on["direction"]``)


def map_direction(m: PosthocMap) -> str:
    """The map's direction as its ``fitted_on`` records it: :data:`OLD_TO_NEW` for a corpus transform (the stored old
    vectors mapped into the new space; the map's ``new_dim`` is then the old model's width), else :data:`NEW_TO_OLD`."""
    return OLD_TO_NEW if m.fitted_on.get("direction") == OLD_TO_NEW else NEW_TO_OLD


__all__ = ["DIRECTIONS", "NEW_TO_OLD", "OLD_TO_NEW", "map_direction", "NORMALISE", "POSTHOC", "check_tensors", "AffineOptions", "ClusterOptions", "Kind", "MlpOptions", "PosthocMap",
           "ProcrustesOptions", "fit_map", "kind_of", "l2_rows", "options_for", "procrustes_weight"]

"""The convention behind a number, as one line built from an experiment's stored config (no torch).

The same stored features give AC 0.67, 1.0 or 0 depending on the gallery (instances or class-mean
templates) and the evaluation classes, so every table, chart and export says which convention it used
(STYLE 12): metric, feature view (PSP/LSP: truncated, always centred, top-k), protocol, gallery, evaluation classes, the
ECC tie rule and the seeds. Three kinds of stored config are read:

- a run: ``engine.core.config.RunConfig.to_dict()`` (``eval``, ``scenario``, ``model`` sections, ``seed``;
  ``seeds``, a list, when a study runs several);
- a checkpoint comparison: ``{"source": "checkpoints", "spec": {"gallery_kind", "ties", ...}, "protocol"}``;
- a folder of features: ``{"source": "features", "gallery_kind", "same_set"}``.

``gallery_kind`` was stored as ``protocol`` in a spec or a features config before "protocol" kept one meaning
(closed/open set); both are read.

Missing keys take the engine's defaults. Imported by the dashboard and by ``engine.results.report``; it must
stay free of torch and Streamlit.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.kinds import STRICT, metric_label

SEPARATOR = " · "
# IAM-CL2R replaces the model with a third-party one pretrained on external data (ImageNet32); with none here,
# such a step trains a fresh model on every class seen so far (engine.data.scenario), and every place says so
RETRAINED = "replacement, retrained from scratch"
REPLACED_MARK = "†"
_COMMENT = {"csv": "# ", "latex": "% ", "text": "", "markdown": ""}


def metric_name(metric: str) -> str:
    """'recall@1' -> 'Recall@1', 'map' -> 'mAP', 'map@10' -> 'mAP@10', 'ndcg@10' -> 'nDCG@10',
    'neighbour_recall@10' -> 'neighbour recall@10'; anything else as it is."""
    return metric_label(metric)


@dataclass(frozen=True)
class Settings:
    """The evaluation settings of one experiment, as its stored config records them."""

    protocol: str = "closed-set"  # closed-set (queries are the gallery images, own image excluded) | open-set
    gallery: str = "instance"  # instance | template
    eval_classes: str = "all"  # all | seen
    ties: str = STRICT  # ECC on a tie: fail (strict >) | pass (>=)
    topk: int | None = None
    seeds: str = "seed 0"


def _seeds(config: Mapping[str, Any]) -> str:
    source = config.get("source")
    if source == "checkpoints":
        return "given checkpoints (no training seed)"
    if source == "features":
        return "given features (no training seed)"
    many = config.get("seeds")
    seeds = f"seeds {', '.join(str(s) for s in many)}" if many else f"seed {config.get('seed', 0)}"
    order = config.get("scenario", {}).get("class_order_seed", 0)
    init = config.get("model", {}).get("init_seed", "auto")  # engine.core.config.ModelConfig's default
    init_phrase = {"same": "same initial weights every step", "per_step": "new initial weights every step",
                   "auto": "initial weights as each method's paper prescribes"}.get(init, f"init_seed {init}")
    return f"{seeds}, class order {order}, {init_phrase}"


def settings(config: Mapping[str, Any]) -> Settings:
    """The evaluation settings recorded in an experiment's stored config."""
    source = config.get("source")
    if source == "checkpoints":
        spec = config.get("spec", {})
        return Settings(protocol=config.get("protocol", "closed-set"), gallery=spec.get("gallery_kind") or spec.get("protocol") or "instance",
                        ties=spec.get("ties") or STRICT, seeds=_seeds(config))
    if source == "features":
        return Settings(protocol="closed-set" if config.get("same_set") else "open-set",
                        gallery=config.get("gallery_kind") or config.get("protocol") or "instance", ties=config.get("ties", STRICT),
                        seeds=_seeds(config))
    ev = config.get("eval", {})
    return Settings(protocol=ev.get("protocol", "closed-set"), gallery=ev.get("gallery", "instance"),
                    eval_classes=ev.get("eval_classes", "all"), ties=ev.get("ties", STRICT),
                    topk=ev.get("topk"), seeds=_seeds(config))


def stored_ties(summary: Mapping[str, Any] | None) -> str:
    """The ECC tie rule a stored matrix's verdicts used (``summary["ties"]``, written with the matrix); a row
    stored before the rule was kept reads as the default, strict ``fail``."""
    return (summary or {}).get("ties") or STRICT


def replaced_steps(config: Mapping[str, Any]) -> tuple[int, ...]:
    """The steps whose model is replaced, from a run's stored config (``scenario.replacement_steps``), sorted."""
    return tuple(sorted(int(t) for t in config.get("scenario", {}).get("replacement_steps") or ()))


def step_label(step: int, replaced: bool = False) -> str:
    """'step 3', or 'step 3 (replacement, retrained from scratch)' for a replaced model."""
    return f"step {step} ({RETRAINED})" if replaced else f"step {step}"


def model_names(num_models: int, replaced: Iterable[int] = ()) -> list[str]:
    """Matrix row/column names: 'M1' .. 'MT', with 'M3†' for a replaced step (explained by ``replaced_note``)."""
    marked = set(replaced)
    return [f"M{t}{REPLACED_MARK if t in marked else ''}" for t in range(1, num_models + 1)]


def replaced_note(replaced: Iterable[int]) -> str:
    """'† step 3 (replacement, retrained from scratch); ...', or '' when no step is replaced."""
    steps = sorted(set(replaced))
    return f"{REPLACED_MARK} " + "; ".join(step_label(t, True) for t in steps) if steps else ""


def _listed(values: str | Iterable[str] | None) -> list[str]:
    if values is None:
        return []
    return [values] if isinstance(values, str) else list(dict.fromkeys(values))


def view_phrase(view: str, s: Settings) -> str:
    """A feature view with what PSP/LSP do to the outputs (truncation, centring, top-k).

    The engine always centres both (Algorithm 1, ``engine.core.cell.output_view``); no config key turns it off.
    """
    if view not in ("psp", "lsp"):
        return f"{view} view"
    centred = "centred"
    outputs = "softmax" if view == "psp" else "logits"
    top = f", top-{s.topk}" if s.topk else ""
    return f"{view.upper()} view (first C^k {outputs}, {centred}{top}, L2-normalised)"


def convention(config: Mapping[str, Any], *, metrics: str | Iterable[str] | None = None,
               views: str | Iterable[str] | None = None, gallery: str | None = None,
               eval_classes: str | None = None, retrieval: bool = True, ecc: bool = True, ties: str | None = None) -> str:
    """One line stating the convention of a number computed for an experiment with stored ``config``.

    ``metrics`` / ``views``: what the table or chart shows (left out when None). ``gallery`` and
    ``eval_classes`` override the config with what a stored matrix records. ``retrieval=False`` leaves
    out protocol, gallery and evaluation classes (feature geometry); ``ecc=False`` the tie rule. ``ties``: the
    rule a stored matrix records (:func:`stored_ties`), over the config's.
    """
    s = settings(config)
    parts = [" / ".join(metric_name(m) for m in _listed(metrics))] if _listed(metrics) else []
    parts += [view_phrase(v, s) for v in _listed(views)]
    if retrieval:
        own = ", own image excluded" if s.protocol == "closed-set" else ""
        g = gallery or s.gallery
        classes = eval_classes or s.eval_classes
        parts += [f"{s.protocol}{own}",
                  "template gallery (class means)" if g == "template" else f"{g} gallery",
                  "seen classes only" if classes == "seen" else f"{classes} test classes"]
    if ecc:
        parts.append("ECC strict > (a tie fails)" if (ties or s.ties) == "fail" else "ECC >= (a tie passes)")
    parts.append(s.seeds)
    return "Convention: " + SEPARATOR.join(parts)


RELEVANCE_PHRASES = {
    "labels": "relevant: same class label",
    "qrels": "relevant: judged in qrels (grade > 0; nDCG with the grades as gains)",
    "none": "label-free: relevant = the new model's top-{k} on the new gallery (neighbour recall)",
}


# how a metric on top-k lists is defined where the IR tools differ (engine.metrics.relevance), by kind
METRIC_DEFINITIONS = {
    "map": "mAP@{k} = AP over R, every relevant item (trec_eval's map_cut_{k}, ranx, ir-measures)",
    "map_capped": "capped mAP@{k} = AP over min(R, {k}), not trec_eval's map_cut_{k}",
    "ndcg": "nDCG@{k} with linear gains (trec_eval's ndcg_cut_{k})",
}
RANK_TIE_PHRASES = {
    "pessimistic": "rank ties: a non-relevant item first (the default; trec: by doc id, descending)",
    "trec": "rank ties: trec_eval's order, by doc id descending (the default: a non-relevant item first)",
}


def relevance_phrase(relevance: str, *, k: int | None = None, n_no_relevant: int = 0, metric: str | None = None,
                     rank_ties: str | None = None) -> str:
    """Which relevance a number used, e.g. 'label-free: relevant = the new model's top-10 on the new gallery
    (neighbour recall)'; with the queries that had no relevant item in the gallery, counted, and, when given, how the
    ``metric`` is defined where the IR tools differ (:data:`METRIC_DEFINITIONS`) and the ``rank_ties`` rule."""
    if relevance not in RELEVANCE_PHRASES:
        raise ValueError(f"unknown relevance {relevance!r}; use one of {', '.join(RELEVANCE_PHRASES)}")
    phrase = RELEVANCE_PHRASES[relevance].replace("{k}", str(k) if k else "k")
    if n_no_relevant:
        phrase += f" ({n_no_relevant} quer{'y' if n_no_relevant == 1 else 'ies'} without a relevant item, left out)"
    kind, _, at = (metric or "").partition("@")
    if kind in METRIC_DEFINITIONS and at:
        phrase += SEPARATOR + METRIC_DEFINITIONS[kind].replace("{k}", at)
    if rank_ties is not None:
        if rank_ties not in RANK_TIE_PHRASES:
            raise ValueError(f"unknown rank-tie rule {rank_ties!r}; use one of {', '.join(RANK_TIE_PHRASES)}")
        phrase += SEPARATOR + RANK_TIE_PHRASES[rank_ties]
    return phrase


def annotate(text: str, fmt: str, line: str) -> str:
    """An export (csv / markdown / latex / text) with ``line`` first, as a comment where the format has one."""
    if fmt not in _COMMENT:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(_COMMENT)}")
    return f"{_COMMENT[fmt]}{line}\n" + ("\n" if fmt == "markdown" else "") + text

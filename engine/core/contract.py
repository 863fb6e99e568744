"""The app/engine border: every name and request shape both sides share, torch-free (stdlib only).

The dashboard imports ``storage``, ``engine.core.config``, ``engine.core.vocab``, ``engine.core.conventions``, ``engine.core.presets``,
``engine.data.roots`` and this module; the engine's torch modules import the same facts from here. Vocabularies of a
config (methods, datasets, backbones, the run protocols and gallery kinds, views) live in :mod:`engine.core.vocab`;
``tests/test_contract.py`` checks both against the engine's registries.

- views: the raw outputs the worker stores and the derived PSP/LSP views (``DERIVED_VIEWS``: derived -> raw);
- analyses: kinds, parameters with their defaults, their normalisation and storage key;
- jobs: kinds and the payload of each request the app enqueues (``run``, ``analysis``, ``adapters``,
  ``checkpoints``);
- experiment facts read from a stored config: ``same_set_of``, ``main_view``;
- checkpoints: the header format of the project's step checkpoints (``CHECKPOINT_FORMAT``).
"""
from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.core.kinds import DEFAULT_RANK_TIES, LIST_RANK_TIES, STRICT, check_rank_ties
from engine.core.cluster import ClusterSpec
from engine.core.fan_out import FanOut, check_fan_out_gallery
from engine.core.presets import RUN_PRESETS
from engine.core.kinds import ANALYSES, DERIVED_VIEWS, JOBS, MAX_K, PAPER_ADAPTERS, RAW_VIEWS  # noqa: F401 (RAW_VIEWS: the border's name)
from engine.core.vocab import RELEVANCE, RELEVANCE_K, RUN_PROTOCOLS, Rule, check_resamples, parse_metric

# ---------------------------------------------------------------------------------------------- views
# RAW_VIEWS (what the worker extracts and stores per model version and split) and DERIVED_VIEWS (derived view -> the
# raw output it is computed from): engine.core.kinds.VIEW_KINDS
OUTPUT_VIEWS = ("logits", "softmax", "psp", "lsp")  # views that live in the classifier's output space
# a method's main view (the one it is judged by); every other method, known or not, is judged on the encoder
MAIN_VIEWS = {"psp": "psp", "lsp": "lsp"}


def main_view(method: str) -> str:
    """The view a method is meant to be evaluated with: its own (psp/lsp) or the encoder."""
    return MAIN_VIEWS.get(method, "encoder")


def raw_view(view: str) -> str:
    """The stored output a view is read from: softmax for psp, logits for lsp, the view itself otherwise."""
    return DERIVED_VIEWS.get(view, view)


def available_views(stored: Sequence[str]) -> list[str]:
    """Views that can be shown for a model version: the stored ones plus PSP/LSP when their raw view is stored."""
    views = list(dict.fromkeys(stored))
    views += [v for v, raw in DERIVED_VIEWS.items() if raw in views and v not in views]
    return views


def same_set_of(config: dict[str, Any]) -> bool:
    """Whether queries are the gallery images (closed-set): from an experiment's stored config."""
    if "eval" in config:
        return config["eval"].get("protocol", RUN_PROTOCOLS[0]) == RUN_PROTOCOLS[0]
    return bool(config.get("same_set", False))  # experiments evaluated from a folder of features


# ---------------------------------------------------------------------------------------------- analyses
ANALYSIS_KINDS = tuple(ANALYSES)
EMBEDDINGS = ("umap", "pca")
ORDERINGS = ("random", "distance_mse", "distance_cosine", "distance_mse_reverse", "distance_cosine_reverse",
             "confidence", "adapter_residual")  # partial-backfilling orders (engine.metrics.backfill_orders.ORDERINGS)
DEFAULT_ORDERINGS = ("random", "distance_mse", "distance_cosine")
ORDERING_HELP = {  # each order in words (the Backfilling page's help, the plan's and the report's wording)
    "random": "uniform random order (seeded)",
    "distance_mse": "farthest (Euclidean) from its class mean in the old gallery first",
    "distance_cosine": "farthest (cosine) from its class mean in the old gallery first",
    "distance_mse_reverse": "nearest to the class mean first",
    "distance_cosine_reverse": "nearest to the class mean first (cosine)",
    "confidence": "lowest new-model confidence first (uses the new model's gallery logits: an oracle)",
    "adapter_residual": "largest distance between an item's new and old (unit) vectors first, no labels "
                        "(identity map: needs one feature space; reads every new vector: an oracle)",
}
REACH_SHARES = (1.0, 0.99, 0.95)  # "fraction needed to reach this share of the new model's self-test"
# map point kinds (column "kind" of the projection array)
SAMPLE, CLASS_MEAN, PROTOTYPE = 0, 1, 2
PROJECTION_COLUMNS = ("x", "y", "model", "kind", "label", "row", "hit", "drift")  # hit: 0/1 top-1, drift: 1 - cos; -1 = none

# an upgrade check's rule (engine.core.vocab.Rule) in a payload: margin in points and ties; these values are strict ECC
STRICT_RULE: dict[str, Any] = {"margin": Rule().margin, "ties": Rule().ties}

ANALYSIS_DEFAULTS: dict[str, dict[str, Any]] = {
    "projection": {"step_a": None, "step_b": None, "view": "encoder", "split": "gallery", "method": "umap",
                   "max_points": 2000, "seed": 0, "n_pairs": 10_000},
    "backfill": {"step_a": None, "step_b": None, "view": "encoder",
                 "orderings": list(DEFAULT_ORDERINGS), "metrics": ["recall@1", "map"],
                 "num_fractions": 21, "seed": 0, "rollout": False},
    "geometry": {"view": "encoder", "split": "gallery", "n_pairs": 10_000, "seed": 0},
    # engine.metrics.paired's defaults: a seeded percentile bootstrap, 1,000 resamples, 95%
    "upgrade": {"step_a": None, "step_b": None, "view": "encoder", "metric": "map", "resamples": 1000,
                "level": 0.95, "seed": 0, **STRICT_RULE},
    # the summary of a text comparison (engine.upgrade.text_upgrade): every pair of its models, paired over the queries
    "text_upgrade": {"k": 10, "resamples": 1000, "level": 0.95, "seed": 0, "adapters": True},
}


def normalize_params(kind: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """``params`` with defaults filled in and checked; ``ValueError`` with a readable sentence otherwise."""
    if kind not in ANALYSIS_DEFAULTS:
        raise ValueError(f"unknown analysis kind {kind!r}; known kinds: {', '.join(ANALYSIS_KINDS)}")
    params = dict(params or {})
    unknown = sorted(set(params) - set(ANALYSIS_DEFAULTS[kind]))
    if unknown:
        raise ValueError(f"unknown {kind} parameter(s) {', '.join(unknown)}; known: {', '.join(ANALYSIS_DEFAULTS[kind])}")
    out = {**ANALYSIS_DEFAULTS[kind], **params}
    for name in ("step_a", "step_b"):
        if name in out:
            if isinstance(out[name], bool) or not isinstance(out[name], numbers.Integral) or out[name] < 1:
                raise ValueError(f"{kind} needs {name} = a model step (an integer >= 1), got {out[name]!r}")
            out[name] = int(out[name])
    if "step_a" in out and out["step_a"] >= out["step_b"]:
        raise ValueError(f"step_a is the old model and step_b the new one: need step_a < step_b, "
                         f"got {out['step_a']} and {out['step_b']}")
    for name in ("max_points", "n_pairs", "num_fractions", "seed", "resamples"):
        if name in out:
            out[name] = int(out[name])
    if "resamples" in out:
        check_resamples(out["resamples"])
    if out.get("split", "gallery") not in ("query", "gallery"):
        raise ValueError(f"split must be 'query' or 'gallery', got {out['split']!r}")
    KIND_CHECKS.get(kind, _no_check)(out)
    return out


def _no_check(out: dict[str, Any]) -> None:
    """An analysis kind whose parameters need no check beyond the shared ones."""


def _check_projection(out: dict[str, Any]) -> None:
    if out["method"] not in EMBEDDINGS:
        raise ValueError(f"unknown embedding {out['method']!r}; use one of {', '.join(EMBEDDINGS)}")
    if out["max_points"] < 10:
        raise ValueError(f"max_points must be at least 10, got {out['max_points']}")


def _check_text_upgrade(out: dict[str, Any]) -> None:
    out["k"], out["level"] = int(out["k"]), float(out["level"])
    if out["k"] < 1 or out["resamples"] < 1 or not 0 < out["level"] < 1:
        raise ValueError(f"text_upgrade needs k >= 1, resamples >= 1 and a level strictly between 0 and 1, "
                         f"got {out['k']}, {out['resamples']} and {out['level']}")
    if not isinstance(out["adapters"], bool):
        raise ValueError(f"adapters must be true or false (fit and judge the adapters), got {out['adapters']!r}")


def _check_upgrade(out: dict[str, Any]) -> None:
    out["metric"], out["level"] = str(out["metric"]).strip().lower(), float(out["level"])
    parse_metric(out["metric"], pairs=False)
    out["margin"], out["ties"] = _rule(out["margin"], out["ties"])
    if out["resamples"] < 1 or not 0 < out["level"] < 1:
        raise ValueError(f"upgrade needs resamples >= 1 and a level strictly between 0 and 1, "
                         f"got {out['resamples']} and {out['level']}")


def _check_backfill(out: dict[str, Any]) -> None:
    out["orderings"] = [str(o) for o in out["orderings"]]
    out["metrics"] = [str(m) for m in out["metrics"]]
    bad = [o for o in out["orderings"] if o not in ORDERINGS]
    if bad or not out["orderings"]:
        raise ValueError(f"unknown or no backfilling order(s) {bad}; known: {', '.join(ORDERINGS)}")
    if not out["metrics"]:
        raise ValueError("backfill needs at least one metric, e.g. 'recall@1' or 'map'")
    if out["num_fractions"] < 2:
        raise ValueError(f"num_fractions must be at least 2 (0 and 1), got {out['num_fractions']}")
    if not isinstance(out["rollout"], bool):
        raise ValueError(f"rollout must be true or false (add the rank-merge and re-scoring curves), got {out['rollout']!r}")


# Each analysis kind's own checks (after the shared ones), in place (they may coerce values): one function per kind.
KIND_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "projection": _check_projection, "text_upgrade": _check_text_upgrade, "upgrade": _check_upgrade,
    "backfill": _check_backfill,
}


# Parameters added after analyses were stored: left out of the key at these values, so older analyses keep their key.
LATER_PARAMS: dict[str, dict[str, Any]] = {"backfill": {"rollout": False}, "upgrade": STRICT_RULE}


def _rule(margin: Any, ties: Any) -> tuple[float, str]:
    """A checked rule (:class:`engine.core.vocab.Rule`) as the JSON a payload holds: the margin as a float."""
    if isinstance(margin, numbers.Real) and not isinstance(margin, bool):
        margin = float(margin)  # an integer or a numpy number, as a form may give it
    rule = Rule(margin, ties)
    return rule.margin, rule.ties


def analysis_key(kind: str, params: dict[str, Any] | None) -> str:
    """The storage key of an analysis: canonical JSON of its normalised parameters (deterministic)."""
    later = LATER_PARAMS.get(kind, {})
    out = {k: v for k, v in normalize_params(kind, params).items() if not (k in later and v == later[k])}
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------- jobs
JOB_KINDS = tuple(JOBS)  # engine.jobs.job_handlers.JOB_HANDLERS
# Worker lanes and claim order (engine.core.kinds.JobKind): run_app.py starts a worker that takes every kind and one
# for the short lane only (``python -m engine worker --kinds`` SHORT_JOB_KINDS).
JOB_LANES = {lane: tuple(k for k, j in JOBS.items() if j.lane == lane) for lane in ("short", "main")}
SHORT_JOB_KINDS = JOB_LANES["short"]
JOB_PRIORITY = {k: j.priority for k, j in JOBS.items()}
ADAPTER_KINDS = PAPER_ADAPTERS  # what an ``adapters`` job fits (engine.adapters.pair.KINDS)


def _run_label(payload: dict[str, Any]) -> str:
    if "preset" in payload:
        return f"preset {payload['preset']}"
    cfg = payload.get("config", {})
    methods = ", ".join(cfg.get("methods", []))
    return f"{cfg.get('name', 'experiment')} ({methods} on {cfg.get('dataset', {}).get('name', '?')})"


def _analysis_label(payload: dict[str, Any]) -> str:
    p = payload.get("params", {})
    steps = f"steps {p['step_a']}→{p['step_b']}, " if "step_a" in p else ""
    return f"{payload.get('kind', '?')} of experiment {payload.get('experiment_id', '?')} ({steps}{p.get('view', 'encoder')})"


def _sources_check_label(payload: dict[str, Any]) -> str:
    from storage.secrets import mask_url  # masked as every message masks it (a job queued before secrets were refused

    # in payloads may still carry one)
    return f"upgrade check on {mask_url(payload.get('sources', {}).get('old_gallery', '?'))} ({payload.get('relevance')})"


def _extract_label(payload: dict[str, Any]) -> str:
    return (f"extract: {payload.get('images', '?')} by model version #{payload.get('model_version_id', '?')} "
            f"({payload.get('split', '?')})")


def _cells_label(payload: dict[str, Any]) -> str:
    cells = payload.get("cells") or [payload]  # a matrix's cells, or one older cell (a job of the old task layer)
    if payload.get("label"):
        return f"{payload['label']}: {len(cells)} cells"
    if len(cells) > 1:
        return f"{len(cells)} cells"
    same = " (same set)" if cells[0].get("same_set") else ""
    return f"cell: query set #{cells[0].get('query', '?')} x gallery set #{cells[0].get('gallery', '?')}{same}"


# a job in one line, by kind (engine.core.kinds.JOBS; "extract" and "search": jobs stored by the old task layer)
JOB_LABELS = {"run": _run_label, "analysis": _analysis_label, "sources_check": _sources_check_label,
              "extract": _extract_label, "search": _cells_label}


def job_label(kind: str, payload: dict[str, Any]) -> str:
    """A job in one line for the jobs table: what it does, read from its payload; its kind when there is nothing more."""
    from storage import LEGACY_TASK_JOB_KIND  # a task job stored before task jobs took their tasks' kind

    if kind == LEGACY_TASK_JOB_KIND:
        return (_extract_label if payload.get("kind") == "extract" else _cells_label)(payload)
    return JOB_LABELS[kind](payload) if kind in JOB_LABELS else kind


def adapter_key(old_version_id: int, new_version_id: int, kind: str, view: str) -> str:
    """The storage key of a pair of mapping adapters (and of their stored ``adapters`` analysis)."""
    return f"{old_version_id}->{new_version_id}:{kind}:{view}"


def run_payload(config: dict[str, Any], fan_out: FanOut | None = None, *,
                cluster: ClusterSpec | None = None) -> dict[str, Any]:
    """A ``run`` job: one RunConfig dict (``RunConfig.to_dict()``); ``fan_out``: how its matrices are cut when the
    worker evaluates them on a Dask cluster (its ``$COMPATLAB_DASK_SCHEDULER``; ``engine.evaluate.matrix``);
    ``cluster``: where the workers evaluate, so what a cluster does not compute is refused here."""
    if cluster is not None and not cluster.in_process:
        check_fan_out_gallery(config["eval"]["gallery"])
    if fan_out is None:
        return {"config": config}
    return {"config": config, "fan_out": dataclasses.asdict(fan_out)}


def run_preset_payload(name: str) -> dict[str, Any]:
    """A ``run`` job of a named preset (``engine.core.presets.RUN_PRESETS``), resolved by the worker that runs it."""
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(RUN_PRESETS)}")
    return {"preset": name}


def analysis_payload(experiment_id: int, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """An ``analysis`` job; the parameters are checked here, before anything is queued."""
    normalize_params(kind, params)
    return {"experiment_id": int(experiment_id), "kind": kind, "params": dict(params)}


def adapters_payload(old_version_id: int, new_version_id: int, *, kind: str, view: str,
                     same_set: bool) -> dict[str, Any]:
    """An ``adapters`` job (fields of ``engine.analysis.adapted.AdapterJob``)."""
    if kind not in ADAPTER_KINDS:
        raise ValueError(f"unknown adapter kind {kind!r}; use one of {', '.join(ADAPTER_KINDS)}")
    return {"old_version_id": int(old_version_id), "new_version_id": int(new_version_id), "kind": kind,
            "view": view, "same_set": bool(same_set)}


def checkpoints_payload(spec: dict[str, Any]) -> dict[str, Any]:
    """A ``checkpoints`` job: a comparison spec as ``ComparisonSpec.to_dict()`` gives it."""
    return {"spec": spec}


SOURCE_SIDES = ("old_gallery", "new_gallery", "old_queries", "new_queries", "qrels")  # the optional: new_gallery, qrels


def check_job_sources(texts: dict[str, str]) -> None:
    """What a stored job's source texts may hold, checked when it is queued and again when a worker runs it: no secret
    in clear (a reference ``${SOURCE_SECRET_NAME}`` instead) and no host the operator did not allow
    (``--allow-host`` / ``$COMPATLAB_ALLOW_HOSTS``): the browser makes the server contact no other host. One line."""
    from storage.secrets import clear_secret, host_allowed, url_host  # the one secrets rule, beside the masking
    from storage.settings import ALLOW_HOSTS, read_setting

    allowed = read_setting(ALLOW_HOSTS)
    for side, text in texts.items():
        where = side.replace("_", " ")
        if (what := clear_secret(text)) is not None:
            raise ValueError(f"the {where} holds {what}; a job's payload is stored, so it keeps no secret: write it as "
                             "${SOURCE_SECRET_NAME} and set that variable in the worker's environment")
        host = url_host(text)
        if host is not None and not host_allowed(host, allowed):
            raise ValueError(f"the {where} names host {host}, which the operator has not allowed: a dashboard job "
                             "connects only to hosts given with --allow-host HOST[:PORT] (or $COMPATLAB_ALLOW_HOSTS)")


def sources_check_payload(sources: dict[str, str | None], *, relevance: str, k: int = RELEVANCE_K,
                          metric: str | None = None, names: tuple[str, str] = ("old", "new"), margin: float = 0.0,
                          ties: str = STRICT, rank_ties: str = DEFAULT_RANK_TIES, stored: bool = True) -> dict[str, Any]:
    """A ``sources_check`` job: the upgrade check on embeddings read from sources (``engine.upgrade.from_sources``).

    ``stored`` (default): the payload will be stored, so a source text holding a secret in clear is refused
    (:func:`storage.secrets.clear_secret`); ``stored=False`` is the command line's own check, never stored.

    ``sources`` maps :data:`SOURCE_SIDES` to source texts; empty ones are left out. Checked here before anything is
    queued: the three required sources, the relevance and what it needs, ``k``, the rule (``margin`` in points,
    ``ties``) and the rank-tie rule of the top-k lists (``rank_ties``, one of ``engine.core.kinds.LIST_RANK_TIES``,
    ``check-upgrade --rank-ties``). The rule is left out at strict ECC (margin 0, ties fail) and the rank-tie rule at
    its default, the defaults of payloads that have none, so such a payload is the one queued before they could be
    chosen (same job, same stored report).
    """
    given = {side: str(text).strip() for side, text in sources.items() if text is not None and str(text).strip()}
    unknown = sorted(set(given) - set(SOURCE_SIDES))
    if unknown:
        raise ValueError(f"unknown source {unknown[0]!r}; use {', '.join(SOURCE_SIDES)}")
    if stored:
        check_job_sources(given)
    missing = [side.replace("_", " ") for side in ("old_gallery", "old_queries", "new_queries") if side not in given]
    if missing:
        raise ValueError(f"give the {', the '.join(missing)} (a path or URL each)")
    if relevance not in RELEVANCE:
        raise ValueError(f"unknown relevance {relevance!r}; use one of {', '.join(RELEVANCE)}")
    if relevance == "qrels" and "qrels" not in given:
        raise ValueError("relevance qrels needs the qrels (query id, item id, grade)")
    if relevance != "qrels" and "qrels" in given:
        raise ValueError(f"qrels go with relevance qrels, not {relevance}")
    if relevance == "none" and "new_gallery" not in given:
        raise ValueError("label-free relevance needs the new gallery: the new model's top-k on it is the reference")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be an integer in [1, {MAX_K:,}], got {k!r}")
    names = tuple(str(n).strip() for n in names)
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise ValueError("give the old and the new model two different names")
    from storage import model_name_problem  # the one name rule (no control, format or bidi characters, <= 40)

    if problem := next(filter(None, map(model_name_problem, names)), None):
        raise ValueError(problem)
    rule = {k: v for k, v in zip(STRICT_RULE, _rule(margin, ties)) if v != STRICT_RULE[k]}
    if check_rank_ties(rank_ties, LIST_RANK_TIES) != DEFAULT_RANK_TIES:
        rule["rank_ties"] = rank_ties
    return {"sources": {side: given[side] for side in SOURCE_SIDES if side in given}, "relevance": relevance, "k": k,
            "metric": (metric or "").strip().lower() or None, "names": list(names), **rule}


SOURCES_CHECK_FIELDS = ("sources", "relevance", "k", "metric", "names", "margin", "ties", "rank_ties")


def sources_check_args(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A stored ``sources_check`` payload read strictly, as the worker runs it (a stored payload is data, and the
    allow-list may have changed since it was queued): unknown fields refused and every field checked again by
    :func:`sources_check_payload`; the keyword arguments of ``engine.upgrade.from_sources.check_sources`` with
    ``sources`` (side -> text), the rule and the rank-tie rule at their defaults where the payload leaves them out.
    One line otherwise."""
    unknown = sorted(map(str, set(payload) - set(SOURCES_CHECK_FIELDS)))
    if unknown:
        raise ValueError(f"a sources_check payload holds unknown field(s) {', '.join(unknown)}; known: "
                         f"{', '.join(SOURCES_CHECK_FIELDS)}")
    missing = [f for f in ("sources", "relevance", "names") if f not in payload]
    if (missing or not isinstance(payload["sources"], Mapping) or not isinstance(payload["names"], (list, tuple))
            or not isinstance(payload.get("metric"), (str, type(None)))):
        raise ValueError("a sources_check payload needs sources (side -> text), a relevance, two names and, when "
                         "given, a metric as text")
    margin, ties = payload.get("margin", STRICT_RULE["margin"]), payload.get("ties", STRICT_RULE["ties"])
    rank_ties = payload.get("rank_ties", DEFAULT_RANK_TIES)
    checked = sources_check_payload(dict(payload["sources"]), relevance=payload["relevance"],
                                    k=payload.get("k", RELEVANCE_K), metric=payload.get("metric"),
                                    names=tuple(payload["names"]), margin=margin, ties=ties, rank_ties=rank_ties)
    return {"sources": checked["sources"], "relevance": checked["relevance"], "k": checked["k"],
            "metric": checked["metric"], "names": tuple(checked["names"]), "margin": float(margin), "ties": ties,
            "rank_ties": rank_ties}


# ---------------------------------------------------------------------------------------------- checkpoints
CHECKPOINT_FORMAT = "compatibility-lab/net/1"  # the "format" header of a step checkpoint (engine.models.checkpoint)

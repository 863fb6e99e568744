"""engine.core.contract names exactly what the engine's registries know, and its helpers behave as the engine did."""
import pytest

from engine.core import contract, vocab
from engine.adapters.pair import KINDS as ADAPTER_KINDS
from engine.metrics.backfill_orders import ORDERINGS
from engine.core.cell import RAW_VIEWS, VIEWS
from engine.methods import METHODS
from engine.jobs.job_handlers import JOB_HANDLERS


def test_contract_matches_the_registries():
    assert contract.ORDERINGS == tuple(ORDERINGS)
    assert set(contract.DEFAULT_ORDERINGS) <= set(ORDERINGS)
    assert contract.ADAPTER_KINDS == ADAPTER_KINDS
    assert contract.JOB_KINDS == tuple(JOB_HANDLERS)
    assert contract.RAW_VIEWS == RAW_VIEWS
    assert set(contract.DERIVED_VIEWS) | set(contract.RAW_VIEWS) == set(VIEWS) == set(vocab.VIEWS)
    assert set(contract.DERIVED_VIEWS.values()) <= set(RAW_VIEWS)
    assert {m: contract.main_view(m) for m in METHODS} == {m: cls.default_views[0] for m, cls in METHODS.items()}


def test_main_view_and_same_set():
    assert [contract.main_view(m) for m in ("psp", "lsp", "bct", "not-a-method")] == ["psp", "lsp", "encoder", "encoder"]
    assert contract.same_set_of({"eval": {"protocol": "closed-set"}}) is True
    assert contract.same_set_of({"eval": {"protocol": "open-set"}}) is False
    assert contract.same_set_of({"eval": {}}) is True  # the engine's default protocol
    assert contract.same_set_of({"source": "features", "same_set": True}) is True
    assert contract.same_set_of({"source": "features"}) is False


def test_views_and_payloads():
    assert contract.available_views(["encoder", "softmax"]) == ["encoder", "softmax", "psp"]
    assert [contract.raw_view(v) for v in ("psp", "lsp", "encoder")] == ["softmax", "logits", "encoder"]
    assert contract.adapter_key(3, 4, "perp", "encoder") == "3->4:perp:encoder"
    assert contract.adapters_payload(3, 4, kind="fct", view="psp", same_set=False) == {
        "old_version_id": 3, "new_version_id": 4, "kind": "fct", "view": "psp", "same_set": False}
    with pytest.raises(ValueError, match="unknown adapter kind 'nope'"):
        contract.adapters_payload(3, 4, kind="nope", view="psp", same_set=False)
    assert contract.analysis_payload(7, "geometry", {"view": "psp"}) == {
        "experiment_id": 7, "kind": "geometry", "params": {"view": "psp"}}
    with pytest.raises(ValueError, match=r"unknown or no backfilling order\(s\) \[.sideways.\]"):
        contract.analysis_payload(7, "backfill", {"step_a": 1, "step_b": 2, "orderings": ["sideways"]})
    assert contract.analysis_key("geometry", {}) == \
        '{"n_pairs":10000,"seed":0,"split":"gallery","view":"encoder"}'


def test_the_upgrade_rule_in_payloads_and_analysis_keys():
    """A margin and a tie rule travel in a sources check's payload and an upgrade analysis's params, checked by
    engine.core.vocab.Rule before anything is queued; at strict ECC both are left out, so payloads and keys stored
    before the rule could be chosen stay the same."""
    sources = {"old_gallery": "g.parquet", "old_queries": "q1.parquet", "new_queries": "q2.parquet"}
    before = {"sources": sources, "relevance": "labels", "k": 10, "metric": None, "names": ["old", "new"]}
    assert contract.sources_check_payload(sources, relevance="labels") == before
    assert contract.sources_check_payload(sources, relevance="labels", margin=0, ties="fail") == before
    assert contract.sources_check_payload(sources, relevance="labels", margin=2, ties="pass") == {
        **before, "margin": 2.0, "ties": "pass"}
    with pytest.raises(ValueError, match=r"the margin is in points and must lie in \[0, 100\), got -1.0"):
        contract.sources_check_payload(sources, relevance="labels", margin=-1)
    with pytest.raises(ValueError, match="unknown tie rule 'maybe'"):
        contract.sources_check_payload(sources, relevance="labels", ties="maybe")

    params = {"step_a": 1, "step_b": 2, "view": "encoder", "metric": "recall@1"}
    old_key = ('{"level":0.95,"metric":"recall@1","resamples":1000,"seed":0,"step_a":1,"step_b":2,'
               '"view":"encoder"}')  # the key of an upgrade analysis stored before the rule was a parameter
    assert contract.analysis_key("upgrade", params) == old_key
    assert contract.analysis_key("upgrade", {**params, "margin": 0, "ties": "fail"}) == old_key
    assert contract.analysis_key("upgrade", {**params, "margin": 1.5, "ties": "pass"}) == (
        '{"level":0.95,"margin":1.5,"metric":"recall@1","resamples":1000,"seed":0,"step_a":1,"step_b":2,'
        '"ties":"pass","view":"encoder"}')
    assert contract.normalize_params("upgrade", {**params, "margin": 1})["margin"] == 1.0
    with pytest.raises(ValueError, match="the margin is in points"):
        contract.analysis_payload(3, "upgrade", {**params, "margin": 100})


def test_each_analysis_kind_with_own_checks_is_a_known_kind():
    from engine.core.contract import ANALYSIS_DEFAULTS, KIND_CHECKS

    assert set(KIND_CHECKS) <= set(ANALYSIS_DEFAULTS)
    with pytest.raises(ValueError, match="max_points must be at least 10"):
        contract.normalize_params("projection", {"step_a": 1, "step_b": 2, "max_points": 3})

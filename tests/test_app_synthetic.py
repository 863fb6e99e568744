"""Synthetic results for the dashboard's tests, benchmark and screenshots: a study written through the repository.

``fill_study`` writes what a finished run leaves behind - a study, one experiment per method, model
versions with query/gallery feature sets, compatibility matrices with their summaries - and, if
asked, the stored analyses the pages read, computed by ``engine.jobs.analysis.run_analysis`` itself.
The matrices are hand-made (``hand_matrix``) so a page test knows the AC it must show.
"""
from __future__ import annotations



from storage import (
    get_engine,
    session_scope,
)
from support.app_synthetic import fill_study









def test_fill_study_writes_a_readable_study(db_url):
    from storage import list_experiments, load_matrices

    out = fill_study(db_url, analyses=False)
    with session_scope(get_engine(db_url)) as s:
        experiments = list_experiments(s, study_id=out["study_id"])
        assert sorted(e.method for e in experiments) == ["bct", "independent"]
        assert all(e.status == "done" for e in experiments)
        recall = load_matrices(s, out["experiments"]["bct"], metric="recall@1")[0]
        assert recall.summary["AC"] == 1.0
        assert load_matrices(s, out["experiments"]["independent"], metric="recall@1")[0].summary["AC"] == 0.0

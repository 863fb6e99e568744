"""The engineer's question, "can I ship v2 without re-indexing?".

``verdict`` (the check on two feature sets), ``stored`` (two steps of a stored experiment; the ``upgrade`` analysis),
``models`` (two checkpoints embedding one image set, through compare-checkpoints' pipeline),
``cli`` (``check-upgrade``), and the torch-free pieces the dashboard reads: ``words`` (the verdict in a sentence),
``orders`` (the best backfilling ordering: largest area), ``evidence`` (sampled decisions read against whole-corpus
ones, with Clopper-Pearson bounds: ``bench/bench_evidence.py``) and ``forecast`` (the adapter's recovery predicted
before fitting).
"""

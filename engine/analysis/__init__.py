"""Analyses of stored experiments, computed by the worker for the dashboard (nothing is imported here).

* ``views``: a model version's stored features read into the view a comparison needs (PSP/LSP cells).
* ``run``: ``run_analysis``, the worker's ``analysis`` job, dispatching to the three kinds:
  ``map`` (projection), ``backfill_analysis`` (backfill) and ``geometry`` (geometry).
* ``backfill``: partial-backfilling curves, M-tilde and reach fractions; ``backfill_orders`` the orderings,
  ``backfill_kernels`` the compiled kernels.
* ``collapse`` (NC1-NC4) and ``stationarity`` (the prototype probe): pure numpy measures.
* ``neighbours``: cross-model nearest neighbours, numpy only, which the dashboard computes in its process.
* ``arrays``: the small numpy helpers they share.
"""

"""Analyses of stored experiments, computed by the worker for the dashboard (nothing is imported here).

* ``views``: a model version's stored features read into the view a comparison needs (PSP/LSP cells).
* ``map`` (projection), ``backfill_analysis`` (backfill) and ``geometry`` (geometry): three of the five kinds of
  the worker's ``analysis`` job (``engine.core.contract.ANALYSIS_KINDS``; the others, ``upgrade`` and ``text_upgrade``,
  are ``engine.upgrade.stored`` and ``engine.upgrade.text_upgrade``); the job itself is dispatched in ``engine.jobs``.
  The backfill curves, orders and kernels they use live in ``engine.metrics`` (``backfill``, ``backfill_orders``,
  ``backfill_kernels``).
* ``collapse`` (NC1-NC4) and ``stationarity`` (the prototype probe): pure numpy measures.
* ``neighbours``: cross-model nearest neighbours, numpy only, which the dashboard computes in its process.
* ``arrays``: the small numpy helpers they share.
"""

"""Background jobs, floor 4: the worker that claims queued jobs (``worker``) and the registry it dispatches through
(``job_handlers.JOB_HANDLERS``: one handler per kind of ``engine.core.contract.JOB_KINDS``).

The handlers call the stages' plain functions (runs in ``engine.run``, checkpoint comparisons in
``engine.checkpoints.store``) and two pieces that live here because they use more than one stage: ``analysis``
(``run_analysis``: the analysis kinds, the upgrade verdict among them) and ``adapt`` (``run_adapters``: paper 004's
adapters between two stored models).
"""

"""Background jobs: the worker that claims queued jobs (``worker``) and the adapter-fitting job (``adapt``).

The other job kinds live with their stage: runs in ``engine.run``, analyses in ``engine.jobs.analysis``,
checkpoint comparisons in ``engine.checkpoints.compare``.
"""

"""Bring your own checkpoints: load them safely, align their classes, compare them as a sequence.

* ``engine.checkpoints.loading``: ``load_model`` for TorchScript archives, ``torch.save`` state_dicts
  (``weights_only=True`` only), ``.safetensors`` and the project's step checkpoints, validated
  before anything runs; ``CheckpointError``; the trust model is in its docstring.
* ``engine.checkpoints.archs``: ``ARCHITECTURES`` a state_dict can be loaded into, and
  ``pretrained_path`` for offline pretrained weights.
* ``engine.checkpoints.classes``: class lists, and how PSP/LSP's "first C^k outputs" is realised for
  models whose classes differ in order or content.
* ``engine.checkpoints.compare``: load -> embed -> matrices -> one transaction;
  ``run_checkpoint_comparison(db, spec)`` for the dashboard (``checkpoint_job`` has the worker
  handler signature).
* ``engine.checkpoints.cli``: the ``compare-checkpoints`` command.

Nothing is imported here, so that the command line starts without loading torchvision.
"""

"""The paper settings' training settings and method hyper-parameters, kept in the torch-free :mod:`engine.presets`.

Re-exported here for code that looks for them next to the methods.
"""
from engine.presets import PRESETS, TRAINING_KEYS, method_hparams, training_settings

__all__ = ["PRESETS", "TRAINING_KEYS", "method_hparams", "training_settings"]

"""Stage 1, a training run: a config in, a sequence of models and their stored matrices out.

``pipeline`` (run_config: data -> per step train -> embed once -> cells -> record), ``training`` (the explicit
loop), ``data_setup`` (datasets and scenario of a config), ``progress`` (terminal progress lines),
``device`` (CPU/GPU choice), ``ddp`` (one step trained data-parallel over N processes).
"""

"""Reduced-scale reproduction of named paper table cells (``python -m engine reproduce NAME``): a stage.

* :mod:`.claims`: each named cell: the paper's convention, its printed values, our closest Fashion-MNIST setting
  (what differs, said), the methods whose cells are read and the negative control (independent encoders).
* :mod:`.plan`: the study config of a claim at a scale, which of its runs are stored (by config hash), and the
  run jobs that queue the missing seeds for ``python -m engine worker``.
* :mod:`.table`: the stored matrices read back as margins / AC per seed, a 95 % interval (hierarchical over seeds,
  then items, by default; Student-t over seeds on request or where the outcomes cannot be recomputed), the verdict
  words and the printed table (text, or the README's Markdown table with its header).
* :mod:`.outcomes`: each stored run's per-query (or per-pair, with the images each pair compares) outcomes,
  recomputed from its stored features, for the hierarchical interval.
* :mod:`.sensitivity`: AC under the other evaluation conventions, re-evaluated from the stored features.
"""

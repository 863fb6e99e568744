"""Bring your own checkpoints: load them safely, align their classes, compare them as a sequence.

Public API, by module. The package imports nothing, so that the command line starts without torchvision and the
torch-free modules (the request, the files, the tables) load without torch: import each name from its module.

The request (torch-free; the dashboard validates with it before queuing a ``checkpoints`` job)
  ``request``  ``comparison_spec(spec, *, trust=LOCAL) -> ComparisonSpec``  strict, one-sentence ``ValueError``;
      ``ComparisonSpec(models, dataset | query_dataset + gallery_dataset, views, metrics, gallery_kind, ties, name,
      max_file_bytes, batch_size, device)``, ``.to_dict()``  the job payload; ``model_source(entry, *, index, trust)
      -> ModelSource(path, arch, num_classes, classes, input_size, mean, std, label, pretrained)``,
      ``.load_trust(trust)``; ``parse_dataset("NAME[:ROOT]")``
  ``arch_table``  ``ARCH_INPUTS``  architecture name -> ``ArchInputs(input_size, mean, std, in_channels)``
  ``pretrained``  ``pretrained_path(name) -> (file, arch, 1000)`` for ``pretrained:NAME`` (nothing is downloaded);
      ``LITE_WEIGHT_PACKAGES``, ``lite_weights_path`` (from the package's install record), ``trusted_by_name``
  ``classes``  ``read_class_list``, ``index_names``, ``aligned_columns``: how PSP/LSP's "first C^k outputs" is
      realised for models whose classes differ in order or content

Files (torch-free; the trust model is in its docstring)
  ``files``  ``CheckpointError(ValueError)`` (one line ``PATH: reason``), ``Trust``, ``LOCAL``, ``server_trust()``,
      ``sniff(path) -> "torchscript" | "torch" | "safetensors"``, ``check_zip_sizes``, ``safetensors_metadata`` (sizes
      checked, nothing allocated), ``parse_size("2GB")``, ``human_bytes``, ``sha256_of``, ``DEFAULT_MAX_BYTES``;
      ``server_max_bytes()``/``check_ceiling``: the operator's ceiling (``--max-checkpoint-size``) a request can only lower
  ``torch_zip``  ``check_torch_zip(path, max_bytes)``: every tensor of a ``torch.save`` zip a dense view inside its
      storage, every storage its record's size, the total within ``max_bytes``; read without torch, before it loads

Loading (torch)
  ``loading``  ``load_model(path, *, arch=None, num_classes=None, max_bytes, trust=LOCAL) -> LoadedModel`` for
      TorchScript archives (contained), ``torch.save`` state_dicts (``weights_only=True`` only), ``.safetensors``
      and the project's step checkpoints, validated before anything runs
  ``tensors``  ``torch_load``, ``as_state_dict``, ``read_safetensors``, ``check_tensors``, ``check_finite``
  ``archs``  ``ARCHITECTURES``  name -> ``Architecture`` (builder, final Linear, input defaults from ``arch_table``)
  ``sandbox`` / ``sandbox_child``  ``SandboxedScript``: a TorchScript archive in a process without file access

Comparing and storing (torch)
  ``compare``  ``compare_checkpoints(spec, *, progress, should_stop, trust) -> Comparison`` (stores nothing)
  ``embedding``  ``ImageSource`` (one image set, a batch at a time at each model's size), ``probe``, ``extract``
  ``store``  ``store_comparison(db, cmp)`` (one transaction), ``comparison_json``;
      ``run_checkpoint_comparison(db, spec, ...) -> experiment id`` (compare and store; the worker's ``checkpoints`` jobs)
  ``evaluate_folder``  ``load_feature_folder``, ``evaluate_folder``, ``store_feature_evaluation`` (features from .npz)
  (the ``compare-checkpoints`` command is ``engine.cli.checkpoints``)
"""

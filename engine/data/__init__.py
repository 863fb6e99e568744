"""Datasets, evaluation protocols and class-incremental scenarios.

Public API, by module. The package imports nothing, so that the torch-free modules (``scenario``, ``bounds``)
load without torch: import each name from the module named in brackets.

Images (``imageset``, ``folder``, ``loaders``; size bounds in the torch-free ``bounds``)
  ``ImageSet(images, labels, class_names, mean=None, std=None, refs=None)``  frozen; (N,C,H,W) uint8 pixels or float32, (N,) int64;
      ``.batch(indices, size=None)`` / ``.batches(batch_size, size=None)`` float32 (resized per batch),
      ``.subset(indices)``, ``.select_classes(classes)`` (labels kept), ``.normalized(mean, std)``, ``.as_dataset()``
  ``list_image_folder(root, *, layout, max_files, max_folders, should_stop) -> FolderImages``  bounded, cancellable
      listing of a class-folder tree; ``.batch(indices, size=...)`` decodes per batch (``engine.data.folder``)
  ``make_loader(images, *, batch_size=128, shuffle=True, augment="none"|"crop_flip", seed=0, drop_last=False)``

Datasets (``registry``; loaders in ``builtin``, ``shapes``, ``fashion``, ``disk``; loaded into memory compactly:
uint8 for decoded files and IDX)
  ``DATASETS``  {"digits", "shapes", "fashion", "cifar10", "cifar100", "imagefolder"} -> ``DatasetSpec(load, summary, train_augment)``
  ``load_dataset(name, *, root="data", split="train"|"test", seed=0, mean=None, std=None, **options) -> ImageSet``
  ``make_digits(*, split="train", seed=0, test_fraction=0.3, max_per_class=None)``
  ``make_shapes(*, num_classes=100, per_class=100, split="train", seed=0, first_class=0)``
  ``load_fashion(*, root="data", split="train", per_class=None, max_per_class=None, download=False)``
  ``load_cifar(name, *, root="data", split="train", max_per_class=None, download=False)``
  ``load_imagefolder(root, *, image_size=32, max_per_class=None)``  one class-folder tree
  ``load_imagefolder_split(*, root, split="train", seed=0, image_size=None, test_fraction=0.3, max_per_class=None)``
  ``DatasetNotFoundError(ValueError)``, ``NORMALIZATION`` (named mean/std pairs)

Protocols (``protocols``)
  ``EvalSplit(query, gallery, same_set, protocol)``
  ``make_eval_split(protocol, *, dataset, root="data", seed=0, options=None, split_options=None,
                    open_set_dataset=None, open_set_classes=10) -> EvalSplit``   protocol: "closed-set" | "open-set"
  ``restrict_eval_split(split, *, eval_classes="all"|"seen", seen_classes) -> EvalSplit``

Scenarios (``scenario``, torch-free)
  ``build_scenario(*, num_classes, initial_classes, increment, num_steps=None, class_order_seed=0,
                   class_order=None, training="cumulative"|"finetune", replay_per_class=0, replacement_steps=())``
      -> ``Scenario(class_order, steps, training, replay_per_class)`` of ``Step(index, new_classes,
         seen_classes, train_classes, replay_classes, replaced)``
  ``select_replay(labels, classes, per_class, seed) -> np.ndarray`` of indices

Files and paths (torch-free)
  ``roots``  where the server may read files from (``confine``); ``safe_open``  ``open_regular`` / ``read_regular``:
  a regular file inside given roots, checked after opening (FIFOs, devices, links out refused); ``splits``  the
  class-incremental split arithmetic;
  ``fashion_files``  where Debian's Fashion-MNIST files are, and their IDX reader; ``cifar_files``  CIFAR batch
  files and their restricted unpickler; ``export_images``  a dataset written as a class-folder tree

Text (torch-free)
  ``wordnet``  WordNet 3.0 (Debian ``wordnet-base``): ``iter_synsets()``, ``wordnet_task(*, queries, gallery, seed)``
      -> ``WordNetTask`` (example-sentence queries, definitions, supersense labels, qrels), ``parse_options(text)``
  ``gcide``  GCIDE (Debian ``dict-gcide``) against WordNet: ``gcide_task(*, queries, gallery, seed, senses)`` ->
      ``GcideTask`` (WordNet definitions of one-sense words as queries, GCIDE's Webster 1913 senses as the gallery,
      labelled by word)
  ``text_model_files``  a text model's files read as data (``ModelFolder``: a folder or zip, sizes checked), the
      offline MiniLM wheels' pinned files (``TEXT_MODEL_FILES``, ``read_pinned``), ``TextModelError``

Sample references and thumbnails (torch-free)
  ``samples``  ``SampleRefs(source, ids)``: where each image of an ``ImageSet`` comes from (``ImageSet.refs``)
  ``thumbnails``  ``thumbnails(source, ids, *, cache_dir, size=64) -> list[PNG bytes | None]``, cached on disk
"""

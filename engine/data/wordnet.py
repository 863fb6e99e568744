"""WordNet 3.0 as a labelled text corpus (Debian ``wordnet-base``), read with plain Python.

Each synset of ``/usr/share/wordnet/data.{noun,verb,adj,adv}`` is an item: its id ``OFFSET-POS`` (``02084071-n``),
its supersense (the lexicographer file it was written in, 45 of them: ``noun.animal``, ``verb.motion``, ...), its
gloss without the examples (the definition) and its example sentences (the quoted text of the gloss). The files
hold 117,659 synsets, 32,923 of them with at least one example.

Two tasks on one sample (:func:`wordnet_task`): queries are example sentences (a synset's first example), the
gallery holds definitions. ``qrels``: the one relevant item of a query is its own synset's definition. ``class``:
relevant are the definitions of the same supersense. The sample is fixed by the seed: the query synsets are drawn
from those with an example, and the gallery is their definitions plus definitions of other synsets drawn from the
rest. The files are streamed twice (a count, then the chosen lines); only the chosen texts are kept.

An optional training split (``train=N``, default 0: none) holds texts that are never queries or gallery items, for
adapters that learn on labelled ``train`` features (paper 004, ``engine.analysis.adapted``): ``N`` synsets with an
example that are neither query nor gallery synsets, each giving two texts, its first example sentence and its
definition (both kinds of text the queries and the gallery hold, so an adapter sees both), labelled by its supersense
(the only label shared beyond one synset; every class in the split then has at least two texts). They are drawn from
a child stream of the seed, after the query and gallery draws, so a seed's query/gallery sample is the same whatever N.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WORDNET_ROOT = Path("/usr/share/wordnet")
PARTS_OF_SPEECH = ("noun", "verb", "adj", "adv")  # data.<name>, read in this order
# The 45 lexicographer files of WordNet 3.0 (its lexnames file), indexed by the number each data line carries.
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact", "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)
TASKS = ("qrels", "class")
_QUOTED = re.compile(r'"([^"]*)"')
_SS_TYPE = {"n": "n", "v": "v", "a": "a", "s": "a", "r": "r"}  # an adjective satellite (s) is an adjective


class WordNetMissing(ValueError):
    """WordNet's data files are not on this machine."""


@dataclass(frozen=True)
class Synset:
    """One synset: ``id`` (``OFFSET-POS``), ``lexname`` index into :data:`LEXNAMES`, words, definition, examples."""

    id: str
    lexname: int
    words: tuple[str, ...]
    definition: str
    examples: tuple[str, ...]


@dataclass(frozen=True)
class WordNetTask:
    """A query/gallery sample: texts, synset ids and supersense labels (indices into ``class_names``)."""

    query_texts: list[str]
    query_ids: list[str]
    query_labels: np.ndarray  # (n_q,) int64
    gallery_texts: list[str]
    gallery_ids: list[str]
    gallery_labels: np.ndarray  # (n_g,) int64
    class_names: tuple[str, ...] = LEXNAMES
    seed: int = 0
    train_texts: list[str] = field(default_factory=list)  # per train synset: its first example, then its definition
    train_ids: list[str] = field(default_factory=list)  # the synset of each train text (each id twice)
    train_labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (2 n_train,) supersenses

    @property
    def qrels(self) -> dict[str, dict[str, int]]:
        """Query id -> {its own synset's gallery id: 1} (BEIR style; every query's synset is in the gallery)."""
        return {q: {q: 1} for q in self.query_ids}

    def relevance_labels(self, task: str) -> tuple[np.ndarray, np.ndarray]:
        """``(query labels, gallery labels)`` for label-based relevance: ``qrels`` (one relevant item, its own
        synset: labels are gallery positions) or ``class`` (the supersense)."""
        if task == "class":
            return self.query_labels, self.gallery_labels
        if task != "qrels":
            raise ValueError(f"unknown WordNet task {task!r}; use one of {', '.join(TASKS)}")
        position = {g: i for i, g in enumerate(self.gallery_ids)}
        return np.array([position[q] for q in self.query_ids], np.int64), np.arange(len(self.gallery_ids), dtype=np.int64)


@dataclass(frozen=True)
class WordNetOptions:
    """The corpus options of ``wordnet:OPTIONS``: the task, the sample's sizes and seed (the files: Debian's), and the
    training split's size in synsets (0: none)."""

    task: str = "qrels"
    queries: int = 2000
    gallery: int = 8000
    seed: int = 0
    train: int = 0


def parse_options(text: str | None) -> WordNetOptions:
    """``task=qrels|class,queries=N,gallery=N,seed=S,train=N`` (any subset; empty: the defaults) as options."""
    values: dict[str, object] = {}
    for part in filter(None, (text or "").split(",")):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in WordNetOptions.__dataclass_fields__:
            raise ValueError(f"wordnet option {part!r}: use KEY=VALUE with KEY one of task, queries, gallery, seed, "
                             "train (e.g. wordnet:task=class,queries=500)")
        if key in ("queries", "gallery", "seed", "train"):
            if not value.strip().isdigit():
                raise ValueError(f"wordnet option {key} must be a whole number, got {value!r}")
            values[key] = int(value)
        else:
            values[key] = value.strip()
    options = WordNetOptions(**values)
    if options.task not in TASKS:
        raise ValueError(f"wordnet task {options.task!r}: use one of {', '.join(TASKS)}")
    if options.queries < 1 or options.gallery < options.queries:
        raise ValueError(f"wordnet needs 1 <= queries <= gallery, got queries={options.queries}, gallery={options.gallery}")
    return options


def data_files(root: str | Path = WORDNET_ROOT) -> list[Path]:
    """The four data files; :class:`WordNetMissing` (one line saying how to get them) when one is absent."""
    files = [Path(root) / f"data.{pos}" for pos in PARTS_OF_SPEECH]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise WordNetMissing(f"WordNet's data files are not in {root} (missing {', '.join(missing)}); install them: "
                             "apt-get install wordnet-base")
    return files


def parse_line(line: str) -> Synset | None:
    """One line of a ``data.POS`` file as a :class:`Synset`; None for the licence header (lines opening with spaces)."""
    if line.startswith(" ") or not line.strip():
        return None
    head, bar, gloss = line.partition(" | ")
    fields = head.split()
    if not bar or len(fields) < 4:
        raise ValueError(f"not a WordNet data line: {line[:60]!r}")
    offset, lex, ss_type, count = fields[0], int(fields[1]), fields[2], int(fields[3], 16)
    if not 0 <= lex < len(LEXNAMES) or ss_type not in _SS_TYPE:
        raise ValueError(f"WordNet line {offset}: lexicographer file {lex} or synset type {ss_type!r} unknown")
    words = tuple(fields[4 + 2 * i].replace("_", " ") for i in range(count))
    gloss = gloss.strip()
    examples = tuple(e.strip() for e in _QUOTED.findall(gloss) if e.strip())
    return Synset(f"{offset}-{_SS_TYPE[ss_type]}", lex, words, definition_of(gloss), examples)


def definition_of(gloss: str) -> str:
    """A gloss without its quoted examples: the remaining ``;``-separated parts, empty ones dropped."""
    parts = (p.strip() for p in _QUOTED.sub("", gloss).split(";"))
    return "; ".join(p for p in parts if p)


def iter_synsets(root: str | Path = WORDNET_ROOT) -> Iterator[Synset]:
    """Every synset of the four data files, one line at a time (nouns, verbs, adjectives, adverbs)."""
    for path in data_files(root):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                synset = parse_line(line)
                if synset is not None:
                    yield synset


def wordnet_task(*, queries: int = 2000, gallery: int = 8000, seed: int = 0, train: int = 0,
                 root: str | Path = WORDNET_ROOT) -> WordNetTask:
    """A fixed sample: ``queries`` synsets with an example (query: the first example; seeded), and a gallery of
    ``gallery`` definitions: the query synsets' own plus ``gallery - queries`` others drawn from the rest; and
    ``train`` other synsets with an example, two texts each (see the module docstring).

    Queries, gallery and train texts keep the files' order. ``ValueError`` when the sizes do not fit the files.
    """
    for value, what in ((queries, "queries"), (gallery, "gallery")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"wordnet {what} must be a positive integer, got {value!r}")
    if isinstance(train, bool) or not isinstance(train, int) or train < 0:
        raise ValueError(f"wordnet train must be a whole number of synsets (0: no training split), got {train!r}")
    if gallery < queries:
        raise ValueError(f"the wordnet gallery ({gallery}) must hold at least the queries' own definitions ({queries})")
    has_example = np.fromiter((bool(s.examples) for s in iter_synsets(root)), dtype=bool)  # pass 1: one bool per synset
    with_examples = np.flatnonzero(has_example)
    if queries > len(with_examples) or gallery > len(has_example):
        raise ValueError(f"wordnet has {len(with_examples)} synsets with an example and {len(has_example)} in all; "
                         f"asked for {queries} queries and a gallery of {gallery}")
    rng = np.random.default_rng(seed)
    query_rows = rng.choice(with_examples, size=queries, replace=False)
    others = np.setdiff1d(np.arange(len(has_example)), query_rows)
    gallery_rows = np.union1d(query_rows, rng.choice(others, size=gallery - queries, replace=False))
    is_query = np.zeros(len(has_example), bool)
    is_query[query_rows] = True
    in_gallery = np.zeros(len(has_example), bool)
    in_gallery[gallery_rows] = True
    in_train = np.zeros(len(has_example), bool)
    if train:  # a child stream of the seed: the draws above never depend on the training split's size
        free = np.flatnonzero(has_example & ~is_query & ~in_gallery)
        if train > len(free):
            raise ValueError(f"wordnet has {len(free)} synsets with an example outside the {queries} queries and the "
                             f"gallery of {gallery} (seed {seed}); asked for train={train}")
        train_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
        in_train[train_rng.choice(free, size=train, replace=False)] = True
    q_texts, q_ids, q_labels, g_texts, g_ids, g_labels = [], [], [], [], [], []
    t_texts, t_ids, t_labels = [], [], []
    for row, synset in enumerate(iter_synsets(root)):  # pass 2: the chosen texts only
        if row >= len(has_example):
            raise ValueError(f"WordNet's files under {root} changed while they were read")
        if is_query[row]:
            q_texts.append(synset.examples[0])
            q_ids.append(synset.id)
            q_labels.append(synset.lexname)
        if in_gallery[row]:
            g_texts.append(synset.definition)
            g_ids.append(synset.id)
            g_labels.append(synset.lexname)
        if in_train[row]:
            t_texts += [synset.examples[0], synset.definition]
            t_ids += [synset.id, synset.id]
            t_labels += [synset.lexname, synset.lexname]
    return WordNetTask(q_texts, q_ids, np.array(q_labels, np.int64), g_texts, g_ids, np.array(g_labels, np.int64),
                       seed=seed, train_texts=t_texts, train_ids=t_ids, train_labels=np.array(t_labels, np.int64))

"""GCIDE (Debian ``dict-gcide``) against WordNet 3.0: a text corpus whose relevance comes from two authors a century
apart, read with plain Python.

The Collaborative International Dictionary of English ships as a dictd database: ``gcide.index`` (one line per
headword: the word, then the entry's offset and length in dictd's base 64) and ``gcide.dict.dz`` (the entries, gzip
compatible). An entry is a header (headword, pronunciation, part of speech, etymology), then its senses, each a
paragraph closed by its source in brackets (``[1913 Webster]``, ``[WordNet 1.5]``, ``[PJC]``).

The task (:func:`gcide_task`): the queries are WordNet definitions of words that WordNet gives one sense only (a
single synset in all four parts of speech: one lowercase word, no spaces), and the gallery holds GCIDE's senses of
words, each taken from Webster's 1913 text (a sense GCIDE took from WordNet is left out, so the two sides never share
an author). A query's relevant items are the GCIDE senses of its own word (at most ``senses`` of them, in the file's
order; the labels are word numbers, so several items are relevant to a query and ``mAP`` applies); the rest of the
gallery is senses of other words drawn with the seed. The files are streamed: WordNet twice (the lemma counts, then
the chosen definitions), the index once (only the candidate words kept) and the dictionary once in offset order
(only their entries read).
"""
from __future__ import annotations

import gzip
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.data.wordnet import WORDNET_ROOT, iter_synsets

GCIDE_ROOT = Path("/usr/share/dictd")
INDEX, DICTIONARY = "gcide.index", "gcide.dict.dz"
MAX_ENTRY_BYTES = 1 << 20  # the longest GCIDE entry is far shorter; a larger one is not a dictd entry
MAX_SENSE_CHARS = 400  # a sense's text is cut here (at a word boundary)
READ_BLOCK = 1 << 20  # the dictionary is decompressed this many bytes at a time
_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_WORD = re.compile(r"^[a-z]+$")
_TAG = re.compile(r"^\s*\[([^\]]*)\]\s*$")
_HEAD = re.compile(r"^(?:[^\\\n]+\\[^\\]*\\,?\s*)+")  # "Word \Pro*nun"ci*a`tion\, Other \...\, "
_GRAMMAR = re.compile(r"^(?:\s+|[,;:&.]|\([^()]*\)|[a-z]{1,6}\.)")  # pronunciation, "n.", "v. t.", "(Med.)", ", "
_AUTHOR = re.compile(r"\s*--\s*[A-Z].*$")  # a trailing quotation's author: " --Sir G. Buck."
_NUMBER = re.compile(r"^(?:\d+\.|\([a-z]\))\s*")


class GcideMissing(ValueError):
    """GCIDE's dictd files are not on this machine."""


@dataclass(frozen=True)
class GcideTask:
    """WordNet definitions (queries) against GCIDE senses (gallery), labelled by word (indices into ``words``)."""

    query_texts: list[str]
    query_labels: np.ndarray  # (n_q,) int64: the query's word
    gallery_texts: list[str]
    gallery_labels: np.ndarray  # (n_g,) int64: the sense's word
    words: tuple[str, ...]  # label -> word
    seed: int = 0


def data_files(root: str | Path = GCIDE_ROOT) -> tuple[Path, Path]:
    """The index and the dictionary; :class:`GcideMissing` (one line saying how to get them) when one is absent."""
    files = (Path(root) / INDEX, Path(root) / DICTIONARY)
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise GcideMissing(f"GCIDE's dictd files are not in {root} (missing {', '.join(missing)}); install them: "
                           "apt-get install dict-gcide")
    return files


def b64_number(text: str) -> int:
    """A dictd index number (base 64, most significant digit first: ``"Bdh"`` -> 5,985)."""
    value = 0
    for ch in text:
        if ch not in _B64:
            raise ValueError(f"not a dictd index number: {text!r}")
        value = value * 64 + _B64[ch]
    return value


def strip_header(text: str) -> str:
    """An entry's first paragraph without its header: headwords with pronunciations, part of speech, etymology
    (balanced brackets) and parenthesised labels, up to where the definition begins."""
    text = _HEAD.sub("", text, count=1)
    while text:
        if text[0] == "[":  # an etymology: skip to its balanced closing bracket
            depth = 0
            for i, ch in enumerate(text):
                depth += {"[": 1, "]": -1}.get(ch, 0)
                if depth == 0:
                    break
            else:
                return ""
            text = text[i + 1:]
            continue
        m = _GRAMMAR.match(text)
        if not m or not m.group(0):
            break
        text = text[m.end():]
    return text


def clean_sense(text: str) -> str:
    """A sense's words: numbering, cross-reference braces, bracketed tags and accent codes and a quotation's author
    removed, spaces collapsed, cut at :data:`MAX_SENSE_CHARS`."""
    text = " ".join(text.split())
    text = _NUMBER.sub("", text)
    text = text.replace("{", "").replace("}", "")
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _AUTHOR.sub("", text)
    text = " ".join(text.split())
    if len(text) > MAX_SENSE_CHARS:
        text = text[:MAX_SENSE_CHARS].rsplit(" ", 1)[0]
    return text


def entry_senses(entry: str, word: str) -> list[str]:
    """The Webster 1913 senses of one entry whose headword is ``word`` (case aside); empty for an entry of another
    headword (the index also lists words an entry only mentions) or one without such a sense."""
    if not entry.lower().startswith(word + " \\"):
        return []
    out = []
    for i, paragraph in enumerate(re.split(r"\n\s*\n", entry)):
        lines = paragraph.rstrip().split("\n")
        tag = _TAG.match(lines[-1])
        if not tag or "webster" not in tag.group(1).lower() or "wordnet" in tag.group(1).lower():
            continue
        body = [ln for ln in lines[:-1] if len(ln) - len(ln.lstrip(" ")) < 8]  # quotations are indented further
        text = " ".join(ln.strip() for ln in body)
        if i == 0:
            text = strip_header(" ".join(text.split()))
        if not text or text.startswith(("Note:", "Syn:", "{")):  # notes, synonym lists, phrases ("{Apple of discord}")
            continue
        text = clean_sense(text)
        if len(text.split()) >= 3:
            out.append(text)
    return out


def monosemous_words(root: str | Path = WORDNET_ROOT) -> set[str]:
    """WordNet's lemmas that are one lowercase word and belong to exactly one synset (all parts of speech)."""
    counts: Counter[str] = Counter()
    for synset in iter_synsets(root):
        counts.update({w for w in synset.words if _WORD.match(w)})
    return {w for w, n in counts.items() if n == 1}


def iter_entries(words: set[str], root: str | Path = GCIDE_ROOT) -> Iterator[tuple[str, str]]:
    """``(word, entry text)`` for each index line whose headword (lowercased) is in ``words``, in offset order (each
    entry once per word); the dictionary is decompressed once, front to back."""
    index, dictionary = data_files(root)
    wanted = set()
    with open(index, encoding="utf-8") as handle:
        for line in handle:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                raise ValueError(f"not a dictd index line in {index}: {line[:60]!r}")
            key = parts[0].lower()
            if key in words:
                wanted.add((b64_number(parts[1]), b64_number(parts[2]), key))
    pos, buffer = 0, b""  # bytes decompressed so far; the buffer holds the last of them (gzip's seek is slow)
    with gzip.open(dictionary, "rb") as data:
        for offset, length, key in sorted(wanted):
            if length > MAX_ENTRY_BYTES:
                raise ValueError(f"{dictionary}: the entry of {key!r} claims {length:,} bytes; not a GCIDE entry")
            while pos < offset + length:
                block = data.read(READ_BLOCK)
                if not block:
                    raise ValueError(f"{dictionary} ends before the entry of {key!r} (offset {offset:,}); reinstall "
                                     "dict-gcide")
                pos, buffer = pos + len(block), buffer + block
                buffer = buffer[max(0, offset - (pos - len(buffer))):]  # nothing before this entry is needed again
            at = offset - (pos - len(buffer))
            yield key, buffer[at: at + length].decode("utf-8", "replace")


def word_senses(words: set[str], *, senses: int, root: str | Path = GCIDE_ROOT) -> dict[str, list[str]]:
    """Each word's first ``senses`` Webster 1913 senses (entries in offset order); words without one are absent."""
    out: dict[str, list[str]] = {}
    for key, entry in iter_entries(words, root):
        got = out.setdefault(key, [])
        got += [s for s in entry_senses(entry, key) if s not in got][: senses - len(got)]
    return {w: s for w, s in out.items() if s}


def gcide_task(*, queries: int = 2000, gallery: int = 6000, seed: int = 0, senses: int = 3,
               root: str | Path = GCIDE_ROOT, wordnet_root: str | Path = WORDNET_ROOT) -> GcideTask:
    """A fixed sample (see the module docstring): ``queries`` words drawn with ``seed`` among WordNet's one-sense words
    that GCIDE defines from Webster 1913, each a query (its WordNet definition) whose relevant items are its own GCIDE
    senses (at most ``senses``); then senses of other words, drawn from the same stream, up to ``gallery`` items.
    Queries keep the drawn order's sort by word; the gallery, each word's senses together. ``ValueError`` when the sizes
    do not fit."""
    for value, what in ((queries, "queries"), (gallery, "gallery"), (senses, "senses")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"gcide {what} must be a positive integer, got {value!r}")
    data_files(root)
    defined = word_senses(monosemous_words(wordnet_root), senses=senses, root=root)
    words = sorted(defined)
    if queries > len(words):
        raise ValueError(f"gcide defines {len(words)} of WordNet's one-sense words; asked for {queries} queries")
    order = np.random.default_rng(seed).permutation(len(words))
    chosen = sorted(words[i] for i in order[:queries])
    chosen_set = set(chosen)
    own = sum(len(defined[w]) for w in chosen)
    if gallery < own:
        raise ValueError(f"the gcide gallery ({gallery}) must hold the queries' own {own} senses")
    take = {w: defined[w] for w in chosen}
    room = gallery - own
    for i in order[queries:]:
        if room <= 0:
            break
        take[words[i]] = defined[words[i]][:room]  # the last drawn word may lose a sense
        room -= len(take[words[i]])
    if room > 0:
        raise ValueError(f"gcide has {gallery - room} senses of {len(words)} words; asked for a gallery of {gallery}")
    g_words = sorted(take)
    label = {w: i for i, w in enumerate(g_words)}
    g_texts = [s for w in g_words for s in take[w]]
    g_labels = [label[w] for w in g_words for _ in take[w]]
    definitions: dict[str, str] = {}
    for synset in iter_synsets(wordnet_root):  # pass 2: the chosen words' definitions only
        for w in synset.words:
            if w in chosen_set:
                definitions[w] = synset.definition
    missing = [w for w in chosen if not definitions.get(w)]
    if missing:
        raise ValueError(f"WordNet gives no definition of {missing[0]!r}; its files changed while they were read")
    return GcideTask([definitions[w] for w in chosen], np.array([label[w] for w in chosen], np.int64), g_texts,
                     np.array(g_labels, np.int64), tuple(g_words), seed=seed)

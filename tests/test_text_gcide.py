"""GCIDE against WordNet (engine.data.gcide): dictd numbers and entries parsed by hand, a tiny dictionary built here,
and the real files' sample when Debian's dict-gcide is installed."""
import gzip

import numpy as np
import pytest

from engine.data.gcide import (GCIDE_ROOT, GcideMissing, b64_number, clean_sense, entry_senses, gcide_task,
                               iter_entries, monosemous_words)
from engine.data.wordnet import WORDNET_ROOT

needs_gcide = pytest.mark.skipif(not (GCIDE_ROOT / "gcide.index").is_file() or not (WORDNET_ROOT / "data.noun").is_file(),
                                 reason="GCIDE's or WordNet's files are absent: apt-get install dict-gcide wordnet-base")
DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

APPLE = """Apple \\Ap"ple\\ ([a^]p"p'l), n. [OE. appel, eppel, AS. [ae]ppel,
   [ae]pl; akin to Fries. & D. appel.]
   1. The fleshy pome or fruit of a rosaceous tree ({Pyrus
      malus}) cultivated in numberless varieties.
      [1913 Webster]

   Note: The European crab apple is supposed to be the original
         kind.
         [1913 Webster]

   2. (bot.) Any tree genus {Pyrus} which has the stalk sunken.
      [1913 Webster]

   3. the fruit of the apple tree.
      [WordNet 1.5]

   {Apple of discord}, a subject of contention and envy.
"""
EXCULPABLE = """Exculpable \\Ex*cul"pa*ble\\
   Capable of being exculpated; deserving exculpation. --Sir G.
   Buck.
   [1913 Webster]

         The varnished clock that clicked behind the door.
                                                  --Goldsmith.
   [1913 Webster]
"""


def b64(value: int) -> str:
    """A dictd index number written here digit by digit (the inverse of the reader's)."""
    out = ""
    while True:
        value, digit = divmod(value, 64)
        out = DIGITS[digit] + out
        if not value:
            return out


def test_dictd_numbers_read_as_written():
    assert b64_number("Bdh") == 1 * 64 * 64 + 29 * 64 + 33 == 5985
    assert b64_number("A") == 0 and b64_number("/") == 63
    for n in (0, 1, 63, 64, 4095, 123_456_789):
        assert b64_number(b64(n)) == n
    with pytest.raises(ValueError, match="dictd index number"):
        b64_number("a-b")


def test_entries_keep_webster_senses_without_header_notes_phrases_or_wordnet():
    assert entry_senses(APPLE, "apple") == [
        "The fleshy pome or fruit of a rosaceous tree (Pyrus malus) cultivated in numberless varieties.",
        "(bot.) Any tree genus Pyrus which has the stalk sunken."]
    assert entry_senses(APPLE, "pyrus") == []  # the index lists words an entry only mentions: not its headword
    # an unnumbered sense: the header goes (headword, pronunciation), the quotation and its author too
    assert entry_senses(EXCULPABLE, "exculpable") == ["Capable of being exculpated; deserving exculpation."]
    assert clean_sense("2. An {iron} [Obs.] for holding wood;  a firedog. --Holland.") == "An iron for holding wood; a firedog."


def _write_wordnet(root, lines):
    for pos in ("noun", "verb", "adj", "adv"):
        (root / f"data.{pos}").write_text("".join(lines) if pos == "noun" else "", encoding="utf-8")


def _write_gcide(root, entries, extra_index=()):
    data, index, at = b"", [], 0
    for word, text in entries:
        raw = text.encode("utf-8")
        index.append(f"{word}\t{b64(at)}\t{b64(len(raw))}")
        data, at = data + raw, at + len(raw)
    index += [f"{w}\t{b64(o)}\t{b64(n)}" for w, o, n in extra_index]
    (root / "gcide.index").write_text("\n".join(sorted(index)) + "\n", encoding="utf-8")
    (root / "gcide.dict.dz").write_bytes(gzip.compress(data))
    return data


def test_a_tiny_dictionary_gives_the_sample_by_hand(tmp_path):
    _write_wordnet(tmp_path, [
        "00000001 05 n 01 aardwolf 0 000 | a nocturnal mammal of Africa that feeds on termites\n",
        "00000002 05 n 01 zebu 0 000 | a domesticated ox having a humped back\n",
        "00000003 05 n 01 bank 0 000 | sloping land beside a body of water\n",
        "00000004 05 n 01 bank 0 000 | a financial institution\n",  # two senses: not a query word
        "00000005 05 n 01 quagga 0 000 | an extinct zebra\n",
        "00000006 05 n 02 Aardwolf 0 civet 0 000 | a proper name\n",  # not lowercase: ignored; civet: one sense
    ])
    aardwolf = ('Aardwolf \\Aard"wolf`\\, n. [D., earth wolf.] (Zool.)\n   1. A carnivorous mammal of South Africa, '
                'resembling the hyena.\n      [1913 Webster]\n\n   2. A second sense of the aardwolf here.\n'
                '      [Webster 1913 Suppl.]\n\n   3. hyena-like mammal.\n      [WordNet 1.5]\n')
    zebu = 'Zebu \\Ze"bu\\, n. (Zool.)\n   The humped ox of India, in many breeds.\n   [1913 Webster]\n'
    quagga = 'Quagga \\Quag"ga\\, n.\n   an extinct zebra of South Africa.\n   [WordNet 1.5]\n'
    bank = 'Bank \\Bank\\, n.\n   A mound, pile, or ridge of earth.\n   [1913 Webster]\n'
    data = _write_gcide(tmp_path, [("Aardwolf", aardwolf), ("Zebu", zebu), ("Quagga", quagga), ("Bank", bank)],
                        extra_index=[("zebu", 0, len(aardwolf.encode()))])  # zebu mentioned in another entry
    assert len(data) == sum(len(t.encode()) for t in (aardwolf, zebu, quagga, bank))
    assert monosemous_words(tmp_path) == {"aardwolf", "zebu", "quagga", "civet"}
    assert [w for w, _ in iter_entries({"zebu"}, tmp_path)] == ["zebu", "zebu"]  # its own entry and the mention

    task = gcide_task(queries=1, gallery=3, seed=0, root=tmp_path, wordnet_root=tmp_path)
    assert task.words == ("aardwolf", "zebu")  # quagga has only a WordNet sense, bank two WordNet senses
    senses = {"aardwolf": ["A carnivorous mammal of South Africa, resembling the hyena.",
                           "A second sense of the aardwolf here."],
              "zebu": ["The humped ox of India, in many breeds."]}
    assert task.gallery_texts == senses["aardwolf"] + senses["zebu"]
    assert task.gallery_labels.tolist() == [0, 0, 1]
    word = task.words[task.query_labels[0]]
    definition = {"aardwolf": "a nocturnal mammal of Africa that feeds on termites",
                  "zebu": "a domesticated ox having a humped back"}[word]
    assert task.query_texts == [definition]
    relevant = [t for t, g in zip(task.gallery_texts, task.gallery_labels) if g == task.query_labels[0]]
    assert relevant == senses[word]
    with pytest.raises(ValueError, match="asked for 3 queries"):
        gcide_task(queries=3, gallery=5, root=tmp_path, wordnet_root=tmp_path)
    with pytest.raises(ValueError, match="own"):
        gcide_task(queries=2, gallery=2, root=tmp_path, wordnet_root=tmp_path)


def test_missing_files_say_how_to_install_them(tmp_path):
    with pytest.raises(GcideMissing) as err:
        gcide_task(root=tmp_path)
    assert "apt-get install dict-gcide" in str(err.value) and "\n" not in str(err.value)


@needs_gcide
def test_real_sample_is_seeded_and_sized():
    task = gcide_task(queries=40, gallery=150, seed=3)
    again = gcide_task(queries=40, gallery=150, seed=3)
    assert task.query_texts == again.query_texts and task.gallery_texts == again.gallery_texts
    assert len(task.query_texts) == 40 and len(task.gallery_texts) == 150
    assert len(set(task.query_labels.tolist())) == 40  # one query per word
    for label in task.query_labels:  # every query meets at least one and at most 3 of its word's senses
        assert 1 <= int(np.sum(task.gallery_labels == label)) <= 3
    assert all(len(t.split()) >= 3 and "[" not in t and "{" not in t for t in task.gallery_texts)

"""WordNet as a text corpus (engine.data.wordnet): lines parsed by hand, the files' counts, the seeded sample."""
import numpy as np
import pytest

from engine.data.wordnet import (
    LEXNAMES,
    WORDNET_ROOT,
    WordNetMissing,
    definition_of,
    iter_synsets,
    parse_line,
    parse_options,
    wordnet_task,
)

needs_wordnet = pytest.mark.skipif(not (WORDNET_ROOT / "data.noun").is_file(),
                                   reason="WordNet's files are absent: apt-get install wordnet-base")


def real_line(pos: str, offset: str) -> str:
    """The line of ``data.POS`` for synset ``offset`` (read here with a plain prefix search)."""
    with open(WORDNET_ROOT / f"data.{pos}", encoding="utf-8") as handle:
        return next(line for line in handle if line.startswith(offset + " "))


@needs_wordnet
def test_hand_picked_lines_parse_as_read_by_eye():
    dog = parse_line(real_line("noun", "02084071"))
    assert dog.id == "02084071-n"
    assert LEXNAMES[dog.lexname] == "noun.animal"  # lexicographer file 05
    assert dog.words == ("dog", "domestic dog", "Canis familiaris")
    assert dog.definition == ("a member of the genus Canis (probably descended from the common wolf) that has been "
                              "domesticated by man since prehistoric times; occurs in many breeds")
    assert dog.examples == ("the dog barked all night",)

    choke = parse_line(real_line("verb", "00002724"))
    assert (choke.id, LEXNAMES[choke.lexname], choke.words) == ("00002724-v", "verb.body", ("choke",))
    assert choke.definition == "breathe with great difficulty, as when experiencing a strong emotion"
    assert choke.examples == ("She choked with emotion when she spoke about her deceased husband",)

    breathe = parse_line(real_line("verb", "00001740"))  # four words, two examples
    assert breathe.words == ("breathe", "take a breath", "respire", "suspire")
    assert breathe.examples == ("I can breathe better when the air is clean", "The patient is respiring")
    assert breathe.definition == "draw air into, and expel out of, the lungs"


def test_definition_drops_every_quoted_example_and_empty_part():
    gloss = 'move fast; "he ran to the store"; "she ran home"; of liquids'
    assert definition_of(gloss) == "move fast; of liquids"
    assert parse_line("  1 This software and database\n") is None  # the licence header


@needs_wordnet
def test_counts_match_the_files():
    # independent counts: data lines are those not opening with a space; examples are glosses with a quoted part
    lines = examples = 0
    lexes = set()
    for pos in ("noun", "verb", "adj", "adv"):
        with open(WORDNET_ROOT / f"data.{pos}", encoding="utf-8") as handle:
            for line in handle:
                if not line.startswith(" "):
                    lines += 1
                    lexes.add(line.split()[1])
                    gloss = line.split(" | ", 1)[1]
                    examples += gloss.count('"') >= 2
    synsets = list(iter_synsets())
    assert len(synsets) == lines == 117_659
    assert len({s.lexname for s in synsets}) == len(lexes) == len(LEXNAMES) == 45
    assert sum(bool(s.examples) for s in synsets) == examples == 32_923
    assert len({s.id for s in synsets}) == len(synsets)


@needs_wordnet
def test_sample_is_seeded_and_every_query_meets_its_own_definition():
    task = wordnet_task(queries=50, gallery=200, seed=3)
    again = wordnet_task(queries=50, gallery=200, seed=3)
    other = wordnet_task(queries=50, gallery=200, seed=4)
    assert task.query_ids == again.query_ids and task.gallery_texts == again.gallery_texts
    assert task.query_ids != other.query_ids
    assert len(task.query_texts) == 50 and len(task.gallery_texts) == 200 == len(set(task.gallery_ids))
    by_id = {s.id: s for s in iter_synsets() if s.id in set(task.gallery_ids)}
    for qid, text, label in zip(task.query_ids, task.query_texts, task.query_labels):
        assert text == by_id[qid].examples[0] and label == by_id[qid].lexname
    for gid, text, label in zip(task.gallery_ids, task.gallery_texts, task.gallery_labels):
        assert text == by_id[gid].definition and label == by_id[gid].lexname
    q, g = task.relevance_labels("qrels")
    assert [task.gallery_ids[i] for i in q] == task.query_ids and np.array_equal(g, np.arange(200))
    assert task.qrels[task.query_ids[0]] == {task.query_ids[0]: 1}
    q, g = task.relevance_labels("class")
    assert np.array_equal(q, task.query_labels) and np.array_equal(g, task.gallery_labels)


def test_missing_files_say_how_to_install_them(tmp_path):
    with pytest.raises(WordNetMissing) as err:
        next(iter_synsets(tmp_path))
    assert "apt-get install wordnet-base" in str(err.value) and "\n" not in str(err.value)


def test_options_are_strict():
    assert parse_options("task=class,queries=10,gallery=30,seed=2").queries == 10
    assert parse_options(None).task == "qrels"
    for bad, words in (("task=pairs", "task"), ("queries=ten", "whole number"), ("queries=9,gallery=5", "queries <= gallery"),
                       ("size=3", "KEY=VALUE"), ("root=/etc", "KEY=VALUE")):
        with pytest.raises(ValueError, match=words):
            parse_options(bad)


@needs_wordnet
def test_sizes_beyond_the_files_are_refused():
    with pytest.raises(ValueError, match="32923 synsets with an example"):
        wordnet_task(queries=40_000, gallery=50_000)
    with pytest.raises(ValueError, match="at least the queries"):
        wordnet_task(queries=10, gallery=5)

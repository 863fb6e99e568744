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


def file_synsets(ids: set[str]) -> dict[str, tuple[int, str, str]]:
    """``id -> (lexicographer file number, first example, definition)`` read from the files with str methods only
    (independent of the parser): the text between the first two double quotes, and the gloss outside quotes split on
    ';' with empty parts dropped."""
    files = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
    out = {}
    for pos in sorted({i.split("-")[1] for i in ids}):
        with open(WORDNET_ROOT / f"data.{files[pos]}", encoding="utf-8") as handle:
            for line in handle:
                offset = line.split(" ", 1)[0]
                if f"{offset}-{pos}" in ids:
                    head, gloss = line.split(" | ", 1)
                    outside = "".join(gloss.split('"')[0::2])
                    definition = "; ".join(p.strip() for p in outside.split(";") if p.strip())
                    out[f"{offset}-{pos}"] = (int(head.split()[1]), gloss.split('"')[1].strip(), definition)
    return out


@needs_wordnet
def test_train_split_is_two_texts_of_other_synsets_and_leaves_the_sample_as_it_was():
    plain = wordnet_task(queries=40, gallery=120, seed=1)
    task = wordnet_task(queries=40, gallery=120, seed=1, train=50)
    for split in ("query", "gallery"):  # train=50 draws from its own stream: the sample does not move
        assert getattr(task, f"{split}_ids") == getattr(plain, f"{split}_ids")
        assert getattr(task, f"{split}_texts") == getattr(plain, f"{split}_texts")
        assert np.array_equal(getattr(task, f"{split}_labels"), getattr(plain, f"{split}_labels"))
    assert plain.train_texts == [] and plain.train_ids == [] and len(plain.train_labels) == 0
    assert len(task.train_texts) == len(task.train_ids) == len(task.train_labels) == 100
    synsets = task.train_ids[0::2]
    assert synsets == task.train_ids[1::2] and len(set(synsets)) == 50  # two texts per synset, 50 synsets
    assert not set(synsets) & (set(task.query_ids) | set(task.gallery_ids))
    truth = file_synsets(set(synsets))
    assert len(truth) == 50
    for i, sid in enumerate(synsets):
        lex, example, definition = truth[sid]
        assert task.train_texts[2 * i: 2 * i + 2] == [example, definition]
        assert task.train_labels[2 * i] == task.train_labels[2 * i + 1] == lex
        assert LEXNAMES[lex].startswith({"n": "noun.", "v": "verb.", "a": "adj.", "r": "adv."}[sid[-1]])
    again = wordnet_task(queries=40, gallery=120, seed=1, train=50)
    other = wordnet_task(queries=40, gallery=120, seed=2, train=50)
    assert again.train_texts == task.train_texts and other.train_ids != task.train_ids


@needs_wordnet
def test_a_train_split_that_does_not_fit_is_refused_in_one_line():
    with pytest.raises(ValueError, match="asked for train=40000") as err:
        wordnet_task(queries=40, gallery=120, train=40_000)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="whole number of synsets"):
        wordnet_task(queries=40, gallery=120, train=-1)


def test_train_option_defaults_to_none():
    assert parse_options(None).train == 0 and parse_options("train=7,queries=5,gallery=9").train == 7
    with pytest.raises(ValueError, match="whole number"):
        parse_options("train=-3")

"""Tagged data for token classification: CoNLL and JSON-lines files (CoNLL-2003 read in place), their
bad input, entities and entity F1 (hand-computed cases, IOB1 and IOB2, seqeval's documented example),
and the alignment of words to pieces with windows."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA

from bertforge.alignment import encode_words, regroup, sentence_pieces, text_words, word_windows
from bertforge.comparison import paired_bootstrap_f1
from bertforge.entities import entity_scores, entity_spans, f1_from_counts, sentence_counts
from bertforge.errors import BertforgeError
from bertforge.losses import NO_LABEL
from bertforge.tagged import is_tagged_file, read_tagged, tag_ids, tag_names
from bertforge.tokenizer import load_tokenizer

CONLL = SHARED_DATA / "conll2003"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- files


def test_conll_2003_is_read_as_distributed():
    train = read_tagged(CONLL / "train.txt")
    assert len(train) == 14_041 and len(read_tagged(CONLL / "dev.txt")) == 3_250
    assert train.sentences[0] == ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
    assert train.tags[0] == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]  # the last column
    assert train.sentences[1] == ["Peter", "Blackburn"] and train.tags[1] == ["B-PER", "I-PER"]
    lines = (CONLL / "train.txt").read_text(encoding="utf-8").split("\n")
    assert lines[train.lines[1] - 1].startswith("Peter ")  # the line each sentence starts on
    assert tag_names(train) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert is_tagged_file(CONLL / "train.txt") and is_tagged_file(CONLL / "dev.txt")
    assert not is_tagged_file(SHARED_DATA / "sst-2" / "train.tsv")


def test_a_rare_entity_type_is_named_as_a_possible_typo(tmp_path):
    """A typo'd tag becomes an entity type of its own: one warning names it and where it first is; the
    types of CoNLL-2003 itself draw none."""
    lines = (CONLL / "train.txt").read_text(encoding="utf-8").splitlines()[:3000]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = tag_names(read_tagged(write(tmp_path / "clean.txt", "\n".join(lines) + "\n")))
    typo = write(
        tmp_path / "typo.txt", "\n".join([*lines[:200], "Smith NNP B-NP B-PRS", *lines[200:]]) + "\n"
    )
    with pytest.warns(
        UserWarning, match=r"the entity type 'PRS' is under 1% of the .* \(first at .*typo.txt line 201\)"
    ):
        assert set(tag_names(read_tagged(typo))) == {*names, "B-PRS", "I-PRS"}


def test_docstart_lines_are_skipped_and_columns_can_be_named(tmp_path):
    path = write(
        tmp_path / "x.txt",
        "-DOCSTART- -X- -X- O\n\nJohn NNP B-NP I-PER\nlives VBZ B-VP O\n\n-DOCSTART- -X- -X- O\n"
        "Paris NNP B-NP I-LOC\n",
    )
    data = read_tagged(path)
    assert data.sentences == [["John", "lives"], ["Paris"]] and data.tags == [
        ["I-PER", "O"],
        ["I-LOC"],
    ]  # IOB1
    assert data.lines == [3, 7]
    chunks = read_tagged(path, tag_column="2")
    assert chunks.tags == [["B-NP", "B-VP"], ["B-NP"]]
    assert read_tagged(path, token_column="1").sentences == [["NNP", "VBZ"], ["NNP"]]


@pytest.mark.parametrize("column", ["--1", "\u00b2", "one"])
def test_a_column_that_is_not_a_number_is_named(tmp_path, column):
    path = write(tmp_path / "x.txt", "EU B-ORG\nrejects O\n")
    with pytest.raises(BertforgeError, match="given by number, counting from 0"):
        read_tagged(path, tag_column=column)


def test_a_short_tagged_file_without_a_last_line_break_is_recognised(tmp_path):
    assert is_tagged_file(write(tmp_path / "short.data", "EU B-ORG\nrejects O\nGerman B-MISC"))
    record = json.dumps({"tokens": ["Rome"], "tags": ["B-LOC"]})
    assert is_tagged_file(write(tmp_path / "one.jsonl", record))


def test_json_lines_of_tokens_and_tags(tmp_path):
    rows = [
        {"tokens": ["Ada", "Lovelace", "wrote"], "tags": ["B-PER", "I-PER", "O"]},
        {"tokens": ["Hi"], "tags": ["O"]},
    ]
    path = write(tmp_path / "x.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    data = read_tagged(path)
    assert data.sentences == [row["tokens"] for row in rows] and data.lines == [1, 2]
    assert is_tagged_file(path)
    assert not is_tagged_file(write(tmp_path / "y.jsonl", '{"text": "a b", "label": "O"}\n'))
    named = write(tmp_path / "z.jsonl", '{"words": ["Rome"], "ner": ["B-LOC"]}\n')
    assert read_tagged(named, "words", "ner").tags == [["B-LOC"]]
    assert is_tagged_file(named, "words", "ner") and not is_tagged_file(named)
    with_mark = tmp_path / "bom.jsonl"  # a byte-order mark, as some editors write
    with_mark.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8-sig")
    assert is_tagged_file(with_mark) and read_tagged(with_mark).sentences == data.sentences


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "EU NNP B-ORG\nrejects VBZ O\nGerman B-MISC\n",
            "line 3 has 2 columns, but line 1 (the first token line) has 3",
        ),
        ("EU NNP ORG\n", "line 1: the tag 'ORG' is not O, B-TYPE or I-TYPE"),
        ("EU\nrejects\n", "line 1 has one column"),
        ("", "is empty"),
        ("-DOCSTART- -X- O\n\n", "holds no sentences"),
        (
            '{"tokens": ["a", "b"], "tags": ["O"]}\n',
            "line 1: 'tokens' has 2 items and 'tags' 1; give one tag",
        ),
        ('{"tokens": ["EU", ""], "tags": ["B-ORG", "O"]}\n', "line 1: 'tokens' item 2 is empty"),
        ('{"tokens": [], "tags": []}\n', "line 1: 'tokens' is empty; remove the line"),
        ('{"tokens": "EU", "tags": ["B-ORG"]}\n', "line 1: 'tokens' must be a list of strings"),
        ('{"tokens": ["a"]}\n', "needs the fields 'tokens' and 'tags'"),
        (
            '{"tokens": ["EU"], "tags": [3]}\n',
            "line 1: 'tags' holds numbers (tag ids); give the tags by name",
        ),
    ],
)
def test_bad_tagged_files_are_refused_naming_the_file_and_line(tmp_path, text, message):
    suffix = ".jsonl" if text.startswith("{") else ".txt"
    path = write(tmp_path / f"bad{suffix}", text)
    with pytest.raises(BertforgeError, match="bad") as error:
        read_tagged(path)
    assert message in str(error.value)


def test_tags_outside_the_set_and_a_single_tag_are_refused(tmp_path):
    train = read_tagged(write(tmp_path / "train.txt", "Rome B-LOC\nis O\n\nParis B-LOC\n"))
    names = tag_names(train)
    assert names == ["O", "B-LOC", "I-LOC"]  # a type's I- too, which the validation file may hold
    valid = read_tagged(write(tmp_path / "valid.txt", "Ada B-PER\n\nRome B-LOC\nand O\nBob B-PER\n"))
    with pytest.raises(
        BertforgeError, match=r"valid.txt line 1: the tag 'B-PER' is not in the training file"
    ):
        tag_ids(valid, names)
    assert tag_ids(read_tagged(write(tmp_path / "v.txt", "New B-LOC\nYork I-LOC\nis O\n")), names) == [
        [1, 2, 0]
    ]
    with pytest.raises(BertforgeError, match="every word in .* is tagged 'O'"):
        tag_names(read_tagged(write(tmp_path / "o.txt", "a O\nb O\n")))


# ---------------------------------------------------------------------------------------- entities


def test_entity_spans_of_iob2_and_iob1():
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]
    assert entity_spans(["B-LOC", "B-LOC", "I-LOC"]) == [("LOC", 0, 1), ("LOC", 1, 3)]  # B- starts anew
    # IOB1: an entity starts with I-; B- only where it follows one of its own type
    assert entity_spans(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == [
        ("PER", 0, 2),
        ("LOC", 3, 4),
        ("LOC", 4, 5),
    ]
    assert entity_spans([]) == [] and entity_spans(["O", "O"]) == []


def test_a_b_followed_by_a_mismatched_i_is_two_entities():
    assert entity_spans(["B-PER", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 2)]
    assert entity_spans(["B-PER", "I-PER", "I-LOC", "O"]) == [("PER", 0, 2), ("LOC", 2, 3)]
    assert entity_spans(["O", "I-ORG", "I-ORG"]) == [("ORG", 1, 3)]  # an I- after O starts one


def test_entity_scores_by_hand():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-PER"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "B-PER"]]
    scores = entity_scores(true, predicted)
    # true: PER, LOC, ORG, PER (4); predicted: PER, ORG, ORG, PER (4); found: PER, ORG, PER (3)
    assert scores["precision"] == pytest.approx(3 / 4) and scores["recall"] == pytest.approx(3 / 4)
    assert scores["f1"] == pytest.approx(3 / 4) and scores["accuracy"] == pytest.approx(6 / 7)
    assert scores["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}
    assert scores["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert scores["per_type"]["ORG"] == pytest.approx(
        {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1}
    )
    # a span one word short is no match: exact first word, last word and type
    short = entity_scores([["B-PER", "I-PER"]], [["B-PER", "O"]])
    assert short["f1"] == 0.0 and short["precision"] == 0.0


def test_entity_scores_as_seqeval_documents_them():
    # seqeval's README: f1_score 0.50; MISC 0.00 and PER 1.00, one true entity each
    true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    predicted = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    scores = entity_scores(true, predicted)
    assert scores["f1"] == pytest.approx(0.50) and scores["accuracy"] == pytest.approx(0.80)
    assert scores["per_type"]["MISC"]["f1"] == 0.0 and scores["per_type"]["PER"]["f1"] == 1.0
    # IOB1 and IOB2 tags of the same entities score alike against each other
    assert entity_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["I-PER", "I-PER", "O", "I-LOC"]])["f1"] == 1.0


def test_sentence_counts_give_the_same_f1_and_the_bootstrap_is_paired():
    rng = np.random.default_rng(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    true = [list(rng.choice(tags, size=rng.integers(1, 9))) for _ in range(40)]
    guess = [[tag if rng.random() < 0.7 else str(rng.choice(tags)) for tag in sentence] for sentence in true]
    counts = sentence_counts(true, guess)
    assert counts.shape == (40, 3)
    assert f1_from_counts(counts.sum(0)) == pytest.approx(entity_scores(true, guess)["f1"])
    same = paired_bootstrap_f1(counts[None], counts[None], resamples=200)
    assert same["gain"] == 0.0 and same["p_value"] == 1.0
    perfect = sentence_counts(true, true)[None]
    better = paired_bootstrap_f1(perfect, counts[None], resamples=500)
    assert better["gain"] == pytest.approx(1.0 - entity_scores(true, guess)["f1"])
    assert better["low"] > 0 and better["p_value"] < 0.01 and better["examples"] == 40


# --------------------------------------------------------------------------------------- alignment


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer_dir):
    return load_tokenizer(small_tokenizer_dir)


def test_the_first_piece_carries_the_tag_and_the_rest_are_ignored(tokenizer):
    words = ["Blackburn", "met", "Zbigniew", "\u200b", "."]
    (pieces,) = sentence_pieces(tokenizer, [words])
    assert len(pieces) == 5 and len(pieces[0]) > 1 and len(pieces[2]) > 1  # split into pieces
    assert pieces[3] == [tokenizer.unk_id]  # a word without pieces still has a first one
    (example,) = encode_words(tokenizer, pieces, max_length=64, tags=[7, 0, 7, 0, 0])
    flat = [piece for word in pieces for piece in word]
    assert example["input_ids"] == [tokenizer.cls_id, *flat, tokenizer.sep_id]
    firsts = example["firsts"]
    assert [example["input_ids"][p] for p in firsts] == [word[0] for word in pieces]
    assert [example["label"][p] for p in firsts] == [7, 0, 7, 0, 0]
    rest = [label for p, label in enumerate(example["label"]) if p not in firsts]
    assert rest == [NO_LABEL] * (len(flat) + 2 - 5)  # other pieces, [CLS] and [SEP]


def test_long_sentences_become_windows_that_are_put_back_together(tokenizer):
    assert word_windows([3, 2, 2, 4, 1], budget=5) == [range(0, 2), range(2, 3), range(3, 5)]
    assert word_windows([7, 1], budget=5) == [range(0, 1), range(1, 2)]  # a word too long alone
    sentences = [["The", "European", "Commission", "said", "on", "Thursday", "it", "disagreed"] * 3, ["Yes"]]
    tags = [[i % 3 for i in range(len(words))] for words in sentences]
    examples = []
    for words, word_tags in zip(sentence_pieces(tokenizer, sentences), tags, strict=True):
        examples += encode_words(tokenizer, words, max_length=10, tags=word_tags)
    assert len(examples) > 3 and all(len(example["input_ids"]) <= 10 for example in examples)
    assert all(
        e["input_ids"][0] == tokenizer.cls_id and e["input_ids"][-1] == tokenizer.sep_id for e in examples
    )
    # each word labelled once, in order: the windows' first pieces read back the sentences' tags
    read_back = [example["label"][p] for example in examples for p in example["firsts"]]
    assert regroup(read_back, [len(words) for words in sentences]) == tags
    with pytest.raises(ValueError):
        regroup(read_back, [3])


def test_raw_text_words_and_their_character_offsets(tokenizer):
    text = "Peter Blackburn met the U.N. envoy, in Brussels."
    pieces, spans = text_words(tokenizer, text)
    assert [text[s:e] for s, e in spans] == [
        "Peter",
        "Blackburn",
        "met",
        "the",
        "U.N.",  # one word, as CoNLL-2003 writes it
        "envoy",
        ",",
        "in",
        "Brussels",
        ".",
    ]
    assert len(pieces) == len(spans) and all(pieces)
    assert pieces == sentence_pieces(tokenizer, [[text[s:e] for s, e in spans]])[0]  # as in training
    text = "J. O'Neil's  (York-based) firm... said: \"no!\""
    words = [text[s:e] for s, e in text_words(tokenizer, text)[1]]
    assert words == [
        "J.",
        "O'Neil",
        "'s",
        "(",
        "York-based",
        ")",
        "firm",
        "...",
        "said",
        ":",
        '"',
        "no",
        "!",
        '"',
    ]
    text = "Mr. Smith 's firm in 東京 (U.S.) sold 3.5."
    words = [text[s:e] for s, e in text_words(tokenizer, text)[1]]
    assert words == ["Mr.", "Smith", "'s", "firm", "in", "東", "京", "(", "U.S.", ")", "sold", "3.5", "."]
    assert text_words(tokenizer, "  ") == ([], [])


@pytest.mark.parametrize(
    "word", ["Capt.", "Fig.", "Jan.", "Corp.", "CORP.", "e.g.", "J.", "U.S.", "a.m.", "no.", "a.", "say."]
)
def test_the_word_splitter_keeps_a_period_where_the_sentence_splitter_does(tokenizer, word):
    """One list of abbreviations: a period that does not end a sentence stays on its word when
    `bertforge tag` splits words, and one that does is a word of its own."""
    from bertforge.corpus import split_sentences

    text = f"They met {word} Smith came."
    one_sentence = split_sentences(text) == [text]
    words = [text[s:e] for s, e in text_words(tokenizer, text)[1]]
    assert (word in words) == one_sentence
    assert one_sentence == (word not in ("no.", "a.", "say."))


@pytest.mark.parametrize("end", ["\r", "\r\r\n"])
def test_a_conll_file_with_cr_only_or_cr_cr_lf_line_ends_reads_as_with_lf(tmp_path, end):
    """An old Mac's line ends, and CRLF text saved again through Windows' text mode (CR CR LF)."""
    text = "-DOCSTART- -X- -X- O\n\nJohn NNP B-NP B-PER\nlives VBZ B-VP O\n\nParis NNP B-NP B-LOC\n"
    expected = read_tagged(write(tmp_path / "lf.txt", text))
    path = tmp_path / "other.txt"
    path.write_bytes(text.replace("\n", end).encode())
    assert is_tagged_file(path)
    data = read_tagged(path)
    assert (data.sentences, data.tags, data.lines) == (expected.sentences, expected.tags, expected.lines)

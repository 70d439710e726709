"""Tokenizer training, encoding, saving/loading and parity with transformers.BertTokenizerFast."""

import hashlib
import itertools
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bertforge.config import RunConfig, TokenizerConfig, validate
from bertforge.corpus import read_documents
from bertforge.errors import BertforgeError
from bertforge.tokenizer import SPECIAL_TOKENS, BertTokenizer, load_tokenizer, train_tokenizer

VALID = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "wiki.valid.tokens"
PAIR = ("The lobster is blue.", "It turns red on cooking!")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[BertTokenizer, Path]:
    out_dir = tmp_path_factory.mktemp("tok") / "wordpiece"
    config = TokenizerConfig(kind="wordpiece", vocab_size=3000, min_frequency=2)
    return train_tokenizer([VALID], config, out_dir, show_progress=False), out_dir


@pytest.fixture(scope="module")
def valid_sentences() -> list[str]:
    documents = itertools.islice(read_documents(VALID), 3)
    return [sentence for document in documents for sentence in document[:3]]


def test_special_ids_and_files(trained):
    tokenizer, out_dir = trained
    assert [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.special_ids == (0, 1, 2, 3, 4)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    vocab = (out_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == list(SPECIAL_TOKENS) and len(vocab) == tokenizer.vocab_size == 3000
    assert tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size)) == vocab
    assert tokenizer.fingerprint == hashlib.sha256((out_dir / "tokenizer.json").read_bytes()).hexdigest()[:16]
    assert (tokenizer.kind, tokenizer.lowercase) == ("wordpiece", True)


def test_round_trip_and_wordpieces(trained, valid_sentences):
    tokenizer, _ = trained
    text = "The Lobsters were Caught near the British Isles, in 1990."
    assert tokenizer.decode(tokenizer.encode_batch([text])[0]) == text.lower()
    ids = tokenizer.encode_batch(["Unbelievably, crustaceans metamorphose."])[0]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert any(token.startswith("##") for token in tokens)
    mask = tokenizer.continuation_mask()
    assert mask.dtype == np.bool_ and mask.shape == (tokenizer.vocab_size,)
    assert mask[ids].tolist() == [token.startswith("##") for token in tokens]
    assert not mask[list(tokenizer.special_ids)].any()


def test_wikitext_unk_becomes_the_unknown_token(trained, valid_sentences):
    tokenizer, _ = trained
    sentence = next(s for s in valid_sentences if "[UNK]" in s)
    ids = tokenizer.encode_batch([sentence])[0]
    assert ids.count(tokenizer.unk_id) >= sentence.count("[UNK]") > 0
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode_batch(["a [UNK] b"])[0]) == ["a", "[UNK]", "b"]
    assert tokenizer.token_to_id("unk") is None  # "[UNK]" was not learned as a word during training
    assert not {"##UNK]", "##NK]", "##K]"} & set(tokenizer.backend.get_vocab())  # nor were its pieces


def test_encode_pair_layout_and_truncation(trained):
    tokenizer, _ = trained
    first, second = tokenizer.encode_batch(list(PAIR))
    ids, types = tokenizer.encode_pair(*PAIR)
    assert ids == [2, *first, 3, *second, 3]
    assert types == [0] * (len(first) + 2) + [1] * (len(second) + 1)
    assert ids == tokenizer.backend.encode(*PAIR).ids  # the saved post-processor agrees
    assert tokenizer.encode_pair(PAIR[0]) == ([2, *first, 3], [0] * (len(first) + 2))
    ids, types = tokenizer.encode_pair("a " * 20, "b c d", max_length=12)
    assert ids == [2, *[tokenizer.token_to_id("a")] * 6, 3, *tokenizer.encode_batch(["b c d"])[0], 3]
    assert len(types) == 12 and types.count(1) == 4
    with pytest.raises(BertforgeError, match="max_length"):
        tokenizer.encode_pair("a", "b", max_length=2)


def test_save_and_load_give_the_same_tokenizer(trained, valid_sentences, tmp_path):
    tokenizer, out_dir = trained
    loaded = load_tokenizer(out_dir)
    assert loaded.fingerprint == tokenizer.fingerprint
    assert (loaded.kind, loaded.lowercase, loaded.min_frequency) == ("wordpiece", True, 2)
    expected = tokenizer.encode_batch(valid_sentences)
    assert loaded.encode_batch(valid_sentences) == expected
    for name in ("tokenizer.json", "vocab.txt"):  # a folder with only one of the files also loads
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(out_dir / name, folder / name)
        alone = load_tokenizer(folder)
        assert alone.encode_batch(valid_sentences) == expected
        assert alone.encode_pair(*PAIR) == tokenizer.encode_pair(*PAIR)
    resaved = load_tokenizer(loaded.save(tmp_path / "again"))
    assert resaved.fingerprint == tokenizer.fingerprint


def test_save_into_an_existing_folder_keeps_other_files(trained, tmp_path):
    tokenizer, _ = trained
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    tokenizer.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bertforge_tokenizer.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert load_tokenizer(tmp_path).fingerprint == tokenizer.fingerprint
    with pytest.raises(BertforgeError, match="is a file"):
        tokenizer.save(tmp_path / "model.safetensors")


def test_hugging_face_bert_tokenizer_fast_agrees(trained, valid_sentences):
    transformers = pytest.importorskip("transformers")
    tokenizer, out_dir = trained
    hf = transformers.BertTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"))
    for a, b in itertools.pairwise(valid_sentences):
        ours = tokenizer.encode_pair(a, b)
        theirs = hf(a, b)
        assert (theirs["input_ids"], theirs["token_type_ids"]) == ours
        assert hf(a, add_special_tokens=False)["input_ids"] == tokenizer.encode_batch([a])[0]
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (
        0,
        1,
        2,
        3,
        4,
    )


def test_wordlevel_min_frequency(tmp_path):
    corpus = tmp_path / "words.txt"
    corpus.write_text("Apple pear apple. [UNK] pear.\n\nApple kiwi pear.\n", encoding="utf-8")
    config = TokenizerConfig(kind="wordlevel", vocab_size=100, min_frequency=2, lowercase=True)
    tokenizer = train_tokenizer([corpus], config, tmp_path / "wl", show_progress=False)
    assert tokenizer.kind == "wordlevel"
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode_batch(["APPLE kiwi pear"])[0]) == [
        "apple",
        "[UNK]",
        "pear",
    ]
    assert tokenizer.token_to_id("kiwi") is None  # seen once, below min_frequency
    vocab = tokenizer.backend.get_vocab()
    assert sorted(vocab.values()) == list(
        range(tokenizer.vocab_size)
    )  # dense ids despite "[UNK]" in the text
    assert not tokenizer.continuation_mask().any()
    assert load_tokenizer(tmp_path / "wl").encode_batch(["apple pear"]) == tokenizer.encode_batch(
        ["apple pear"]
    )


def test_a_wordlevel_vocabulary_has_the_size_asked_for_when_the_text_holds_unk(tmp_path):
    corpus = tmp_path / "words.txt"  # 30 words seen twice and [UNK] (WikiText's <unk>): room for 20
    corpus.write_text(" ".join(f"w{i} w{i} [UNK]" for i in range(30)) + "\n", encoding="utf-8")
    config = TokenizerConfig(kind="wordlevel", vocab_size=25, min_frequency=2)
    tokenizer = train_tokenizer([corpus], config, tmp_path / "wl", show_progress=False)
    assert tokenizer.vocab_size == 25
    assert sorted(tokenizer.backend.get_vocab().values()) == list(range(25))


def test_wordpiece_on_text_of_single_characters(tmp_path):
    """Chinese characters are words of one character each: the survey finds no `##` pieces, and the
    vocabulary is still learned from the whole text."""
    corpus = tmp_path / "chinese.txt"
    corpus.write_text("我们喜欢读书。\n\n他们也喜欢读书。\n", encoding="utf-8")
    config = TokenizerConfig(kind="wordpiece", vocab_size=100, min_frequency=1, lowercase=True)
    tokenizer = train_tokenizer([corpus], config, tmp_path / "zh", show_progress=False)
    assert {"我", "书", "读"} <= set(tokenizer.backend.get_vocab())
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode_batch(["喜欢"])[0]) == ["喜", "欢"]


def test_cased_tokenizer_keeps_case(tmp_path):
    corpus = tmp_path / "cased.txt"
    corpus.write_text("Paris is big. Paris is old.\n\nParis Paris Paris.\n", encoding="utf-8")
    config = TokenizerConfig(kind="wordlevel", vocab_size=50, min_frequency=1, lowercase=False)
    tokenizer = train_tokenizer([corpus], config, tmp_path / "cased", show_progress=False)
    assert tokenizer.token_to_id("Paris") is not None and tokenizer.token_to_id("paris") is None
    assert load_tokenizer(tmp_path / "cased").lowercase is False


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_tokenizer_folder_loads_in_transformers_with_its_own_casing(tmp_path, lowercase):
    transformers = pytest.importorskip("transformers")
    config = TokenizerConfig(kind="wordpiece", vocab_size=3000, min_frequency=2, lowercase=lowercase)
    tokenizer = train_tokenizer([VALID], config, tmp_path / "tok", show_progress=False)
    hf = transformers.BertTokenizerFast.from_pretrained(str(tmp_path / "tok"))
    text = "The Album sold Millions of copies in Ireland ."
    assert hf(text)["input_ids"] == tokenizer.encode_pair(text, None)[0]
    assert ("The" in hf.tokenize(text)) is not lowercase


def cased_tokenizer(tmp_path) -> Path:
    config = TokenizerConfig(kind="wordpiece", vocab_size=3000, min_frequency=2, lowercase=False)
    train_tokenizer([VALID], config, tmp_path / "cased", show_progress=False)
    return tmp_path / "cased"


def test_a_hugging_face_vocab_folder_keeps_the_casing_its_config_gives(tmp_path, trained):
    folder = tmp_path / "hf"
    folder.mkdir()
    cased = load_tokenizer(cased_tokenizer(tmp_path))
    vocab = sorted(cased.backend.get_vocab(), key=cased.backend.get_vocab().get)
    (folder / "vocab.txt").write_text("\ufeff" + "\n".join(vocab) + "\n", encoding="utf-8")  # with a BOM
    assert load_tokenizer(folder).lowercase is True  # no tokenizer_config.json: BertTokenizer's default
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    tokenizer = load_tokenizer(folder)
    assert tokenizer.lowercase is False and "The" in tokenizer.backend.encode("The Album").tokens


def test_a_tokenizer_json_is_read_without_padding_or_truncation(tmp_path):
    from tokenizers import Tokenizer

    folder = cased_tokenizer(tmp_path)
    plain = load_tokenizer(folder)
    saved = Tokenizer.from_file(str(folder / "tokenizer.json"))
    saved.enable_padding(length=40)
    saved.enable_truncation(max_length=6)
    padded = tmp_path / "padded"
    padded.mkdir()
    saved.save(str(padded / "tokenizer.json"))  # a Hugging Face folder's, without bertforge's settings
    text = "The Album sold Millions of copies in Ireland ."
    assert load_tokenizer(padded).encode_pair(text, None) == plain.encode_pair(text, None)
    assert load_tokenizer(padded).fingerprint == plain.fingerprint


def test_a_tokenizer_json_lower_cases_only_where_its_normalizer_does(tmp_path):
    from tokenizers import Tokenizer, normalizers

    folder = cased_tokenizer(tmp_path)
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for name, normalizer, lowercase in [
        ("nfc", normalizers.Sequence([normalizers.NFC()]), False),
        ("lower", normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()]), True),
        ("bert", normalizers.BertNormalizer(lowercase=True), True),
    ]:
        backend.normalizer = normalizer
        (tmp_path / name).mkdir()
        backend.save(str(tmp_path / name / "tokenizer.json"))
        assert load_tokenizer(tmp_path / name).lowercase is lowercase, name


def test_bad_training_inputs(tmp_path):
    config = TokenizerConfig()
    with pytest.raises(BertforgeError, match="tokenizer.kind"):
        validate(RunConfig(tokenizer=TokenizerConfig(kind="bpe")))
    with pytest.raises(BertforgeError, match="no corpus files"):
        train_tokenizer([], config, tmp_path / "t")
    with pytest.raises(BertforgeError, match="does not exist"):
        train_tokenizer([tmp_path / "missing.txt"], config, tmp_path / "t")
    small = tmp_path / "small.txt"
    small.write_text("one two three.\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match="min_frequency"):
        train_tokenizer(
            [small], TokenizerConfig(kind="wordlevel", min_frequency=5), tmp_path / "t", show_progress=False
        )
    assert not (tmp_path / "t").exists()


def test_bad_tokenizer_folders(trained, tmp_path):
    _, out_dir = trained
    with pytest.raises(BertforgeError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertforgeError, match="neither tokenizer.json nor vocab.txt"):
        load_tokenizer(tmp_path / "empty")
    damaged = tmp_path / "damaged"
    shutil.copytree(out_dir, damaged)
    (damaged / "tokenizer.json").write_text('{"model": ', encoding="utf-8")
    with pytest.raises(BertforgeError, match="not a valid tokenizer file"):
        load_tokenizer(damaged)
    google_style = tmp_path / "google"
    google_style.mkdir()
    tokens = ["[PAD]", *[f"[unused{i}]" for i in range(99)], "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"]
    (google_style / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    google = load_tokenizer(google_style)  # Google's order: specials at 0 and 100-103
    assert (google.pad_id, google.unk_id, google.cls_id, google.sep_id, google.mask_id) == (
        0,
        100,
        101,
        102,
        103,
    )
    assert google.encode_pair("the", "dog") == ([101, 104, 102, 100, 102], [0, 0, 0, 1, 1])
    (google_style / "vocab.txt").write_text("\n".join(tokens[:-2]) + "\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match="lacks \\[MASK\\]"):
        load_tokenizer(google_style)


def test_training_off_a_terminal_leaves_no_empty_lines(tmp_path, capfd):
    """Off a terminal the Rust trainer's bars would leave only empty lines on stdout."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of a small corpus .\n\n" for i in range(200)))
    train_tokenizer([corpus], TokenizerConfig(vocab_size=200, min_frequency=1), tmp_path / "tok")
    assert capfd.readouterr() == ("", "")


def test_a_tokenizer_trained_for_a_run_says_so_in_a_line_and_a_cached_one_says_nothing(tmp_path, capfd):
    from bertforge.cache import cached_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of a small corpus .\n\n" for i in range(200)))
    config = TokenizerConfig(vocab_size=200, min_frequency=1)
    trained = cached_tokenizer([corpus], config, "auto", tmp_path / "cache")
    out, err = capfd.readouterr()
    assert out.startswith(f"tokenizer: {trained.vocab_size} wordpiece tokens from corpus.txt (") and err == ""
    assert cached_tokenizer([corpus], config, "auto", tmp_path / "cache").fingerprint == trained.fingerprint
    quiet = cached_tokenizer(
        [corpus], replace(config, vocab_size=150), "auto", tmp_path / "cache", show_progress=False
    )
    assert capfd.readouterr() == ("", "") and quiet.vocab_size == 150


def test_a_cached_tokenizer_of_another_text_reader_is_not_reused(tmp_path, monkeypatch):
    from bertforge import cache

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of a small corpus .\n\n" for i in range(200)))
    config = TokenizerConfig(vocab_size=200, min_frequency=1)
    cache.cached_tokenizer([corpus], config, "auto", tmp_path / "cache", show_progress=False)
    monkeypatch.setattr(cache, "READER_VERSION", cache.READER_VERSION + 1)
    cache.cached_tokenizer([corpus], config, "auto", tmp_path / "cache", show_progress=False)
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 2


def test_a_size_below_what_the_characters_need_is_exceeded_with_a_warning(tmp_path):
    corpus = tmp_path / "text.txt"
    text = "the quick brown fox jumps over the lazy dog .\n\nsphinx of black quartz , judge my vow ."
    corpus.write_text(text)
    with pytest.warns(UserWarning, match=r"more than tokenizer.vocab_size = 10: WordPiece keeps"):
        tokenizer = train_tokenizer([corpus], TokenizerConfig(vocab_size=10), tmp_path / "tok")
    letters = set(text) - {" ", "\n"}
    assert tokenizer.vocab_size >= len(SPECIAL_TOKENS) + len(letters)  # each character, at least alone

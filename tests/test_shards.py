"""Token shard preparation, reopening, and the checks that catch damaged folders."""

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertforge import shards as shards_module
from bertforge.config import TokenizerConfig
from bertforge.corpus import read_documents
from bertforge.errors import BertforgeError
from bertforge.io import file_sha256
from bertforge.shards import (
    ShardSet,
    TokenShards,
    concat_shards,
    prepare_shards,
    token_counts,
    token_dtype,
)
from bertforge.tokenizer import BertTokenizer, train_tokenizer

VALID = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "wiki.valid.tokens"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> BertTokenizer:
    config = TokenizerConfig(kind="wordpiece", vocab_size=3000, min_frequency=2)
    return train_tokenizer([VALID], config, tmp_path_factory.mktemp("tok") / "tokenizer", show_progress=False)


@pytest.fixture(scope="module")
def prepared(tokenizer, tmp_path_factory) -> tuple[dict, Path]:
    out_dir = tmp_path_factory.mktemp("shards") / "valid"
    return prepare_shards(VALID, tokenizer, out_dir, show_progress=False), out_dir


def document(shards, d: int) -> list[np.ndarray]:
    """The token ids of each sentence of document `d` of a shard folder or shard set."""
    first, last = shards.document_offsets[d], shards.document_offsets[d + 1]
    bounds = shards.sentence_offsets[first : last + 1]
    return [shards.tokens[start:stop] for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


def counts(shards) -> tuple[int, int, int]:
    """(tokens, sentences, documents) of a shard folder or shard set."""
    return len(shards.tokens), len(shards.sentence_offsets) - 1, len(shards.document_offsets) - 1


@pytest.fixture(scope="module")
def documents() -> list[list[str]]:
    return list(read_documents(VALID))


def test_meta_counts_match_the_corpus(prepared, tokenizer, documents):
    meta, out_dir = prepared
    lengths = [len(ids) for document in documents for ids in tokenizer.encode_batch(document)]
    assert meta["num_documents"] == len(documents) == 60
    assert meta["num_sentences"] == sum(1 for n in lengths if n) == sum(map(len, documents))
    assert meta["num_tokens"] == sum(lengths)
    assert meta["format_version"] == 1 and meta["corpus_format"] == "wikitext"
    assert meta["token_dtype"] == "uint16" and meta["vocab_size"] == tokenizer.vocab_size
    assert meta["tokenizer_fingerprint"] == tokenizer.fingerprint
    assert meta["source"]["sha256"] == hashlib.sha256(VALID.read_bytes()).hexdigest() == file_sha256(VALID)
    assert meta["source"]["bytes"] == VALID.stat().st_size
    assert json.loads((out_dir / "meta.json").read_text()) == meta


def test_documents_hold_their_tokenized_sentences(prepared, tokenizer, documents):
    shards = TokenShards.open(prepared[1])
    assert shards.tokens.dtype == np.uint16 and not shards.tokens.flags.writeable
    for d in (0, 17, 59):
        sentences = document(shards, d)
        assert [ids.tolist() for ids in sentences] == tokenizer.encode_batch(documents[d])
    assert document(shards, 0)[0].tolist() == tokenizer.encode_batch([documents[0][0]])[0]


def test_offsets_are_monotone_and_consistent(prepared):
    shards = TokenShards.open(prepared[1])
    assert counts(shards) == (shards.num_tokens, shards.num_sentences, 60)
    assert (shards.num_tokens, shards.num_sentences) == (
        prepared[0]["num_tokens"],
        prepared[0]["num_sentences"],
    )
    for offsets, end in (
        (shards.sentence_offsets, shards.num_tokens),
        (shards.document_offsets, shards.num_sentences),
    ):
        assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == end
        assert (np.diff(offsets) > 0).all()  # empty sentences and documents are skipped
    assert shards.vocab_size == 3000 and int(shards.tokens.max()) < shards.vocab_size


def test_token_dtype_widens_for_large_vocabularies():
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32


def test_empty_sentences_and_documents_are_skipped_and_a_prepared_folder_is_kept(tokenizer, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    texts = ["The lobster is blue.\n\u200b", "\u200b", "It turns red. \u00ad"]  # zero-width: no tokens
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    out_dir = tmp_path / "shards"
    prepare_shards(corpus, tokenizer, out_dir)
    assert "tokenizing corpus.jsonl" in capsys.readouterr().err  # the progress bar
    shards = TokenShards.open(out_dir)
    assert counts(shards)[1:] == (2, 2)
    assert tokenizer.decode(document(shards, 1)[0]) == "it turns red."
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    corpus.write_text("One more.\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match="already exists and is not an empty folder"):
        prepare_shards(corpus, tokenizer, out_dir, format="text", show_progress=False)
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before
    meta = prepare_shards(corpus, tokenizer, tmp_path / "again", format="text", show_progress=False)
    assert counts(TokenShards.open(tmp_path / "again"))[2] == meta["num_documents"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "corpus.jsonl", "shards"]


@pytest.fixture
def copy(prepared, tmp_path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(prepared[1], target)
    return target


def test_truncated_tokens_file(copy):
    tokens = copy / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(BertforgeError, match=r"tokens.bin has .* bytes.*delete it and re-run prepare"):
        TokenShards.open(copy)


def test_missing_files(copy, tmp_path):
    with pytest.raises(BertforgeError, match="does not exist; run prepare"):
        TokenShards.open(tmp_path / "missing")
    (copy / "sentence_offsets.bin").unlink()
    with pytest.raises(BertforgeError, match="sentence_offsets.bin is missing"):
        TokenShards.open(copy)
    (copy / "meta.json").unlink()
    with pytest.raises(BertforgeError, match=r"is not a token shard folder \(it has no meta.json\); give"):
        TokenShards.open(copy)


def test_bad_meta(copy):
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(BertforgeError, match="format_version 99.*delete the folder and re-run prepare"):
        TokenShards.open(copy)
    (copy / "meta.json").write_text(json.dumps({**meta, "num_sentences": meta["num_sentences"] - 1}))
    with pytest.raises(BertforgeError, match="sentence_offsets.bin has"):
        TokenShards.open(copy)
    (copy / "meta.json").write_text("{broken")
    with pytest.raises(BertforgeError, match="not valid JSON"):
        TokenShards.open(copy)


def test_failed_preparation_leaves_nothing_behind(tokenizer, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"text": "Fine text."}) + "\n" * 2 + "not json\n", encoding="utf-8")
    with pytest.raises(BertforgeError, match="line 3: not valid JSON"):
        prepare_shards(corpus, tokenizer, tmp_path / "shards", show_progress=False)
    with pytest.raises(BertforgeError, match="does not exist"):
        prepare_shards(tmp_path / "missing.txt", tokenizer, tmp_path / "shards", show_progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["docs.jsonl"]


def test_the_cache_reuses_shards_of_the_same_text_and_tokenizer(tokenizer, tmp_path):
    from bertforge.cache import cached_shards

    corpus = tmp_path / "valid.tokens"
    shutil.copyfile(VALID, corpus)
    first = cached_shards(corpus, tokenizer, "auto", tmp_path / "cache", show_progress=False)
    assert first.meta["source"]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    written = (first.path / "meta.json").stat().st_mtime_ns
    again = cached_shards(corpus, tokenizer, "auto", tmp_path / "cache", show_progress=False)
    assert again.path == first.path and (again.path / "meta.json").stat().st_mtime_ns == written
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write(" = Extra = \n\n one more line .\n")
    changed = cached_shards(corpus, tokenizer, "auto", tmp_path / "cache", show_progress=False)
    assert changed.path != first.path and changed.num_tokens > first.num_tokens


@pytest.fixture(scope="module")
def two_corpora(tokenizer, prepared, tmp_path_factory) -> tuple[TokenShards, TokenShards]:
    """A small corpus (the first articles of the validation text) and the whole validation text."""
    folder = tmp_path_factory.mktemp("two")
    small = folder / "small.tokens"
    small.write_text(
        "".join(VALID.read_text(encoding="utf-8").splitlines(keepends=True)[:400]), encoding="utf-8"
    )
    prepare_shards(small, tokenizer, folder / "small", show_progress=False)
    return TokenShards.open(folder / "small"), TokenShards.open(prepared[1])


def test_a_shard_set_holds_the_documents_of_each_folder_in_turn(two_corpora):
    small, large = two_corpora
    shards = concat_shards([small, large])
    assert isinstance(shards, ShardSet) and concat_shards([large]) is large
    assert counts(shards) == tuple(a + b for a, b in zip(counts(small), counts(large), strict=True))
    assert counts(large)[:2] == (large.num_tokens, large.num_sentences)
    assert shards.vocab_size == large.vocab_size
    small_documents = counts(small)[2]
    for d in range(counts(shards)[2]):
        part, index = (small, d) if d < small_documents else (large, d - small_documents)
        assert [ids.tolist() for ids in document(shards, d)] == [
            ids.tolist() for ids in document(part, index)
        ]
    flat = np.concatenate([small.tokens, large.tokens])
    for start, stop in (
        (0, 5),
        (small.num_tokens - 3, small.num_tokens + 4),
        (len(flat) - 2, len(flat)),
        (7, 7),
    ):
        assert shards.tokens[start:stop].tolist() == flat[start:stop].tolist()
    assert shards.tokens[small.num_tokens : small.num_tokens + 3].base is not None  # a view, not a copy
    assert (np.diff(shards.sentence_offsets) > 0).all() and (np.diff(shards.document_offsets) > 0).all()


def test_token_counts_of_a_shard_set_are_the_sum_of_its_folders(two_corpora, monkeypatch):
    small, large = two_corpora
    expected = np.bincount(np.concatenate([small.tokens, large.tokens]), minlength=large.vocab_size)
    assert token_counts(concat_shards([small, large])).tolist() == expected.tolist()
    monkeypatch.setattr(shards_module, "_COUNT_BLOCK", 7)  # blocks that end mid-sentence count the same
    assert token_counts(large).tolist() == np.bincount(large.tokens, minlength=large.vocab_size).tolist()


def test_pairs_over_a_shard_set_come_from_each_corpus_by_size(two_corpora, tokenizer):
    from bertforge.pairs import PairDataset, build_pairs

    small, large = two_corpora
    shards = concat_shards([small, large])
    flat = np.concatenate([small.tokens, large.tokens])
    for nsp in (True, False):
        pairs = build_pairs(shards, 64, 0.1, nsp, seed=3, epoch=0)
        from_small = float(np.mean(pairs[:, 1] <= small.num_tokens))
        assert from_small == pytest.approx(small.num_tokens / len(shards.tokens), rel=0.2), nsp
        examples = PairDataset(shards, pairs, tokenizer.cls_id, tokenizer.sep_id)
        for row in (0, 1, len(pairs) - 1):
            a_start, a_end = pairs[row, :2]
            text = examples[row]["input_ids"][1:-1]
            if not nsp:  # a window puts a [SEP] after each document that ends inside it
                text = text[text != tokenizer.sep_id]
            assert text[: a_end - a_start].tolist() == flat[a_start:a_end].tolist()
    # An MLM-only window runs on from the last document of one folder into the next folder's first.
    (across,) = np.flatnonzero((pairs[:, 0] < small.num_tokens) & (pairs[:, 1] > small.num_tokens))
    a_start, a_end = pairs[across, :2]
    ids = examples[across]["input_ids"][1:-1]
    assert ids[small.num_tokens - a_start] == tokenizer.sep_id
    assert np.delete(ids, small.num_tokens - a_start).tolist() == flat[a_start:a_end].tolist()


def test_a_shard_set_refuses_folders_of_different_tokenizers(two_corpora, tmp_path):
    small, large = two_corpora
    other = TokenShards.open(small.path)
    other.meta = {**other.meta, "tokenizer_fingerprint": "another"}
    with pytest.raises(BertforgeError, match="different tokenizers"):
        concat_shards([large, other])


def test_gzip_and_parquet_shards_match_the_plain_text(tokenizer, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from bertforge.cache import cached_shards

    texts = ["The lobster is blue. It turns red.", "A second document.\nWith a second paragraph."]
    plain = tmp_path / "docs.jsonl"
    plain.write_text("".join(json.dumps({"body": text}) + "\n" for text in texts), encoding="utf-8")
    packed = tmp_path / "docs.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    table = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": texts}), table)
    made = [
        cached_shards(path, tokenizer, "auto", tmp_path / "cache", False, "body")
        for path in (plain, packed, table)
    ]
    assert [shards.meta["corpus_format"] for shards in made] == ["jsonl", "jsonl", "parquet"]
    assert made[2].meta["text_column"] == "body"
    for shards in made:
        assert shards.tokens.tolist() == made[0].tokens.tolist()
        assert shards.document_offsets.tolist() == made[0].document_offsets.tolist() == [0, 2, 4]
    with pytest.raises(BertforgeError, match="no column 'text'"):
        cached_shards(table, tokenizer, "auto", tmp_path / "cache", False)
    assert len(list((tmp_path / "cache" / "shards").iterdir())) == 3  # the failed one left nothing

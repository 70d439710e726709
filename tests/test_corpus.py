"""Corpus readers, format detection, sentence splitting and input errors."""

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.corpus import _Lines, detect_format, read_documents, resolve_corpus_files, split_sentences
from bertforge.errors import BertforgeError

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("name", "documents"), [("wiki.train.tokens", 629), ("wiki.valid.tokens", 60)])
def test_wikitext2_document_counts(name, documents):
    assert detect_format(WIKITEXT / name) == "wikitext"
    assert sum(1 for _ in read_documents(WIKITEXT / name)) == documents


def test_a_wikitext_slice_cut_mid_article_or_stripped_of_its_spaces_is_read_as_wikitext(tmp_path):
    """A file cut from WikiText (as `split` cuts WikiText-103) may start inside an article, where only
    section headings tell it; a re-saved copy may have lost the lines' outer spaces."""
    lines = (WIKITEXT / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines()
    assert not lines[1000].startswith(" = ")  # inside an article
    cut = write(tmp_path / "cut.txt", "\n".join(lines[1000:1300]) + "\n")
    stripped = write(tmp_path / "stripped.txt", "\n".join(line.strip() for line in lines[:300]) + "\n")
    for path in (cut, stripped):
        assert detect_format(path) == "wikitext", path
        sentences = [sentence for document in read_documents(path) for sentence in document]
        assert not any("<unk>" in sentence or sentence.startswith("=") for sentence in sentences)


def test_wikitext_headings_dropped_and_artifacts_undone():
    documents = list(read_documents(WIKITEXT / "wiki.valid.tokens"))
    sentences = [sentence for document in documents for sentence in document]
    assert documents[0][0].startswith("Homarus gammarus , known as the European lobster")
    assert all(document for document in documents)
    assert not any(sentence.startswith("=") for sentence in sentences)
    for artifact in ("@-@", "@,@", "@.@", "<unk>"):
        assert not any(artifact in sentence for sentence in sentences), artifact
    assert any("[UNK]" in sentence for sentence in sentences)
    assert any("0.7" in sentence for sentence in sentences)  # "0 @.@ 7 kg" in the lobster article


def test_wikitext_reader_on_a_small_file(tmp_path):
    path = write(
        tmp_path / "tiny.tokens",
        " \n = First = \n \n It cost 1 @,@ 000 well @-@ known <unk> . It was 3 @.@ 5 m long .\n \n"
        " = = Section = = \n \n = = = Deeper = = = \n More text here .\n \n = Second = \n \n Only one .\n",
    )
    assert detect_format(path) == "wikitext"
    assert list(read_documents(path)) == [
        ["It cost 1,000 well-known [UNK] .", "It was 3.5 m long .", "More text here ."],
        ["Only one ."],
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello world. This is it! Is it? Yes.", ["Hello world.", "This is it!", "Is it?", "Yes."]),
        (
            "Mr. Smith met Dr. Jones at St. Paul's. They left.",
            ["Mr. Smith met Dr. Jones at St. Paul's.", "They left."],
        ),
        ("J. K. Rowling wrote it. It sold.", ["J. K. Rowling wrote it.", "It sold."]),
        ("The U.S. Army came. Then more.", ["The U.S. Army came.", "Then more."]),
        ("Sault Ste. Marie grew. It is old.", ["Sault Ste. Marie grew.", "It is old."]),
        ("Fruit, e.g. Apples, i.e. Pears. No. 5 won.", ["Fruit, e.g. Apples, i.e. Pears.", "No. 5 won."]),
        ("It is 3.5 m long. 42 is a number.", ["It is 3.5 m long.", "42 is a number."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ('She asked "Why?" Nobody knew.', ['She asked "Why?"', "Nobody knew."]),
        ('It ended. "Go," he said.', ["It ended.", '"Go," he said.']),
        ("It was big (really big.) Next one.", ["It was big (really big.)", "Next one."]),
        ("a lower. case start stays.", ["a lower. case start stays."]),
        (
            "the end . The next ! And ( see this . ) Last",
            ["the end .", "The next !", "And ( see this . )", "Last"],
        ),
        ('called " Golden Age . " Meridian grew .', ['called " Golden Age . "', "Meridian grew ."]),
        ('it ends . " Quoted " start .', ["it ends .", '" Quoted " start .']),
        # a quotation of several sentences: its closing quote is counted from the paragraph's start
        ('He said " Stop . Now . " She left .', ['He said " Stop .', 'Now . "', "She left ."]),
        ('He said " Stop . Now . "', ['He said " Stop .', 'Now . "']),
        ('He said "Stop. Now." She left.', ['He said "Stop.', 'Now."', "She left."]),
        # a closing quote before a lower-case word: the sentence goes on (WikiText's spaced quotes)
        ('He said " Stop now . " and left . Then .', ['He said " Stop now . " and left .', "Then ."]),
        ('He said " Stop now . " 1999 came .', ['He said " Stop now . "', "1999 came ."]),
        ('" Go . " he said . " Why ? " 我 .', ['" Go . " he said .', '" Why ? " 我 .']),  # as without quotes
        (
            "Warner Bros. Pictures made it. See pp. 12 - 15 and var. Alba.",
            ["Warner Bros. Pictures made it.", "See pp. 12 - 15 and var. Alba."],
        ),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_text_reader_ends_sentences_at_line_breaks_and_documents_at_blank_lines(tmp_path):
    path = write(
        tmp_path / "plain.txt", "First line\ncontinues. Second sentence.\n\n\n\nNext doc.\r\n   \nLast doc"
    )
    assert detect_format(path) == "text"
    assert list(read_documents(path)) == [
        ["First line", "continues.", "Second sentence."],
        ["Next doc."],
        ["Last doc"],
    ]
    assert list(read_documents(path, format="text")) == list(read_documents(path))


def test_text_with_carriage_returns_alone_ends_lines_there(tmp_path):
    """Classic Mac OS files end lines with CR alone: read as one line, the whole file was one document."""
    text = "First doc.\n\nSecond doc, line one\nline two.\n"
    unix = write(tmp_path / "unix.txt", text)
    mac = tmp_path / "mac.txt"
    mac.write_bytes(text.replace("\n", "\r").encode())
    expected = [["First doc."], ["Second doc, line one", "line two."]]
    assert list(read_documents(unix)) == expected
    assert list(read_documents(mac)) == expected
    bad = tmp_path / "bad.txt"  # its lines are read one at a time, so an error names its own line
    bad.write_bytes(b"one.\rtwo.\rthree \xff bad.\r" + b"more words.\r" * 20_000)
    with pytest.raises(BertforgeError, match="undecodable bytes on line 3 "):
        list(read_documents(bad))
    lines = _Lines(mac)
    read = [lines.bytes_read for _ in lines]
    assert read == sorted(read) and read[0] < read[-1] == mac.stat().st_size  # progress grows line by line


def test_a_crlf_split_across_read_blocks_ends_one_line(tmp_path):
    from bertforge.corpus import _READ_BLOCK

    path = tmp_path / "crlf.txt"
    first = "a" * (_READ_BLOCK - 1)  # its CR ends the first block, its LF starts the second
    path.write_bytes(f"{first}\r\nsecond\r\n".encode())
    assert [line for _, line in _Lines(path)] == [first, "second"]
    long = "b" * (3 * _READ_BLOCK + 5)  # a line over several blocks, after a CR alone at a block's end
    path.write_bytes(f"{first}\r{long}\rlast".encode())
    assert [line for _, line in _Lines(path)] == [first, long, "last"]


def test_crs_before_an_lf_end_one_line_as_in_labelled_files(tmp_path):
    """CRLF text saved again through Windows' text mode ends its lines in CR CR LF: one line end, not
    a blank line after every line (a blank line ends a document), in a text file and in a field."""
    text = "First doc.\n\nSecond doc, line one\nline two.\n"
    expected = [["First doc."], ["Second doc, line one", "line two."]]
    twice = tmp_path / "twice.txt"
    twice.write_bytes(text.replace("\n", "\r\r\n").encode())
    assert list(read_documents(twice)) == expected
    field = json.dumps({"text": text.replace("\n", "\r\r\n")}) + "\n"
    assert list(read_documents(write(tmp_path / "twice.jsonl", field))) == [
        ["First doc.", "Second doc, line one", "line two."]
    ]


def test_crs_that_end_a_read_block_wait_for_the_next_byte(tmp_path):
    from bertforge.corpus import _READ_BLOCK

    path = tmp_path / "blocks.txt"
    first = "a" * (_READ_BLOCK - 2)  # its CR CR ends the first block, its LF starts the second
    path.write_bytes(f"{first}\r\r\nsecond\r\n".encode())
    assert [line for _, line in _Lines(path)] == [first, "second"]
    crs = 2 * _READ_BLOCK + 3  # a run of CRs over whole blocks: one line end before an LF, else one each
    path.write_bytes(first.encode() + b"\r" * (crs + 1) + b"\nlast\r\r")
    assert [line for _, line in _Lines(path)] == [first, "last", ""]
    path.write_bytes(first.encode() + b"\r" * (crs + 1) + b"last")
    assert [line for _, line in _Lines(path)] == [first, *[""] * crs, "last"]


def test_text_without_capitals_or_full_stops_keeps_a_sentence_a_line(tmp_path):
    """Google's input format (a sentence a line, a blank line between documents) in lower case and
    without punctuation, as many corpora come: each line stays a sentence, as in a JSON line."""
    lines = ["the cat sat on the mat", "it was warm there", "then it rained"]
    path = write(tmp_path / "lower.txt", "\n".join(lines) + "\n\nanother document\nof two lines\n")
    assert list(read_documents(path)) == [lines, ["another document", "of two lines"]]
    jsonl = write(tmp_path / "lower.jsonl", json.dumps({"text": "\n".join(lines)}) + "\n")
    assert list(read_documents(jsonl)) == [lines]


def test_a_long_run_of_full_stops_splits_in_linear_time():
    """A run with no boundary after it made the splitter try a match from each of its positions: 40,000
    full stops took 80 s, where a linear pass takes milliseconds (the child gets 20 s)."""
    code = "from bertforge.corpus import split_sentences as s; print(len(s('Wait' + '.' * 40000 + 'x')))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True
    )
    assert done.stdout.strip() == "1"


def test_jsonl_reader(tmp_path):
    records = [{"text": "One. Two.\nA new paragraph", "id": 1}, {"text": "   "}, {"text": "Third doc."}]
    path = write(
        tmp_path / "docs.jsonl",
        "\n".join(json.dumps(r) for r in records[:2]) + "\n\n" + json.dumps(records[2]),
    )
    assert detect_format(path) == "jsonl"
    assert list(read_documents(path)) == [["One.", "Two.", "A new paragraph"], ["Third doc."]]


def test_byte_order_mark_and_progress(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffHello there.\n\nBye.\n".encode())
    seen = []
    assert list(read_documents(path, on_progress=seen.append)) == [["Hello there."], ["Bye."]]
    assert sum(seen) == path.stat().st_size


def error_message(path, format="auto") -> str:
    with pytest.raises(BertforgeError) as raised:
        list(read_documents(path, format))
    return str(raised.value)


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "u16.txt",
            "hello world\n".encode("utf-16"),
            "is UTF-16 text, not UTF-8 text; convert it to UTF-8, e.g. `iconv -f utf-16 -t utf-8 < ",
        ),
        ("table.dat", b"PAR1\x15\x04 rest", "is a Parquet file, not UTF-8 text; give it the .parquet ending"),
        ("img.txt", b"\x89PNG\r\n\x1a\n data", "is a PNG image, not UTF-8 text; leave it out of the corpus"),
        ("text.bz2", b"BZh91AY&SY data", "is bzip2-compressed, not UTF-8 text; decompress it"),
        ("packed.txt", b"\x1f\x8b\x08\x00 data", "is gzip-compressed, not UTF-8 text; give it a .gz ending"),
        ("nul.txt", b"the\x00European union\n", "holds NUL bytes on line 1: a binary file or an archive"),
    ],
)
def test_files_that_are_not_text_are_named_with_what_to_do(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    assert message in error_message(path)


def test_json_that_is_not_json_lines_is_named_with_the_conversion(tmp_path):
    array = tmp_path / "records.json"
    array.write_text('[{"text": "One."},\n {"text": "Two."}]\n')
    assert "holds a JSON array, not JSON lines" in error_message(array)
    assert "`jq -c '.[]' FILE > FILE.jsonl`" in error_message(array)
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text('{\n  "text": "One."\n}\n')
    assert "holds JSON over several lines" in error_message(pretty)
    assert list(read_documents(array, "text"))  # read as text when the user says so
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok", }\n{"text": "fine"}\n')
    assert "line 1: not valid JSON" in error_message(broken)
    bzh = tmp_path / "notes.txt"
    bzh.write_text("BZh is how the line starts.\n")
    assert list(read_documents(bzh)) == [["BZh is how the line starts."]]  # text, not bzip2


def test_missing_file_and_directory(tmp_path):
    assert "does not exist" in error_message(tmp_path / "nope.txt")
    assert "is a folder" in error_message(tmp_path)
    with pytest.raises(BertforgeError, match="does not exist"):
        detect_format(tmp_path / "nope.txt")


def test_empty_and_blank_files(tmp_path):
    assert "is empty" in error_message(write(tmp_path / "empty.txt", ""))
    assert "no text" in error_message(write(tmp_path / "blank.txt", "\n  \n\t\n"))
    assert "no text" in error_message(write(tmp_path / "headings.tokens", " = Title = \n = = Sub = = \n"))


def test_undecodable_bytes_name_the_line_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"fine line\nanother\ncaf\xe9 au lait\n")
    message = error_message(path, "text")
    assert "line 3" in message and "byte offset 21" in message and "UTF-8" in message
    assert f"`iconv -f latin1 -t utf-8 < {path} > {tmp_path / 'latin1.utf8.txt'}`" in message


def test_bad_jsonl_lines_name_the_line(tmp_path):
    good = json.dumps({"text": "Fine."})
    assert "line 3: not valid JSON" in error_message(write(tmp_path / "a.jsonl", f"{good}\n{good}\n{{oops\n"))
    assert 'line 2: no string "text"' in error_message(
        write(tmp_path / "b.jsonl", f'{good}\n{{"body": "x"}}\n')
    )
    number = error_message(write(tmp_path / "c.jsonl", '{"text": 5}\n'), "jsonl")
    assert 'line 1: the "text" field is a number, not a string' in number
    nulls = write(tmp_path / "n.jsonl", f'{good}\n{{"text": null}}\n{good}\n')  # no text, as in Parquet
    assert list(read_documents(nulls, "jsonl")) == [["Fine."], ["Fine."]]
    body = error_message(write(tmp_path / "e.jsonl", '{"body": "x", "id": 1}\n'), "jsonl")
    assert 'no string "text" field (its fields: body, id);' in body and "data.text_column" in body
    cut = error_message(write(tmp_path / "f.jsonl", '{"text": "Cut emoji \\ud83d here."}\n'), "jsonl")
    assert "line 1: the \"text\" field holds '\\ud83d', half of a character" in cut
    assert "line 1: not valid JSON" in error_message(write(tmp_path / "d.txt", "plain words\n"), "jsonl")


def test_unknown_format(tmp_path):
    path = write(tmp_path / "x.txt", "Hello.\n")
    message = error_message(path, "xml")
    assert "unknown corpus format 'xml'" in message and "wikitext" in message and "conll" in message


def gzipped(path: Path) -> Path:
    target = path.with_name(path.name + ".gz")
    target.write_bytes(gzip.compress(path.read_bytes()))
    return target


@pytest.mark.parametrize(
    ("name", "text", "format"),
    [
        ("tiny.tokens", " = First = \n \n One @-@ two . Three .\n \n = Second = \n \n Last .\n", "wikitext"),
        ("plain.txt", "\ufeffFirst doc. Second sentence.\n\nNext doc.\n", "text"),
        ("docs.jsonl", '{"text": "One. Two."}\n{"text": "Three."}\n', "jsonl"),
    ],
)
def test_gzip_reads_like_the_plain_file(tmp_path, name, text, format):
    plain = write(tmp_path / name, text)
    packed = gzipped(plain)
    assert detect_format(packed) == detect_format(plain) == format
    seen = []
    assert list(read_documents(packed, on_progress=seen.append)) == list(read_documents(plain))
    assert sum(seen) == packed.stat().st_size  # progress counts the compressed bytes


def test_corrupt_or_fake_gzip_and_undecodable_gzipped_text(tmp_path):
    lines = "".join(f"Sentence number {i} is here. It has a twin {i * 7}.\n\n" for i in range(3000))
    whole = gzip.compress(lines.encode())
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    assert detect_format(truncated) == "text"  # the first lines are intact
    assert "is not a readable gzip file" in error_message(truncated)
    fake = write(tmp_path / "fake.txt.gz", "plain text, not compressed\n")
    assert "not a readable gzip file (Not a gzipped file" in error_message(fake)
    latin1 = tmp_path / "latin1.txt.gz"
    latin1.write_bytes(gzip.compress(b"fine\ncaf\xe9\n"))
    assert "line 2" in error_message(latin1) and "UTF-8" in error_message(latin1)
    unpack = f"`gunzip -c {latin1} | iconv -f latin1 -t utf-8 > {tmp_path / 'latin1.utf8.txt'}`"
    assert unpack in error_message(latin1)  # iconv on the compressed bytes would not convert it
    wide = tmp_path / "u16.txt.gz"  # a UTF-16 file's advice unpacks it first too
    wide.write_bytes(gzip.compress("hello\n".encode("utf-16")))
    assert f"`gunzip -c {wide} | iconv -f utf-16 -t utf-8 > {tmp_path / 'u16.utf8.txt'}`" in error_message(
        wide
    )
    table = tmp_path / "train.tsv.gz"  # the copy keeps the ending that names its format
    table.write_bytes(gzip.compress(b"sentence\tlabel\ncaf\xe9\t1\n"))
    assert f"> {tmp_path / 'train.utf8.tsv'}`" in error_message(table)
    empty = tmp_path / "empty.txt.gz"
    empty.write_bytes(gzip.compress(b""))
    assert "no text" in error_message(empty)


def write_parquet(path: Path, columns: dict, row_group_size: int | None = None) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def test_parquet_reader_reads_one_document_per_row_in_batches(tmp_path):
    bodies = ["One. Two.\nA new paragraph", None, "   ", "Third doc."] + [
        f"Row {i}. Ends." for i in range(3000)
    ]
    path = write_parquet(
        tmp_path / "docs.parquet", {"id": list(range(len(bodies))), "body": bodies}, row_group_size=700
    )
    assert detect_format(path) == "parquet"
    seen = []
    documents = list(read_documents(path, text_column="body", on_progress=seen.append))
    assert documents[:2] == [["One.", "Two.", "A new paragraph"], ["Third doc."]]
    assert documents[-1] == ["Row 2999.", "Ends."] and len(documents) == 3002
    assert sum(seen) == path.stat().st_size
    assert list(read_documents(path, "parquet", text_column="body")) == documents


def test_a_text_breaks_into_lines_alike_in_a_text_file_json_lines_parquet_and_csv(tmp_path):
    """A line ends at LF, CR or CRLF only: a form feed, NEL or U+2028 inside a line stays there."""
    text = "One here\u2028two there\x0cthree \x85four.\r\nFive.\rSix"
    plain = tmp_path / "a.txt"
    plain.write_bytes(text.encode("utf-8"))
    expected = [["One here\u2028two there\x0cthree \x85four.", "Five.", "Six"]]
    assert list(read_documents(plain, "text")) == expected
    assert list(read_documents(write(tmp_path / "a.jsonl", json.dumps({"text": text}) + "\n"))) == expected
    table = tmp_path / "a.csv"
    table.write_text('text\n"' + text + '"\n', encoding="utf-8", newline="")
    assert list(read_documents(table, "csv")) == expected
    path = write_parquet(tmp_path / "a.parquet", {"text": [text]})
    assert list(read_documents(path)) == expected


def test_parquet_text_as_a_category_or_a_string_view_column_is_read(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = ["One. Two.", "Three.", "One. Two."]
    columns = {"category": pa.array(texts).dictionary_encode()}
    if hasattr(pa, "string_view"):
        columns["view"] = pa.array(texts, type=pa.string_view())
    pq.write_table(pa.table(columns), tmp_path / "kinds.parquet")
    for column in columns:
        documents = list(read_documents(tmp_path / "kinds.parquet", text_column=column))
        assert documents == [["One.", "Two."], ["Three."], ["One.", "Two."]], column


def test_parquet_errors(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "docs.parquet", {"id": [1, 2], "body": ["A.", "B."]})
    message = error_message(path)  # the default column, "text", is not there
    assert "has no column 'text'" in message and "id, body" in message and "data.text_column" in message
    with pytest.raises(BertforgeError, match="column 'id' holds int64, not text"):
        read_documents(path, text_column="id")
    assert "is a Parquet file but the corpus format is 'text'" in error_message(path, "text")
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(path.read_bytes()[:-12])  # its footer cut off
    with pytest.raises(BertforgeError, match="damaged.parquet is not a readable Parquet file"):
        read_documents(damaged)
    fake = write(tmp_path / "fake.parquet", "not parquet\n")
    not_parquet = r"fake.parquet is not a Parquet file \(Parquet files start with the bytes PAR1, it starts"
    with pytest.raises(BertforgeError, match=not_parquet + ".* another ending than .parquet"):
        read_documents(fake)
    text = write(tmp_path / "text.txt", "First line.\n")  # text, read as Parquet when asked to
    with pytest.raises(BertforgeError, match=r"read it as another format than parquet \(data.format\)"):
        read_documents(text, format="parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if pyarrow were not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(BertforgeError, match=not_parquet):  # told without pyarrow, which it needs not
        read_documents(fake)
    with pytest.raises(
        BertforgeError, match=r"needs pyarrow; install it with `pip install 'bertforge\[parquet\]'`"
    ):
        read_documents(path, text_column="body")


def test_jsonl_reads_the_text_column(tmp_path):
    path = write(tmp_path / "docs.jsonl", '{"body": "One. Two."}\n{"body": "Three."}\n')
    assert list(read_documents(path, text_column="body")) == [["One.", "Two."], ["Three."]]
    assert 'no string "text" field' in error_message(path)


def test_a_labelled_table_gives_its_text_column_a_document_a_row(tmp_path):
    tsv = write(tmp_path / "train.tsv", 'sentence\tlabel\nA "fine" film. Sad, too.\t1\n\t0\nawful\t0\n')
    assert detect_format(tsv) == "tsv"  # the header and the labels are not text
    assert list(read_documents(tsv, text_column="sentence")) == [
        ['A "fine" film.', "Sad, too."],
        ["awful"],
    ]
    message = error_message(tsv)  # the default column, "text"
    assert "has no column 'text' (its columns: sentence, label)" in message and "data.text_column" in message
    [as_text] = read_documents(tsv, format="text")  # asked for as plain text: one document, labels and all
    assert as_text[0] == "sentence\tlabel" and as_text[-1] == "awful\t0"
    pairs = write(tmp_path / "rte.tsv", "sentence1\tsentence2\tlabel\nIt rained.\tThe ground is wet.\t0\n")
    assert list(read_documents(pairs, text_column="sentence1, sentence2")) == [
        ["It rained.", "The ground is wet."]
    ]
    rows = 'id,text\n1,"Two words, one comma."\n2,"A line\nand another"\n3,"broken\n'
    csv_file = write(tmp_path / "reviews.csv", rows)
    assert detect_format(csv_file) == "csv"
    with pytest.raises(BertforgeError, match=r"reviews.csv line \d+ is not valid CSV"):
        list(read_documents(csv_file))
    write(csv_file, rows.rsplit("\n3,", 1)[0] + "\n")
    assert list(read_documents(csv_file)) == [["Two words, one comma."], ["A line", "and another"]]
    long = write(tmp_path / "long.csv", "text\n" + "word " * 60_000 + "\n")  # past csv's 128 KiB fields
    assert len(next(iter(read_documents(long)))[0]) == len("word " * 60_000) - 1
    headerless = write(
        tmp_path / "cola.tsv", "gj04\t1\t\tThe sailors rode the breeze.\nclc95\t0\t*\tThe more.\n"
    )
    assert list(read_documents(headerless, text_column="3")) == [
        ["The sailors rode the breeze."],
        ["The more."],
    ]
    with_header = write(tmp_path / "sst.tsv", "sentence\tlabel\nA fine film.\t1\nAwful.\t0\n")
    with pytest.raises(BertforgeError, match=r"sst.tsv starts with a header row \(sentence, label\); name"):
        list(read_documents(with_header, text_column="0"))  # "sentence" is no document
    short = write(tmp_path / "short.tsv", "sentence1\tsentence2\tlabel\nIt rained.\t0\n")
    with pytest.raises(BertforgeError, match=r"short.tsv line 2 has 2 fields where line 1 has 3"):
        list(read_documents(short, text_column="sentence1,sentence2"))


def test_a_table_row_cut_by_a_cr_alone_names_the_cr(tmp_path):
    """Labelled files keep a CR inside a field; a corpus ends a line there, so the refusal names it."""
    for row in ("A fine\rfilm.\t1\n", "A fine\tfi\rlm.\n"):  # the short piece first, or second
        path = tmp_path / "cr.tsv"
        path.write_bytes(f"sentence\tlabel\n{row}Awful.\t0\n".encode())
        fix = f"`tr '\\r' ' ' < {path} > {tmp_path / 'cr.spaced.tsv'}`"
        with pytest.raises(
            BertforgeError, match="line 2 ends in a CR alone where line 1 ends in a line feed"
        ) as error:
            list(read_documents(path, text_column="sentence"))
        assert str(error.value).endswith(fix)
    packed = tmp_path / "cr.tsv.gz"  # tr on the compressed bytes would damage it
    packed.write_bytes(gzip.compress(b"sentence\tlabel\r\nA fine\rfilm.\t1\r\n"))
    with pytest.raises(BertforgeError) as error:
        list(read_documents(packed, text_column="sentence"))
    assert str(error.value).endswith(f"`gunzip -c {packed} | tr '\\r' ' ' > {tmp_path / 'cr.spaced.tsv'}`")
    for name, text in (
        ("mac.tsv", b"sentence\tlabel\rA fine film.\r"),
        ("blank.tsv", b"s\tl\nGood.\t1\n\rShort\n"),
    ):
        path = tmp_path / name  # every line ends in a CR, or the CR ends a line without text: just short
        path.write_bytes(text)
        with pytest.raises(
            BertforgeError, match=r"fields where line 1 has 2; every row has one value per column$"
        ):
            list(read_documents(path, text_column=text.split(b"\t")[0].decode()))


def test_a_conll_file_gives_its_words_a_sentence_a_block_and_a_document_a_docstart(tmp_path):
    lines = [
        "-DOCSTART- -X- O O",
        "",
        "EU NNP B-NP B-ORG",
        "rejects VBZ B-VP O",
        ".  . O O",
        "",
        "Peter NNP B-NP B-PER",
    ]
    lines += ["", "-DOCSTART- -X- O O", "", "BRUSSELS NNP B-NP B-LOC", ""]
    path = write(tmp_path / "train.txt", "\n".join(lines) + "\n")
    assert detect_format(path) == "conll"  # its tags are not text
    assert list(read_documents(path)) == [["EU rejects .", "Peter"], ["BRUSSELS"]]
    without_docstart = write(tmp_path / "dev.txt", "\n".join(lines[2:7]))
    assert list(read_documents(without_docstart)) == [["EU rejects .", "Peter"]]
    for name in ("train.conll.gz", "train.txt.gz", "ner.tsv"):  # through gzip; a word and its tags a row
        target = tmp_path / name
        text = "\n".join(lines) + "\n"
        target.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
        assert detect_format(target) == "conll", name
    tags = write(tmp_path / "bio.tsv", "Aspirin\tB-Chemical\nhelps\tO\n\nNo\tO\n")
    assert list(read_documents(tags)) == [["Aspirin helps", "No"]]


def test_corpus_specs_resolve_to_sorted_unique_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in (
        "data/b.txt",
        "data/a.txt.gz",
        "data/sub/c.jsonl",
        "data/.hidden",
        "data/.git/x",
        "data/_SUCCESS",  # a Spark or Arrow dataset's marker and metadata
        "data/_common_metadata",
        "solo.txt",
    ):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        write(Path(name), "Some text.\n")
    expected = [Path("data/a.txt.gz"), Path("data/b.txt"), Path("data/sub/c.jsonl")]
    assert resolve_corpus_files("data") == expected
    assert resolve_corpus_files(["solo.txt", "data/*.txt", "data", "./data/b.txt"]) == [
        *expected,
        Path("solo.txt"),
    ]
    assert resolve_corpus_files(["data/**/*.jsonl"]) == [Path("data/sub/c.jsonl")]
    assert resolve_corpus_files(["data/s*"]) == [Path("data/sub/c.jsonl")]  # a matched folder is expanded


def test_a_tsv_row_split_by_a_quoted_line_break_says_tsv_is_read_without_quoting(tmp_path):
    path = tmp_path / "table.tsv"  # as Python's csv module writes a value holding a line break
    path.write_text('text\tlabel\n"One line,\nand another."\t1\n', encoding="utf-8")
    with pytest.raises(BertforgeError, match="quoted values, and TSV files are read without quoting"):
        list(read_documents(path, "tsv"))


def test_several_text_columns_are_named_as_a_tables_in_json_lines(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"q": "Why?", "a": "Because."}\n', encoding="utf-8")
    with pytest.raises(BertforgeError, match="several columns, a,b, are read from TSV and CSV files only"):
        list(read_documents(path, "jsonl", text_column="q,a"))


def test_a_corpus_folder_is_read_through_its_linked_subfolders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("elsewhere/wiki/a.txt", "data/b.txt"):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        write(Path(name), "Some text.\n")
    Path("data/wiki").symlink_to(tmp_path / "elsewhere/wiki", target_is_directory=True)
    Path("data/wiki/up").symlink_to(tmp_path / "data", target_is_directory=True)  # a loop
    assert resolve_corpus_files("data") == [Path("data/b.txt"), Path("data/wiki/a.txt")]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["data/*.csv"], "corpus pattern 'data/*.csv' matches no file"),
        (["empty"], "corpus folder empty holds no files"),
        (["solo.txt", "missing.txt"], "corpus file missing.txt does not exist"),
        (["blank.txt"], "corpus file blank.txt is empty"),
        (
            ["tok"],
            "corpus folder tok holds a tokenizer (tokenizer.json), not text; a tokenizer goes to --tokenizer",
        ),
        (
            ["shards"],
            "corpus folder shards holds prepared shards (tokens.bin), not text; give them with --shards",
        ),
        (
            ["run"],
            "corpus folder run holds a pretraining run (tokenizer/tokenizer.json), not text; its model",
        ),
        ([], "no corpus file given"),
        ("", "no corpus file given"),
    ],
)
def test_corpus_specs_that_name_no_file(tmp_path, monkeypatch, specs, message):
    monkeypatch.chdir(tmp_path)
    Path("data").mkdir()
    Path("empty").mkdir()
    write(Path("solo.txt"), "Text.\n")
    write(Path("blank.txt"), "")
    for name in ("tok/tokenizer.json", "shards/tokens.bin", "run/tokenizer/tokenizer.json"):
        Path(name).parent.mkdir(parents=True)
        write(Path(name), "{}\n")
    with pytest.raises(BertforgeError, match=re.escape(message)):
        resolve_corpus_files(specs)


def test_a_glob_skips_broken_links_and_link_loops_as_a_folder_does(tmp_path):
    from bertforge.corpus import resolve_corpus_files

    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("One sentence here .\n")
    (folder / "broken.txt").symlink_to(tmp_path / "gone.txt")
    (folder / "sub" / "loop").symlink_to(tmp_path)  # back up: a glob's ** would follow it round
    assert resolve_corpus_files(str(folder / "*.txt")) == [folder / "a.txt"]
    assert resolve_corpus_files(str(folder / "**")) == [folder / "a.txt"]
    assert resolve_corpus_files(str(folder)) == [folder / "a.txt"]

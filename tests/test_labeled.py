"""Reading labelled data: every file format and label kind, the label mapping, and every bad input."""

from __future__ import annotations

import codecs
import gzip
import json

import pytest

from bertforge.errors import BertforgeError
from bertforge.labeled import label_ids, label_names, read_labeled, read_lines


def write(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def refused(path, message: str, **columns) -> str:
    columns = {"text_column": "text", "label_column": "label", **columns}
    with pytest.raises(BertforgeError) as error:
        names = label_names(read_labeled(path, **columns))
        label_ids(read_labeled(path, **columns), names)
    assert message in str(error.value), str(error.value)
    return str(error.value)


def test_csv_with_header_quotes_and_string_labels(tmp_path):
    path = write(
        tmp_path,
        "reviews.csv",
        'id,text,label\n1,"Great, really great",positive\n2,"She said ""no""",negative\n3,fine,neutral\n',
    )
    data = read_labeled(path, "text", "label")
    assert data.texts == ["Great, really great", 'She said "no"', "fine"]
    assert data.pairs is None
    names = label_names(data)
    assert names == ["negative", "neutral", "positive"]  # alphabetical
    assert label_ids(data, names) == [2, 0, 1]


def test_tsv_with_header_as_glue_writes_it(tmp_path):
    path = write(
        tmp_path, "train.tsv", 'sentence\tlabel\nit \'s a "charming" film \t1\nunflinchingly bleak\t0\n'
    )
    data = read_labeled(path, "sentence", "label")
    assert data.texts == ['it \'s a "charming" film ', "unflinchingly bleak"]  # quotes kept as they are
    assert label_names(data) == ["0", "1"]
    assert label_ids(data, label_names(data)) == [1, 0]


def test_tsv_without_header_takes_columns_by_number(tmp_path):
    path = write(
        tmp_path, "cola.tsv", "gj04\t1\t\tThe sailors rode the breeze.\nclc95\t0\t*\tThe more we study.\n"
    )
    data = read_labeled(path, text_column="3", label_column="1")
    assert data.texts == ["The sailors rode the breeze.", "The more we study."]
    assert data.labels == ["1", "0"] and data.lines == [1, 2]


def test_integer_labels_are_ordered_numerically_and_canonical(tmp_path):
    rows = [{"text": f"t{i}", "label": label} for i, label in enumerate([10, 2, "02", 1.0, "-1"])]
    path = write(tmp_path, "data.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    data = read_labeled(path, "text", "label")
    assert data.labels == ["10", "2", "2", "1", "-1"]
    assert label_names(data) == ["-1", "1", "2", "10"]


def test_json_lines_with_text_pairs(tmp_path):
    rows = [
        {"premise": "a man sleeps", "hypothesis": "a person rests", "gold": "entailment", "extra": 1},
        {"premise": "a man sleeps", "hypothesis": "a man runs", "gold": "contradiction"},
    ]
    path = write(
        tmp_path, "nli.jsonl", "".join(json.dumps(r) + "\n" for r in rows) + "\n\n"
    )  # trailing blanks
    data = read_labeled(path, "premise", "gold", text_pair_column="hypothesis")
    assert data.texts == ["a man sleeps", "a man sleeps"]
    assert data.pairs == ["a person rests", "a man runs"]
    assert label_names(data) == ["contradiction", "entailment"]


def test_format_is_detected_from_the_content(tmp_path):
    tsv = read_labeled(write(tmp_path, "data.txt", "text\tlabel\nhello\ta\nbye\tb\n"), "text", "label")
    jsonl = read_labeled(write(tmp_path, "data.dat", '{"text": "hello", "label": "a"}\n'), "text", "label")
    csv = read_labeled(write(tmp_path, "data", "text,label\nhello,a\n"), "text", "label")
    assert tsv.texts[:1] == jsonl.texts == csv.texts == ["hello"]
    forced = read_labeled(write(tmp_path, "x.csv", "text\tlabel\nhello\ta\n"), "text", "label", format="tsv")
    assert forced.labels == ["a"]


def test_utf8_byte_order_mark_is_ignored(tmp_path):
    path = write(tmp_path, "excel.csv", "\ufefftext,label\nhéllo,a\n".encode())
    assert read_labeled(path, "text", "label").texts == ["héllo"]


def test_missing_columns_name_the_columns_that_exist(tmp_path):
    path = write(tmp_path, "data.csv", "sentence,label\nhello,a\nbye,b\n")
    message = refused(path, "no column 'text'")
    assert "its columns are: sentence, label" in message
    rows = write(tmp_path, "data.jsonl", '{"sentence": "hello", "label": "a"}\n')
    assert "its fields are: sentence, label" in refused(rows, "has no field 'text'")


def test_numbered_columns_on_a_file_with_a_header(tmp_path):
    path = write(tmp_path, "train.tsv", "sentence\tlabel\nhello\t1\nbye\t0\n")
    refused(path, "starts with a header row (sentence, label)", text_column="0", label_column="1")


def test_one_class_only(tmp_path):
    path = write(tmp_path, "data.csv", "text,label\nhello,a\nbye,a\n")
    refused(path, "every example in")
    refused(path, "has the label 'a'")


def test_validation_labels_never_seen_in_training(tmp_path):
    train = read_labeled(write(tmp_path, "train.csv", "text,label\nhello,a\nbye,b\n"), "text", "label")
    valid = read_labeled(write(tmp_path, "valid.csv", "text,label\nhi,a\nyo,c\nso,d\n"), "text", "label")
    with pytest.raises(BertforgeError) as error:
        label_ids(valid, label_names(train))
    assert "labels never seen in training: 'c', 'd' (first on line 3)" in str(error.value)
    assert "the training labels are: 'a', 'b'" in str(error.value)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("blank.csv", "text,label\nhello,a\n\nbye,b\n", "line 3 is empty"),
        ("no_text.csv", "text,label\nhello,a\n  ,b\n", "line 3: the text in column 'text' is empty"),
        ("no_label.tsv", "text\tlabel\nhello\ta\nbye\t\n", "line 3: the label in column 'label' is empty"),
        ("blank.jsonl", '{"text": "a", "label": "x"}\n\n{"text": "b", "label": "y"}\n', "line 2 is empty"),
        ("null.jsonl", '{"text": "a", "label": null}\n', "the label in column 'label' is null"),
        ("short.tsv", "text\tlabel\nhello\ta\nbye\n", "line 3 has 1 fields where line 1 has 2; every row"),
        ("long.csv", "text,label\nhello,a\ngreat, fun movie,b\n", "line 3 has 3 fields where line 1 has 2"),
        ("long.tsv", "text\tlabel\nhi\tthere\tb\n", "per column (a TSV text cannot hold a tab)"),
        ("bad.jsonl", '{"text": "a", "label": "x"}\n{"text": \n', "line 2 is not valid JSON"),
        ("array.json", '[{"text": "a", "label": "x"}]\n', "JSON array"),
        ("header_only.csv", "text,label\n", "holds a header but no examples"),
        ("empty.csv", "\n\n", "is empty"),
        ("blank_first.csv", "\ntext,label\nhello,a\n", "line 1 is empty; the first line names the columns"),
    ],
)
def test_bad_rows_get_one_clear_message(tmp_path, name, content, message):
    refused(write(tmp_path, name, content), message)


def test_undecodable_bytes_name_the_line(tmp_path):
    path = write(tmp_path, "latin1.csv", "text,label\nhello,a\ncaf\xe9,b\n".encode("latin-1"))
    refused(path, "not UTF-8 text: undecodable bytes on line 3")
    refused(path, f"`iconv -f latin1 -t utf-8 < {path} > {tmp_path / 'latin1.utf8.csv'}`")  # this file's own


def test_undecodable_bytes_after_a_byte_order_mark_name_their_own_line_and_offset(tmp_path):
    raw = codecs.BOM_UTF8 + b"text,label\nab,1\n\xffcd,0\n"
    path = write(tmp_path, "excel.csv", raw)
    offset = raw.index(255)  # the 0xff, counted in the file, byte-order mark included
    refused(path, f"undecodable bytes on line 3 (byte offset {offset})")


def test_a_utf16_file_is_named_with_the_command_that_converts_it(tmp_path):
    path = write(tmp_path, "unicode.tsv", "text\tlabel\nhello\t1\n".encode("utf-16"))
    refused(path, f"is UTF-16 text, not UTF-8; convert it to UTF-8, e.g. `iconv -f utf-16 -t utf-8 < {path}")


def test_a_text_longer_than_csvs_default_field_limit_is_read(tmp_path):
    long = "word " * 30_000  # 150,000 characters, past csv's 131,072
    for name, separator in (("long.csv", ","), ("long.tsv", "\t")):
        path = write(tmp_path, name, f"text{separator}label\n{long}{separator}1\nshort{separator}0\n")
        assert read_labeled(path, "text", "label").texts == [long, "short"]


def test_a_quote_left_open_in_a_csv_is_named(tmp_path):
    path = write(tmp_path, "quotes.csv", 'text,label\n"a"b,1\nshort,0\n')
    refused(path, "line 2 is not valid CSV")


def test_a_column_number_past_the_last_column_is_named(tmp_path):
    path = write(tmp_path, "pairs.csv", "hello world,1\ngood day,0\n")
    refused(path, "has 2 columns (numbered 0 to 1); there is no column 5", text_column="5", label_column="1")


def test_a_compressed_file_or_the_other_separator_is_named(tmp_path):
    packed = write(tmp_path, "train.tsv", gzip.compress(b"text\tlabel\nhello\ta\n"))
    refused(
        packed,
        f"{packed} is gzip-compressed; decompress it first, e.g. "
        f"`gunzip -c {packed} > {tmp_path / 'unpacked.tsv'}`",
    )
    commas = write(tmp_path, "commas.tsv", "text,label\nhello,a\nbye,b\n")
    refused(commas, "its one column is 'text,label': read it as CSV with --format csv")
    tabs = write(tmp_path, "tabs.csv", "text\tlabel\nhello\ta\nbye\tb\n")
    refused(tabs, "read it as TSV with --format tsv")


def test_missing_file_and_folder(tmp_path):
    refused(tmp_path / "nothing.csv", "does not exist")
    refused(tmp_path, "is a folder")


def test_same_column_twice(tmp_path):
    path = write(tmp_path, "data.csv", "text,label\nhello,a\n")
    refused(path, "must differ", label_column="text")


@pytest.mark.parametrize("end", ["\r\n", "\r"])
@pytest.mark.parametrize(
    "name, content",
    [
        ("reviews.csv", 'text,label\n"Great, really",pos\nbad,neg\n'),
        ("reviews.tsv", "text\tlabel\ngreat\tpos\nbad\tneg\n"),
        ("reviews.jsonl", '{"text": "great", "label": "pos"}\n{"text": "bad", "label": "neg"}\n'),
    ],
)
def test_crlf_and_cr_only_line_ends_read_as_lf(tmp_path, name, content, end):
    """Windows' CRLF and old Macs' CR-only files read as the same file with LF, every format."""
    expected = read_labeled(write(tmp_path, name, content), "text", "label")
    data = read_labeled(write(tmp_path, f"other-{name}", content.replace("\n", end)), "text", "label")
    assert (data.texts, data.labels, data.lines) == (expected.texts, expected.labels, expected.lines)
    assert data.texts[-1] == "bad"  # no CR left on the last field


@pytest.mark.parametrize("end", ["\r\n", "\r", "\r\r\n"])
def test_a_file_of_lines_with_crlf_or_cr_ends_gives_its_lines(tmp_path, end):
    """CRLF, CR-only, and CRLF text saved again through Windows' text mode (CR CR LF)."""
    path = write(tmp_path, "inputs.txt", end.join(["first text", "second text", "", ""]))
    assert read_lines(path, "one text per line") == ["first text", "second text"]
    latin = write(tmp_path, "latin.csv", f"text,label{end}hello,a{end}caf\xe9,b{end}".encode("latin-1"))
    refused(latin, "undecodable bytes on line 3")


def test_a_lone_cr_inside_a_line_of_a_file_with_lf_ends_stays_in_its_line(tmp_path):
    path = write(tmp_path, "inputs.txt", "first\rstill first\nsecond\n")
    assert read_lines(path, "one text per line") == ["first\rstill first", "second"]

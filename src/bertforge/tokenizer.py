"""The vocabulary: train a WordPiece or word-level tokenizer on a corpus, save it, load it.

Owns `BertTokenizer`, a thin wrapper over a `tokenizers.Tokenizer` with BERT's special tokens
`[PAD] [UNK] [CLS] [SEP] [MASK]` (at ids 0-4 in the tokenizers trained here, wherever a loaded
vocabulary puts them: Google's use 0 and 100-103), and the folder layout: `tokenizer.json` (loadable
by `transformers.BertTokenizerFast(tokenizer_file=...)`), `vocab.txt` (one token per line in id
order), `tokenizer_config.json` (its settings for `transformers`) and `bertforge_tokenizer.json` (the
settings and a fingerprint of `tokenizer.json`).

Training is deterministic: the same corpus and settings give the same files byte for byte (see
`_continuation_pieces` for how WordPiece training is made so).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertforge.config import TOKENIZER_KINDS, TokenizerConfig
from bertforge.corpus import DEFAULT_TEXT_COLUMN, read_documents
from bertforge.errors import BertforgeError
from bertforge.io import atomic_directory, atomic_write_bytes, json_text, read_json
from bertforge.progress import is_terminal

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SPECIAL_TOKENS_MAP = dict(
    zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS, strict=True)
)
HF_CONFIG_FILE = "tokenizer_config.json"  # what transformers' BertTokenizerFast reads beside tokenizer.json
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"
SETTINGS_FILE = "bertforge_tokenizer.json"
TRAINING_VERSION = 3  # 2: deterministic WordPiece training, 3: special tokens in the text not counted;
# caches key on it
# BERT's CJK ideographs (Google's `_is_chinese_char`), each a word of its own, as BERT splits them
IDEOGRAPHS = (
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002ceaf\U0002f800-\U0002fa1f"
)
_TRAIN_BATCH = 1000  # sentences per batch handed to the Rust trainer
_MODEL_KINDS = {"WordPiece": "wordpiece", "WordLevel": "wordlevel"}
NEEDS_SPECIALS = (
    "BERT needs [PAD] [UNK] [CLS] [SEP] [MASK] in its vocabulary: train a tokenizer with bertforge"
)


class BertTokenizer:
    """A `tokenizers.Tokenizer` (`backend`) with BERT's five special tokens and their ids."""

    def __init__(
        self,
        backend: Tokenizer,
        kind: str,
        lowercase: bool,
        min_frequency: int | None = None,
        source: str = "the tokenizer",
    ):
        special_ids = _special_ids(backend, source)
        self.backend = backend
        self.source = source
        self.kind = kind
        self.lowercase = lowercase
        self.min_frequency = min_frequency
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = special_ids
        self.special_ids = special_ids
        self.fingerprint = _fingerprint(self._json_bytes())
        # What the folder's settings file recorded (`load_tokenizer`); a tokenizer.json replaced since differs
        self.saved_fingerprint: str | None = None
        self._continuation: np.ndarray | None = None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens (encoded in parallel in Rust)."""
        # encode_batch_fast (tokenizers >= 0.20) skips computing character offsets.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]

    def encode_pair(
        self, a: str, b: str | None = None, max_length: int | None = None
    ) -> tuple[list[int], list[int]]:
        """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` as (input_ids, token_type_ids).

        With `max_length`, the longer side is truncated first (as BERT does for sentence pairs).
        """
        return self.encode_pairs([a], [b], max_length)[0]

    def encode_pairs(
        self, texts: list[str], pairs: list[str | None] | None = None, max_length: int | None = None
    ) -> list[tuple[list[int], list[int]]]:
        """`encode_pair` of each text and its pair (None: a single text), in one call to the backend."""
        return self.encode_pairs_and_cuts(texts, pairs, max_length)[0]

    def encode_pairs_and_cuts(
        self, texts: list[str], pairs: list[str | None] | None = None, max_length: int | None = None
    ) -> tuple[list[tuple[list[int], list[int]]], int]:
        """`encode_pairs`, and how many of the texts (with their pairs) `max_length` cut."""
        pairs = pairs if pairs is not None else [None] * len(texts)
        specials = [2 if b is None else 3 for b in pairs]
        if max_length is not None and texts and max_length < max(specials):
            raise BertforgeError(f"max_length must be at least {max(specials)} to hold the special tokens")
        pieces = self.encode_batch([*texts, *(b or "" for b in pairs)])
        encoded, cuts = [], 0
        halves = pieces[: len(texts)], pieces[len(texts) :]
        for first, second, b, count in zip(*halves, pairs, specials, strict=True):
            if max_length is not None and len(first) + len(second) + count > max_length:
                first, second = _truncate_longest_first(first, second, max_length - count)
                cuts += 1
            input_ids = [self.cls_id, *first, self.sep_id]
            token_type_ids = [0] * len(input_ids)
            if b is not None:
                input_ids += [*second, self.sep_id]
                token_type_ids += [1] * (len(second) + 1)
            encoded.append((input_ids, token_type_ids))
        return encoded, cuts

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(_int_list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.backend.id_to_token(i) for i in _int_list(ids)]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def continuation_mask(self) -> np.ndarray:
        """(vocab_size,) bool: True for `##` word pieces (used by whole-word masking)."""
        if self._continuation is None:
            self._continuation = np.array([token.startswith("##") for token in self._tokens()], dtype=bool)
        return self._continuation

    def save(self, out_dir: str | Path, max_length: int | None = None) -> Path:
        """Write `tokenizer.json`, `vocab.txt`, `tokenizer_config.json` and `bertforge_tokenizer.json`
        into `out_dir`. `max_length`, the length the model trained at, tells `transformers` where to
        truncate.

        A new folder appears complete or not at all; in an existing folder (a model folder being
        assembled, say) each file is replaced atomically and other files are left alone.
        """
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise BertforgeError(f"{out_dir} is a file; give a folder to save the tokenizer into")
        settings = {
            "kind": self.kind,
            "lowercase": self.lowercase,
            "vocab_size": self.vocab_size,
            "min_frequency": self.min_frequency,
            "fingerprint": self.fingerprint,
        }
        files = {  # tokenizer.json last: its presence marks a complete folder
            VOCAB_FILE: "".join(f"{token}\n" for token in self._tokens()).encode("utf-8"),
            SETTINGS_FILE: json_text(settings).encode("utf-8"),
            HF_CONFIG_FILE: json_text(self.hf_settings(max_length)).encode("utf-8"),
            TOKENIZER_FILE: self._json_bytes(),
        }
        if out_dir.is_dir():
            for name, data in files.items():
                atomic_write_bytes(out_dir / name, data)
            return out_dir
        with atomic_directory(out_dir) as tmp:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
        return out_dir

    def hf_settings(self, max_length: int | None = None) -> dict:
        """tokenizer_config.json for `transformers`, which otherwise lower-cases: strip_accents and
        do_lower_case repeat what tokenizer.json's normalizer does, so that a transformers version that
        rebuilds the normalizer from them builds the same one. Without `model_max_length` its
        pipelines' `truncation=True` keeps texts longer than the model's positions."""
        limit = {} if max_length is None else {"model_max_length": max_length}
        return limit | {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.lowercase,
            "tokenize_chinese_chars": True,
            "clean_up_tokenization_spaces": False,
            **SPECIAL_TOKENS_MAP,
        }

    def _json_bytes(self) -> bytes:
        return self.backend.to_str(pretty=True).encode("utf-8")

    def _tokens(self) -> list[str]:
        """Every token in id order."""
        by_id = {i: token for token, i in self.backend.get_vocab(with_added_tokens=True).items()}
        assert sorted(by_id) == list(range(len(by_id))), "token ids are not contiguous"
        return [by_id[i] for i in range(len(by_id))]


def vocabulary_size_text(tokenizer: BertTokenizer, config: TokenizerConfig) -> str:
    """ "20,329 wordpiece tokens", saying so where the text held fewer than were asked for."""
    text = f"{tokenizer.vocab_size:,} {config.kind} tokens"
    if tokenizer.vocab_size < config.vocab_size:
        text += f" (of {config.vocab_size:,} asked for: no more occur in the text often enough)"
    return text


def train_tokenizer(
    corpus_files: Sequence[str | Path],
    config: TokenizerConfig,
    out_dir: str | Path,
    format: str = "auto",
    show_progress: bool = True,
    text_column: str = DEFAULT_TEXT_COLUMN,
) -> BertTokenizer:
    """Learn a vocabulary from the sentences of `corpus_files` and save it into `out_dir`.

    Each file is read in `format` (detected per file for "auto"); `text_column` names the text
    field of jsonl and Parquet files.
    """
    assert config.kind in TOKENIZER_KINDS, f"tokenizer.kind {config.kind!r} (config.validate checks it)"
    if not corpus_files:
        raise BertforgeError("no corpus files given to train the tokenizer on; pass at least one text file")

    def sentences() -> Iterator[list[str]]:
        # Opening every stream checks every file (and Parquet column) before training starts.
        streams = [read_documents(path, format, text_column=text_column) for path in corpus_files]
        return _without_special_tokens(_sentence_batches(streams))

    # The Rust trainer's bars need a terminal: elsewhere they leave only empty lines (on stdout).
    rust_bars = show_progress and is_terminal(sys.stdout) and is_terminal(sys.stderr)
    pieces = _continuation_pieces(sentences(), config) if config.kind == "wordpiece" else []
    backend = _new_backend(config.kind, config.lowercase)
    backend.train_from_iterator(sentences(), trainer=_trainer(config, rust_bars, pieces))
    if config.kind == "wordpiece":  # the pieces were the trainer's special tokens; here plain vocabulary
        backend = _new_backend(config.kind, config.lowercase, backend.get_vocab(with_added_tokens=False))
    if backend.get_vocab_size(with_added_tokens=True) <= len(SPECIAL_TOKENS):
        raise BertforgeError(
            f"the corpus gave no words seen at least tokenizer.min_frequency = {config.min_frequency} "
            "times; use a larger corpus or lower tokenizer.min_frequency"
        )
    tokenizer = BertTokenizer(backend, config.kind, config.lowercase, config.min_frequency)
    if config.kind == "wordpiece" and tokenizer.vocab_size > config.vocab_size:
        warnings.warn(
            f"the vocabulary holds {tokenizer.vocab_size:,} tokens, more than tokenizer.vocab_size = "
            f"{config.vocab_size:,}: WordPiece keeps BERT's five special tokens and every character of the "
            f"text, alone and as a `##` piece ({len(pieces):,} of those); a larger size adds whole words",
            stacklevel=2,
        )
    tokenizer.save(out_dir)
    return tokenizer


def _new_backend(kind: str, lowercase: bool, vocab: dict[str, int] | None = None) -> Tokenizer:
    if kind == "wordpiece":
        backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
        backend.decoder = decoders.WordPiece(prefix="##")
    else:
        backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # Added before training so that "[UNK]" in the text (WikiText's <unk>) is not counted as a word;
    # they take ids 0-4 in an empty vocabulary and keep their ids in a given one.
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(token, backend.token_to_id(token)) for token in ("[CLS]", "[SEP]")],
    )
    return backend


def _continuation_pieces(batches: Iterator[list[str]], config: TokenizerConfig) -> list[str]:
    """Every `##c` piece of the corpus, sorted: a first pass of the trainer with no merges.

    `tokenizers`' WordPiece trainer numbers the `##c` pieces in the order of a hash map seeded anew
    in each process, and breaks ties between equally frequent merges by those numbers, so its vocabulary
    differs from run to run. Given to the real pass as special tokens, right after the five of BERT,
    the pieces get fixed ids, and the rest of the training (characters in code point order, merges
    by count then ids) is deterministic.
    """
    backend = _new_backend(config.kind, config.lowercase)
    survey = TokenizerConfig(kind=config.kind, vocab_size=0, lowercase=config.lowercase)
    backend.train_from_iterator(batches, trainer=_trainer(survey, show_progress=False))
    return sorted(token for token in backend.get_vocab(with_added_tokens=False) if token.startswith("##"))


def _trainer(config: TokenizerConfig, show_progress: bool, pieces: Sequence[str] = ()):
    options = dict(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *pieces],
        show_progress=show_progress,
    )
    if config.kind == "wordpiece":
        return trainers.WordPieceTrainer(**options, continuing_subword_prefix="##")
    return trainers.WordLevelTrainer(**options)


def _id_holes(backend: Tokenizer) -> int:
    """How many ids below the largest no token has."""
    ids = backend.get_vocab(with_added_tokens=True).values()
    return max(ids, default=-1) + 1 - len(ids)


_SPECIAL_IN_TEXT = re.compile("|".join(map(re.escape, SPECIAL_TOKENS)))


def _without_special_tokens(batches: Iterator[list[str]]) -> Iterator[list[str]]:
    """The sentences with BERT's special tokens taken out (WikiText's <unk> reads as [UNK]): counted
    as a word, [UNK] cost WordPiece three slots (##UNK], ##NK], ##K]) and WordLevel a hole in its ids.
    Encoding reads them in the text as the tokens they name."""
    for batch in batches:
        yield [_SPECIAL_IN_TEXT.sub(" ", sentence) for sentence in batch]


def _sentence_batches(streams: Iterable[Iterator[list[str]]]) -> Iterator[list[str]]:
    batch: list[str] = []
    for documents in streams:
        for document in documents:
            batch.extend(document)
            if len(batch) >= _TRAIN_BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def load_tokenizer(path: str | Path) -> BertTokenizer:
    """Load a tokenizer folder: `tokenizer.json` (+ settings), or just a BERT `vocab.txt`."""
    path = Path(path)
    if not path.is_dir():
        state = "is a file, not a folder" if path.exists() else "does not exist"
        raise BertforgeError(
            f"tokenizer folder {path} {state}; train a tokenizer first or give the folder that "
            f"holds {TOKENIZER_FILE} or {VOCAB_FILE}"
        )
    settings = _read_settings(path / SETTINGS_FILE)
    if (path / TOKENIZER_FILE).is_file():
        backend = _read_tokenizer_json(path / TOKENIZER_FILE)
        source = path / TOKENIZER_FILE
        described = json.loads(backend.to_str())
        kind = settings.get("kind") or _model_kind(described, source)
        lowercase = settings.get("lowercase", _normalizer_lowercase(described))
    elif (path / VOCAB_FILE).is_file():
        source = path / VOCAB_FILE
        kind, lowercase = "wordpiece", settings.get("lowercase", hf_lowercase(path))
        backend = _new_backend(kind, lowercase, _read_vocab(source))
    else:
        run = f"; a run's tokenizer is in its tokenizer/ folder, {path / 'tokenizer'}"
        raise BertforgeError(
            f"tokenizer folder {path} holds neither {TOKENIZER_FILE} nor {VOCAB_FILE}; "
            "train a tokenizer into it or point to another folder"
            + (run if (path / "tokenizer").is_dir() else "")
        )
    if holes := _id_holes(backend):
        raise BertforgeError(
            f"{source} numbers its tokens with {holes:,} gaps; a tokenizer's ids must run from 0 up, one "
            "per token: retrain it, or give its vocab.txt alone"
        )
    tokenizer = BertTokenizer(backend, kind, lowercase, settings.get("min_frequency"), source=str(source))
    if source.name == TOKENIZER_FILE:  # what the settings file recorded when saved with this tokenizer.json
        tokenizer.saved_fingerprint = settings.get("fingerprint")
    return tokenizer


def load_given_tokenizer(path: str | Path) -> BertTokenizer:
    """A tokenizer folder a user names (`--tokenizer`): `load_tokenizer`'s, in bertforge's form where it
    is a GPT export's (`bert_form`)."""
    tokenizer = load_tokenizer(path)
    return tokenizer if tokenizer.backend.post_processor is not None else bert_form(tokenizer)


def bert_form(tokenizer: BertTokenizer) -> BertTokenizer:
    """bertforge's form of a tokenizer from an exported GPT folder, which frames nothing and decodes for
    text generation: BERT's `[CLS] text [SEP]` post-processor and, for WordPiece, its `##` decoder back."""
    backend = Tokenizer.from_str(tokenizer.backend.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.cls_id), ("[SEP]", tokenizer.sep_id)],
    )
    backend.decoder = decoders.WordPiece(prefix="##") if tokenizer.kind == "wordpiece" else None
    return BertTokenizer(
        backend, tokenizer.kind, tokenizer.lowercase, tokenizer.min_frequency, tokenizer.source
    )


def _read_settings(path: Path) -> dict:
    if not path.is_file():
        return {}
    settings = read_json(path, damaged="delete it or retrain the tokenizer")
    if settings.get("kind", "wordpiece") not in TOKENIZER_KINDS:
        raise BertforgeError(f"{path} does not hold bertforge tokenizer settings; delete it or retrain")
    return settings


def hf_lowercase(folder: Path) -> bool:
    """Whether a Hugging Face folder's `vocab.txt` is read lower-cased: its tokenizer_config.json's
    `do_lower_case`, else BertTokenizer's default (yes)."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return True
    return bool(read_json(path, damaged="fix it or remove it").get("do_lower_case", True))


def _read_tokenizer_json(path: Path) -> Tokenizer:
    """The tokenizer in `path`, without padding or truncation: a saved setting of either would put
    [PAD]s into shards and predictions, or cut texts that bertforge cuts or windows itself."""
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust side raises a bare Exception for any parse problem
        raise BertforgeError(
            f"{path} is not a valid tokenizer file ({error}); retrain the tokenizer"
        ) from None
    backend.no_padding()
    backend.no_truncation()
    return backend


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        tokens = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise BertforgeError(
            f"{path} is not UTF-8 text; give a BERT vocab.txt (one token per line)"
        ) from None
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens) or "" in vocab:
        raise BertforgeError(
            f"{path} has blank or repeated lines; a vocab.txt holds one distinct token per line"
        )
    # Checked here, not only in BertTokenizer: _new_backend would append a missing special token
    # at the end of the vocabulary, silently changing its size.
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise BertforgeError(f"{path} lacks {' '.join(missing)}; {NEEDS_SPECIALS}")
    return vocab


def _model_kind(described: dict, source: Path) -> str:
    model_type = described.get("model", {}).get("type")
    if model_type not in _MODEL_KINDS:
        raise BertforgeError(
            f"{source} holds a {model_type} model; bertforge supports WordPiece and WordLevel tokenizers"
        )
    return _MODEL_KINDS[model_type]


def _normalizer_lowercase(described: dict) -> bool:
    """Whether a tokenizer.json's normalizer lower-cases: a BertNormalizer set to, or a Lowercase step
    (alone or in a Sequence); no normalizer does not."""
    normalizer = described.get("normalizer") or {}
    kind = normalizer.get("type")
    if kind == "Sequence":
        return any(_normalizer_lowercase({"normalizer": step}) for step in normalizer.get("normalizers", []))
    return kind == "Lowercase" or (kind == "BertNormalizer" and bool(normalizer.get("lowercase", True)))


def _special_ids(backend: Tokenizer, source: str) -> tuple[int, ...]:
    """The ids of `SPECIAL_TOKENS`, in that order; each must be in the vocabulary once."""
    found = {token: backend.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, i in found.items() if i is None]
    if missing:
        raise BertforgeError(f"{source} lacks {' '.join(missing)}; {NEEDS_SPECIALS}")
    ids = tuple(found.values())
    if len(set(ids)) != len(ids):
        shared = ", ".join(f"{token}={i}" for token, i in found.items())
        raise BertforgeError(f"{source} gives two special tokens one id ({shared}); {NEEDS_SPECIALS}")
    return ids


def _fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _truncate_longest_first(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut both lists at their ends to fit `budget` together, as Hugging Face's fast tokenizers do
    ("longest_first"), so that an exported model reads a long pair as bertforge does: the shorter list
    stays whole where the longer can take the rest; else the shorter keeps budget // 2 and the longer
    the rest (the second, of two of equal length). Google's loop gives an odd token to the first."""
    if len(a) + len(b) <= budget:
        return a, b
    short, long = sorted((len(a), len(b)))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget - budget // 2
    keep_a, keep_b = (long, short) if len(a) > len(b) else (short, long)
    return a[:keep_a], b[:keep_b]


def _int_list(ids: Iterable[int]) -> list[int]:
    return np.asarray(ids, dtype=np.int64).ravel().tolist()

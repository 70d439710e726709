"""The benchmarks' text: WikiText-2 (or, for `--quick`, slices of it) and its cached tokenizer and shards."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import WIKITEXT
from bertforge.cache import cached_shards, cached_tokenizer
from bertforge.config import TokenizerConfig
from bertforge.errors import BertforgeError
from bertforge.shards import TokenShards
from bertforge.tokenizer import BertTokenizer

QUICK_LINES = {"train": 2400, "valid": 800}  # about 0.6 MB and 0.1 MB, as the tests' slices


def wikitext(split: str, quick: bool, workdir: Path) -> Path:
    """WikiText-2's `wiki.{split}.tokens`, or its first lines for a quick run."""
    path = Path(WIKITEXT) / f"wiki.{split}.tokens"
    if not path.is_file():
        raise BertforgeError(f"{path} is missing; set BERTFORGE_WIKITEXT to the folder holding WikiText-2")
    if not quick:
        return path
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)[: QUICK_LINES[split]]
    sliced = workdir / f"wiki.{split}.quick.tokens"
    sliced.write_text("".join(lines), encoding="utf-8")
    return sliced


def prepared(quick: bool, workdir: Path, cache_dir: Path) -> tuple[BertTokenizer, TokenShards, TokenShards]:
    """Tokenizer (30,522 WordPiece) and shards of train and validation text, from the cache when there."""
    train, valid = wikitext("train", quick, workdir), wikitext("valid", quick, workdir)
    tokenizer = cached_tokenizer([train], TokenizerConfig(), "wikitext", cache_dir)
    return (
        tokenizer,
        cached_shards(train, tokenizer, "wikitext", cache_dir, show_progress=False),
        cached_shards(valid, tokenizer, "wikitext", cache_dir, show_progress=False),
    )

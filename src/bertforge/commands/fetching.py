"""The `fetch` command: download a public corpus once into the bertforge cache and print its folder.

The handler calls `bertforge.download.fetch_corpus`; the folder goes to stdout (so that a script
can take it), progress and errors to stderr.
"""

from __future__ import annotations

from pathlib import Path

from bertforge.cache import default_cache_dir
from bertforge.download import CORPORA, fetch_corpus


def register(commands) -> None:
    p = commands.add_parser(
        "fetch",
        help="download a public corpus (WikiText-2) once into the cache",
        description="Download the training and validation files of a public corpus into the bertforge "
        "cache, check them against the checksums bertforge carries, and print the folder that holds "
        "them. Files already there are reused without a download. wikitext-2: WikiText-2 "
        "(wiki.train.tokens, wiki.valid.tokens), the corpus of `make demo`.",
    )
    p.add_argument("corpus", choices=sorted(CORPORA), help="which corpus")
    p.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="the cache (default $BERTFORGE_CACHE, else ~/.cache/bertforge)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.set_defaults(handler=run_fetch)


def run_fetch(args) -> int:
    folder = fetch_corpus(args.corpus, args.cache_dir or default_cache_dir(), show_progress=not args.quiet)
    print(folder)
    return 0

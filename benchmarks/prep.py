"""(3) Data preparation: input MB/s and peak memory, for WikiText-2 train and a corpus ten times larger.

Each preparation (WordPiece training with bertforge's defaults, then tokenizing into shards) runs in
a fresh child process, which reports its own peak resident memory (`VmHWM`, the interpreter and its
imports included; `baseline_rss_mb` is that part) so that nothing else the suite ran is counted.
(`getrusage`'s `ru_maxrss` would not do: Linux carries it across fork and exec, so a child of
this process, which holds torch, would start at the parent's size.) The larger corpus repeats the
file ten times into a temporary file; memory must stay flat (at most 1.5x).

Run as `python -m benchmarks.prep CORPUS OUT` it is that child, printing one JSON line.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the child must not import torch: it would dominate the memory it measures
    from benchmarks.common import Bench

REPEATS = 10


def prepare(corpus: Path, out: Path) -> dict:
    """Train the tokenizer and write the shards of `corpus` under `out`; time each part."""
    from bertforge.config import TokenizerConfig
    from bertforge.shards import prepare_shards
    from bertforge.tokenizer import train_tokenizer

    baseline = memory_mb("VmRSS")
    start = time.perf_counter()
    tokenizer = train_tokenizer([corpus], TokenizerConfig(), out / "tokenizer", show_progress=False)
    trained = time.perf_counter()
    meta = prepare_shards(corpus, tokenizer, out / "shards", show_progress=False)
    done = time.perf_counter()
    return {
        "tokenizer_s": trained - start,
        "shards_s": done - trained,
        "tokens": meta["num_tokens"],
        "baseline_rss_mb": baseline,
        "peak_rss_mb": memory_mb("VmHWM"),
    }


def memory_mb(field: str) -> float:
    """This process's resident memory (VmRSS) or its peak (VmHWM) in MB, from /proc (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            kilobytes = next(int(line.split()[1]) for line in status if line.startswith(field + ":"))
    except (OSError, StopIteration):  # not Linux: the peak since the process started
        kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kilobytes / 1024


def repeated(corpus: Path, times: int, out: Path) -> Path:
    """`corpus` written `times` times into one file (streamed: the copy itself uses no memory)."""
    with out.open("wb") as target:
        for _ in range(times):
            with corpus.open("rb") as source:
                while block := source.read(1 << 24):
                    target.write(block)
    return out


def measure_child(corpus: Path, out: Path) -> dict:
    """Prepare `corpus` in a child process; its times, input MB/s and peak memory."""
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.prep", str(corpus), str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    if completed.returncode != 0:
        raise RuntimeError(f"data preparation of {corpus} failed:\n{completed.stderr[-4000:]}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    megabytes = corpus.stat().st_size / 1e6
    seconds = result["tokenizer_s"] + result["shards_s"]
    return {**result, "input_mb": megabytes, "seconds": seconds, "mb_per_s": megabytes / seconds}


def run(bench: Bench) -> dict:
    from benchmarks.data import wikitext

    corpus = wikitext("train", bench.quick, bench.workdir)
    bench.log(f"prep: {corpus.name} ({corpus.stat().st_size / 1e6:.1f} MB)")
    single = measure_child(corpus, bench.workdir / "prep-1x")
    big = repeated(corpus, REPEATS, bench.workdir / f"{corpus.stem}.x{REPEATS}.tokens")
    bench.log(f"prep: {big.name} ({big.stat().st_size / 1e6:.1f} MB)")
    larger = measure_child(big, bench.workdir / f"prep-{REPEATS}x")
    big.unlink()
    return {
        "corpus": corpus.name,
        "single": single,
        f"x{REPEATS}": larger,
        "memory_ratio": larger["peak_rss_mb"] / single["peak_rss_mb"],
    }


def main() -> None:
    corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps(prepare(corpus, out)))


if __name__ == "__main__":
    main()

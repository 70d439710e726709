"""Progress of a long loop: a tqdm bar when stderr is a terminal (in Jupyter, tqdm's widget);
elsewhere (nohup, CI, a pipe, a captured stream) a plain line every tenth of the way and at least
once a minute, so that a log gains a few readable lines instead of a megabyte of redrawn bars.

`progress_bar` takes the tqdm arguments bertforge uses and returns either a tqdm bar or a
`PlainProgress`, which offers the part of tqdm's interface its callers use: `update`, `n`, `total`,
`set_postfix`, `write`, `close`, iteration over a wrapped iterable, and the `with` block.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO

from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as notebook_or_console_tqdm
from tqdm.std import tqdm as console_tqdm

IN_NOTEBOOK = notebook_or_console_tqdm is not console_tqdm  # tqdm.auto chose Jupyter's widget
LINE_EVERY_S = 60.0  # a plain line at least this often while the loop advances
LINES_PER_TOTAL = 10  # and one each time it passes another tenth of the total


def is_terminal(stream: IO) -> bool:
    """Whether `stream` shows a redrawn bar (a terminal), rather than keeping every redraw (a file). A
    terminal that reports no columns (a pty nobody sized, such as `script`'s) gets lines: tqdm would
    draw nothing there."""
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (OSError, ValueError, AttributeError):  # no file descriptor, or not one with a size
        return True


def reader_left(stream: IO) -> bool:
    """Whether `stream` is a pipe whose reader has gone (poll reports an error on it, or on macOS a
    hang-up); if so, what is left to write to it goes to os.devnull, so that no later write (the exit's
    own flush) fails again. Without poll (Windows), or without a real stream (a test's capture): no."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        if not any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
            return False
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        return True
    except (AttributeError, OSError, ValueError):
        return False


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: float | None = None,
    initial: float = 0,
    unit: str = "it",
    desc: str = "",
    unit_scale: bool = False,
    unit_divisor: int = 1000,
    bar_format: str | None = None,
    of_what: str = "",
    disable: bool = False,
    file: IO | None = None,
) -> Progress:
    """A tqdm bar on a terminal (`bar_format` its layout), plain lines elsewhere (`of_what` says what
    the total is, e.g. "of the time budget"); nothing with `disable`."""
    stream = file if file is not None else sys.stderr
    if disable or is_terminal(stream) or IN_NOTEBOOK:
        return tqdm(
            iterable,
            total=total,
            initial=initial,
            unit=unit,
            desc=desc or None,
            unit_scale=unit_scale,
            unit_divisor=unit_divisor,
            bar_format=bar_format,
            dynamic_ncols=True,
            disable=disable,
            file=stream,
        )
    return PlainProgress(iterable, total, initial, unit, desc, unit_scale, unit_divisor, of_what, stream)


def passing_bar(iterable: Iterable, *, total: int, desc: str, unit: str, file: IO | None = None) -> Iterable:
    """A bar that goes when its loop ends, on a terminal only; elsewhere `iterable` as it is. For a short
    loop inside a long one's progress (a pretraining run's evaluations), which a log need not list."""
    stream = file if file is not None else sys.stderr
    if not is_terminal(stream) or IN_NOTEBOOK:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, file=stream)


class PlainProgress:
    """Progress as lines for a log: `40% (400/1,000 steps), 2:00 so far, about 3:00 left; loss=3.456`,
    one each tenth of the total and at least every `LINE_EVERY_S` seconds, and a last one at
    `close`."""

    def __init__(
        self,
        iterable: Iterable | None,
        total: float | None,
        initial: float,
        unit: str,
        desc: str,
        unit_scale: bool,
        unit_divisor: int,
        of_what: str,
        stream: IO,
    ) -> None:
        self.iterable, self.total, self.n, self.start_n = iterable, total, initial, initial
        self.unit, self.desc, self.unit_scale, self.unit_divisor = unit, desc, unit_scale, unit_divisor
        self.of_what, self.stream = of_what, stream
        self.postfix = ""
        self.started = self.last_line_at = time.monotonic()
        self.last_tenth = self.tenth()
        self.printed: tuple | None = None  # (count, postfix) of the last line
        self.closed = False

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def update(self, count: float = 1) -> None:
        self.n += count
        now = time.monotonic()
        if self.tenth() > self.last_tenth or now - self.last_line_at >= LINE_EVERY_S:
            self.print_line(now)

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def write(self, text: str) -> None:
        """A line of its own, on standard output (as `tqdm.write`)."""
        print(text, flush=True)

    def close(self) -> None:
        """The last line, unless the last one printed says the same."""
        if not self.closed and self.printed != (self.n, self.postfix):
            self.print_line(time.monotonic())
        self.closed = True

    def tenth(self) -> int:
        return int(self.n * LINES_PER_TOTAL // self.total) if self.total else 0

    def print_line(self, now: float) -> None:
        self.last_line_at, self.last_tenth, self.printed = now, self.tenth(), (self.n, self.postfix)
        print(self.line(now - self.started), file=self.stream, flush=True)

    def line(self, elapsed_s: float) -> str:
        where = self.amounts()
        if self.total:
            where = f"{self.n / self.total:.0%} ({where}{' ' + self.of_what if self.of_what else ''})"
        text = f"{self.desc + ': ' if self.desc else ''}{where}, {clock(elapsed_s)} so far"
        done = self.n - self.start_n
        if self.total and done > 0 and self.n < self.total:
            text += f", about {clock(elapsed_s * (self.total - self.n) / done)} left"
        return text + (f"; {self.postfix}" if self.postfix else "")

    def amounts(self) -> str:
        """`400/1,000 steps`, or scaled `4.00MB/10.0MB`; without a total, the count alone."""
        values = [self.n] + ([self.total] if self.total else [])
        if self.unit_scale:
            return "/".join(tqdm.format_sizeof(value, self.unit, self.unit_divisor) for value in values)
        return "/".join(f"{value:,.0f}" for value in values) + f" {plural(self.unit, values[-1])}"


def plural(unit: str, count: float) -> str:
    """`step` -> `steps`, `batch` -> `batches`, `epoch` -> `epochs` (tqdm's units are singular); `s` stays."""
    if count == 1 or len(unit) < 3:
        return unit
    return unit + ("es" if unit.endswith(("s", "sh", "tch", "x")) else "s")


def clock(seconds: float) -> str:
    """`1:02:03` or `2:03`."""
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}:{minute:02d}:{second:02d}" if hours else f"{minute}:{second:02d}"


def metrics_text(metrics: dict[str, float]) -> str:
    """`mlm_loss 5.1234, mlm_accuracy 0.3081`: every held-out line, during a run and after it, alike;
    a fine-tuning epoch as its number (`epoch 2`)."""
    return ", ".join(
        f"{key} {value:g}" if key == "epoch" else f"{key} {value:.4f}" for key, value in metrics.items()
    )


def duration(seconds: float) -> str:
    """`42 s` under a minute, else `3.5 min`: a short run's time is not `0.0 min`."""
    return f"{seconds:.0f} s" if seconds < 59.5 else f"{seconds / 60:.1f} min"


Progress = tqdm | PlainProgress  # what `progress_bar` returns
# tqdm's own rate and ETA leave the runs under way out: RunsProgress puts its own in the postfix
RUNS_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}{postfix}]"


class RunsProgress:
    """Progress over many runs (of `glue`, of `finetune --seeds`) in units of work (`unit`: optimizer
    steps, estimated tokens), so that the ETA weighs long runs as such: a bar on a terminal, else a
    line per run and one a minute while runs are under way (`tick`). `work`: each run's work by a key
    unique to it (its folder, its label); `done`: whether each finished before (counted from the
    start); `at_once`: how many train side by side.

    The pace is the work of the runs that ended over their own clocks (a run in a worker is timed
    from its `start`, one in this process from the end of the run before it). The ETA is the work
    left, less what the runs under way did at that pace since they began, at the pace times the runs
    side by side, and no less than the longest run under way needs. The ended runs' work over the
    wall time alone leaves the work of the runs under way out: with two at a time it read high by a
    quarter to two thirds."""

    def __init__(
        self,
        name: str,
        work: dict[str, int],
        done: list[bool],
        show: bool,
        unit: str = "step",
        at_once: int = 1,
    ) -> None:
        self.name, self.unit, self.total_runs, self.runs_done = name, unit, len(work), sum(done)
        self.work, self.total = work, sum(work.values())
        self.done_work = sum(count for count, finished in zip(work.values(), done, strict=True) if finished)
        self.show, self.tty, self.at_once = show, show and is_terminal(sys.stderr), at_once
        self.began = self.last_end = self.last_shown = time.time()
        self.new_work, self.run_seconds = 0, 0.0
        self.postfix = ""  # the last ended run and the rate, before the ETA
        self.under_way: dict[str, float] = {}  # key: when it began
        self.bar = (
            tqdm(
                total=self.total,
                initial=self.done_work,
                unit=unit,
                unit_scale=True,
                desc=name,
                dynamic_ncols=True,
                bar_format=RUNS_BAR,
            )
            if self.tty
            else None
        )

    def start(self, key: str) -> None:
        """Run `key` began now, in a worker."""
        self.under_way[key] = time.time()

    def advance(self, key: str, label: str, was_done: bool, figure: str = "") -> None:
        """Run `key` ended (`label` and `figure`: what it was and its result, for the user)."""
        now, work = time.time(), self.work[key]
        began = self.under_way.pop(key, self.last_end)
        self.last_end = now
        if was_done:
            return  # counted from the start
        self.runs_done += 1
        self.done_work += work
        self.new_work += work
        self.run_seconds += now - began
        shown = f", {figure}" if figure else ""
        if self.bar is not None:
            per_second = self.rate()
            rate = f", {tqdm.format_sizeof(per_second)}{self.unit}/s" if per_second else ""
            self.postfix = f"{label}{shown}{rate}"
            self.bar.set_postfix_str(f"{self.postfix}{self.eta()}", refresh=False)
            self.bar.update(work)
        elif self.show:
            self.print_line(f"{self.runs_done}/{self.total_runs} runs: {label} done{shown}{self.eta()}")

    def tick(self) -> None:
        """While runs are under way: a terminal's bar redraws its clock and ETA each second; a log gets
        a line when it has had none for `LINE_EVERY_S`, so that a long run is not silence."""
        now = time.time()
        if self.bar is not None:
            if now - self.last_shown >= 1.0:
                self.last_shown = now
                self.bar.set_postfix_str(f"{self.postfix}{self.eta()}")
        elif self.show and now - self.last_shown >= LINE_EVERY_S:
            under_way = f", {len(self.under_way)} under way" if self.under_way else ""
            done = f"{self.runs_done}/{self.total_runs} runs done{under_way}"
            self.print_line(f"{done}, {clock(now - self.began)} so far{self.eta()}")

    def print_line(self, text: str) -> None:
        self.last_shown = time.time()
        print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def pace(self) -> float:
        """Units of work a second of one run."""
        return self.new_work / self.run_seconds if self.run_seconds > 0 else 0.0

    def side_by_side(self) -> int:
        return max(min(self.at_once, self.total_runs - self.runs_done), 1)

    def rate(self) -> float:
        """Units of work a second of all the runs under way."""
        return self.pace() * self.side_by_side()

    def seconds_left(self) -> float | None:
        """None before the first run of this invocation ends."""
        pace, now = self.pace(), time.time()
        if not pace:
            return None
        left_under_way = [
            max(self.work[key] - pace * (now - began), 0) for key, began in self.under_way.items()
        ]
        done_under_way = sum(self.work[key] for key in self.under_way) - sum(left_under_way)
        # The runs side by side share the work left, but none ends before its own last part is done
        longest = max(left_under_way, default=0) / pace
        return max((self.total - self.done_work - done_under_way) / self.rate(), longest)

    def eta(self) -> str:
        seconds = self.seconds_left()
        if seconds is None or self.runs_done == self.total_runs:
            return ""
        return f"; about {seconds / 60:.0f} min left" if seconds >= 60 else "; under a minute left"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

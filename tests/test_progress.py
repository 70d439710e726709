"""Progress: a bar on a terminal; on any other stream, a bounded number of plain lines."""

from __future__ import annotations

import io
import os
import struct

import pytest

from bertforge import progress
from bertforge.progress import PlainProgress, duration, metrics_text, plural, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_log_gets_a_line_each_tenth_and_no_carriage_returns():
    log = io.StringIO()
    bar = progress_bar(total=10_000, unit="step", file=log)
    for step in range(1, 10_001):
        bar.set_postfix(step=step, loss=f"{1 / step:.3f}")  # as the training loop: its log, then the bar
        bar.update(1)
    bar.close()
    shown = lines(log)
    assert "\r" not in log.getvalue()
    assert [line.split("%")[0] for line in shown] == [str(p) for p in range(10, 101, 10)]
    assert shown[4].startswith("50% (5,000/10,000 steps), 0:") and "left; step=5000, loss=0.000" in shown[4]
    assert shown[-1].startswith("100% (10,000/10,000 steps)") and "left" not in shown[-1]


def test_a_log_gets_a_line_a_minute_between_tenths(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    log = io.StringIO()
    bar = progress_bar(total=1000, initial=100, unit="s", of_what="of the time budget", file=log)
    for minute in range(1, 4):
        now[0] = 60.0 * minute + 1
        bar.update(10)  # 1% a minute: no tenth passed
    assert lines(log) == [
        "11% (110/1,000 s of the time budget), 1:01 so far, about 1:30:29 left",
        "12% (120/1,000 s of the time budget), 2:01 so far, about 1:28:44 left",
        "13% (130/1,000 s of the time budget), 3:01 so far, about 1:27:29 left",
    ]
    bar.close()  # the last line already says where it stands
    assert len(lines(log)) == 3


def test_bytes_are_shown_scaled_and_a_wrapped_loop_ends_with_its_last_line():
    log = io.StringIO()
    size = 4 << 20
    with progress_bar(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc="read", file=log) as bar:
        bar.update(size // 2)
    assert lines(log) == ["read: 50% (2.00MB/4.00MB), 0:00 so far, about 0:00 left"]
    log = io.StringIO()
    assert list(progress_bar(range(3), total=3, unit="batch", desc="embed", file=log)) == [0, 1, 2]
    assert lines(log)[-1] == "embed: 100% (3/3 batches), 0:00 so far"


def test_a_terminal_gets_the_bar_and_disable_shows_nothing():
    terminal = Terminal()
    bar = progress_bar(total=5, unit="step", file=terminal)
    assert not isinstance(bar, PlainProgress)
    for _ in range(5):
        bar.update(1)
    bar.close()
    assert "\r" in terminal.getvalue() and "5/5" in terminal.getvalue()
    log = io.StringIO()
    quiet = progress_bar(total=5, file=log, disable=True)
    quiet.update(5)
    quiet.close()
    assert log.getvalue() == ""


def test_a_pty_that_reports_no_columns_gets_lines():
    pty, fcntl, termios = (pytest.importorskip(name) for name in ("pty", "fcntl", "termios"))
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as stream:
        for columns, bar in ((0, False), (80, True)):
            fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
            assert progress.is_terminal(stream) is bar
            shown = progress_bar(total=5, file=stream)
            assert isinstance(shown, PlainProgress) is not bar
            shown.close()
    os.close(leader)


@pytest.mark.parametrize("stream", [io.StringIO(), Terminal()], ids=["log", "terminal"])
def test_write_prints_a_line_of_its_own_on_standard_output(capsys, stream):
    bar = progress_bar(total=2, file=stream)
    bar.write("step 1: loss 2.5")
    bar.close()
    assert capsys.readouterr().out == "step 1: loss 2.5\n"


def test_a_passing_bar_shows_on_a_terminal_only_and_goes_when_done():
    log, terminal, batches = io.StringIO(), Terminal(), [1, 2, 3]
    assert progress.passing_bar(batches, total=3, desc="evaluating", unit="batch", file=log) is batches
    shown = progress.passing_bar(batches, total=3, desc="evaluating", unit="batch", file=terminal)
    assert list(shown) == batches and log.getvalue() == ""
    drawn = terminal.getvalue()
    assert "evaluating" in drawn and "3/3" not in drawn.rsplit("\r", 1)[-1]  # its last redraw clears it


def test_a_duration_under_a_minute_is_in_seconds():
    assert [duration(s) for s in (0.2, 12.3, 59.4, 59.6, 150)] == [
        "0 s",
        "12 s",
        "59 s",
        "1.0 min",
        "2.5 min",
    ]


def test_units_in_the_plural():
    counts = [
        plural(unit, n) for unit, n in [("step", 2), ("batch", 3), ("epoch", 2), ("epoch", 1), ("s", 9)]
    ]
    assert counts == ["steps", "batches", "epochs", "epoch", "s"]


def test_a_held_out_line_gives_figures_to_four_decimals_and_an_epoch_as_its_number():
    line = metrics_text({"epoch": 2.0, "classification_loss": 0.51234567, "accuracy": 0.8})
    assert line == "epoch 2, classification_loss 0.5123, accuracy 0.8000"

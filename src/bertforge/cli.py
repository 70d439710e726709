"""The `bertforge` command line: the entry point, the parser and the handling of user errors.

Each command group lives in `bertforge.commands.<group>` and registers its subcommands; a handler
parses its arguments, builds a config and calls the library. User mistakes
(`BertforgeError`, and argparse's usage errors) print one line on stderr and exit with status 2, no
traceback; so does an `OSError` that reaches the top (an unreadable input, a disk that refused a
write). The library's messages name settings (`data.max_seq_length`) and function arguments
(`` `out` ``); that line shows them as the command's flags (`--max-length`, `--out`; `in_flags`).
bertforge's own warnings print as one `bertforge: warning: ...` line. A run stopped by SIGINT or
SIGTERM after saving a checkpoint (`Interrupted`) prints how to resume and exits with 128 + the
signal's number.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

# Before torch loads: its C++ warnings (a lost rendezvous store's, with stack frames) would follow
# bertforge's one line about the lost process; a level the user set is kept.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from bertforge import __version__  # noqa: E402
from bertforge.commands import fetching, finetuning, glue, inference, pretraining, views  # noqa: E402
from bertforge.errors import BertforgeError, Interrupted  # noqa: E402
from bertforge.io import describe_os_error  # noqa: E402
from bertforge.progress import reader_left  # noqa: E402
from bertforge.signals import signal_of, sigterm_unwinds  # noqa: E402

COMMAND_GROUPS = (pretraining, inference, finetuning, glue, views, fetching)
# How library errors name what these flags set, for every command that has them; a command adds
# its own names with `set_defaults(setting_flags={...})`.
COMMON_FLAGS = {
    "`out`": "--out",
    "`resume=True`": "--resume",
    "`allow_changed_data=True`": "--allow-changed-data",
    "runtime.device": "--device",  # config validation never names it: a bad device is found on use
}

EXAMPLES = """examples:
  bertforge tokenizer train --corpus wiki.train.tokens --vocab-size 30522 --out tok/
  bertforge prepare --corpus wiki.train.tokens --tokenizer tok/ --out shards/
  bertforge pretrain --corpus wiki.train.tokens --valid wiki.valid.tokens --preset mini --out runs/mini
  bertforge pretrain --out runs/mini --resume
  bertforge evaluate --model runs/mini --corpus wiki.valid.tokens --json
  bertforge fill-mask --model runs/mini "The [MASK] sat on the mat."
  bertforge finetune --model runs/mini --train train.tsv --valid dev.tsv --text-column sentence \\
                     --label-column label --out runs/sst2
  bertforge glue --model runs/mini --data glue/ --out runs/glue --compare-scratch
  bertforge export --model runs/mini --out hf/mini
"""


def run() -> int:
    """The `bertforge` program: `main`, then Ctrl-C ignored while the process ends (the command is
    over, its work or its stop saved; a Ctrl-C now would only break an exit handler into a traceback)."""
    status = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> str:
    """What the command did not take: a flag with the command's nearest one, or paths a glob left."""
    given = f"unrecognized arguments: {' '.join(unknown)}"
    flags = [arg.split("=", 1)[0] for arg in unknown if arg.startswith("--")]
    if flags:
        names = {flag[2:]: flag for flag in command_flags(parser, args)}  # compared without the dashes
        near = difflib.get_close_matches(flags[0][2:], list(names), n=1)
        return f"{given} (did you mean {names[near[0]]}?)" if near else given
    if any(Path(arg).exists() for arg in unknown):
        return f"{given} (a glob the shell expanded? quote it, or repeat the flag before each path)"
    return given


def command_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The long flags of the command (and action, as `tokenizer train`) that `args` ran."""
    for name in (args.command, getattr(args, "action", None)):
        choices = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if name not in choices:
            break
        parser = choices[name]
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            break
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own help lists what it takes
        command = " ".join(part for part in (args.command, getattr(args, "action", None)) if part)
        parser.exit(2, usage_line(unrecognized(parser, args, unknown), f"bertforge {command}"))
    with one_line_warnings(), left_process_group(), sigterm_unwinds():
        try:
            refuse_undecodable_texts(args)
            status = args.handler(args)
            sys.stdout.flush()  # here, where a reader that left is handled, not at the interpreter's exit
            return status
        except BertforgeError as error:
            flags = COMMON_FLAGS | getattr(args, "setting_flags", {})
            print(f"bertforge: error: {in_flags(str(error), flags)}", file=sys.stderr)
            return 2
        except BrokenPipeError as error:
            if not reader_left(sys.stdout):
                print(f"bertforge: error: {describe_os_error(error)}", file=sys.stderr)
                return 2
            return 128 + PIPE_SIGNAL  # quietly, as Unix tools end when `| head` stops reading
        except OSError as error:
            print(f"bertforge: error: {describe_os_error(error)}", file=sys.stderr)
            return 2
        except Interrupted as stop:  # a signal, after the run saved a checkpoint
            if stop.report:
                try:
                    print(f"bertforge: {stop}", file=sys.stderr)
                except BrokenPipeError:  # the signal ended the reader of a pipe too (`2>&1 | tee log`)
                    reader_left(sys.stderr)
            return stop.exit_status
        except KeyboardInterrupt as stop:
            how = "stopped by SIGTERM" if signal_of(stop) == signal.SIGTERM else "interrupted by Ctrl-C"
            print(
                f"bertforge: {how}; nothing half-written was kept: run the command again "
                "(a training run that saved a checkpoint continues with --resume)",
                file=sys.stderr,
            )
            return 128 + signal_of(stop)


PIPE_SIGNAL = getattr(signal, "SIGPIPE", 13)
TEXT_ARGUMENTS = ("text", "a", "b", "pair", "prompt")  # the commands' texts given on the command line


def refuse_undecodable_texts(args: argparse.Namespace) -> None:
    """A text argument with bytes that are not UTF-8 (a Latin-1 terminal's "café"): Python keeps them as
    lone surrogates, which the tokenizer would refuse with a TypeError. Paths may hold any bytes."""
    for name in TEXT_ARGUMENTS:
        values = getattr(args, name, None)
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str):
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                byte = ord(value[error.start]) - 0xDC00  # surrogateescape keeps byte b as U+DC00 + b
                raise BertforgeError(
                    f"the text {value.encode('utf-8', 'surrogateescape')!r} holds the byte 0x{byte:02x}, "
                    "which is not UTF-8; give the text in UTF-8 (set the terminal to UTF-8, or convert a "
                    "file with iconv -f latin1 -t utf-8 and pass it with --input)"
                ) from None


def in_flags(message: str, flags: dict[str, str]) -> str:
    """`message` with each library name in `flags` (a setting, or an argument in backticks) shown as
    its flag: "`out` must name a folder" -> "--out must name a folder"."""
    names = sorted(flags, key=len, reverse=True)  # the longest first, where one name starts another
    pattern = "|".join(rf"(?<![\w.]){re.escape(name)}(?!\w)" for name in names)
    return re.sub(pattern, lambda match: flags[match.group()], message)


PACKAGE = Path(__file__).resolve().parent


@contextlib.contextmanager
def left_process_group() -> Iterator[None]:
    """A command run under torchrun leaves its process group when it returns, however it ends."""
    try:
        yield
    finally:
        # Only a command that imported it can have joined a group; `--help` and a mistyped flag need no
        # torch, whose import takes seconds
        if distributed := sys.modules.get("bertforge.distributed"):
            distributed.leave()


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Within the block, warnings raised by bertforge print as one line; others (torch's) as usual."""
    python_format = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None) -> str:
        if PACKAGE in Path(filename).resolve().parents:
            return f"bertforge: warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = python_format


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), whose usage errors are one `bertforge: error:` line
    pointing at `--help`, exit status 2, as every other user error."""

    def error(self, message: str):
        self.exit(2, usage_line(message, self.prog))


def usage_line(message: str, prog: str) -> str:
    """A usage error's one line, pointing at `prog`'s help."""
    return f"bertforge: error: {message}; see `{prog} --help`\n"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="bertforge",
        description=(
            "Pretrain BERT (masked language modelling + next sentence prediction) or GPT-1 on your own "
            "text, then use it: fill-mask, fine-tuned classifiers, regressors and taggers, GLUE, and "
            "Hugging Face folders."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser

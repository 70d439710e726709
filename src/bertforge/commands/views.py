"""Commands that show what a model learned: `attention` (its attention maps) and `plot` (several
runs' held-out curves on one figure).

Each handler checks its arguments, calls one function of `bertforge.attention_view` or
`bertforge.plots`, and prints where the figure went.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertforge.commands import add_device_argument
from bertforge.errors import BertforgeError


def register(commands) -> None:
    add_attention_command(commands)
    add_plot_command(commands)


def add_attention_command(commands) -> None:
    p = commands.add_parser(
        "attention",
        help="draw a model's attention maps for one text",
        description="The attention weights of every layer and head for one text, as a grid of heat maps "
        "(rows: layers, columns: heads) with the tokens on both axes. BERT reads [CLS] text [SEP] "
        "(or a pair, [CLS] text [SEP] pair [SEP]) and attends both ways; GPT reads the text's tokens "
        "([CLS] text [SEP] for a fine-tuned GPT classifier) and attends to each token's own position and "
        "earlier ones. Layers and heads count from 1.",
    )
    p.add_argument("text", help="the text to look at")
    p.add_argument("pair", nargs="?", help="a second text, read as sentence B (BERT only)")
    p.add_argument("--pair", dest="pair_option", metavar="TEXT", help="the same as the second text")
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a run folder, its final/, a checkpoint, an import, an export, or a fine-tuned classifier "
        "or tagger",
    )
    p.add_argument("--out", type=Path, help="FILE.png for the grid of heat maps")
    p.add_argument("--layers", type=number_list, help="which layers, e.g. 1,2 or 3-4 (default: all)")
    p.add_argument("--heads", type=number_list, help="which heads, e.g. 1 or 1-4 (default: all)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the tokens and the weights as one JSON object (weights[layer][head][query][key]; each "
        "query's weights sum to 1)",
    )
    add_device_argument(p)
    p.set_defaults(handler=run_attention)


def add_plot_command(commands) -> None:
    p = commands.add_parser(
        "plot",
        help="draw several runs' held-out curves on one figure",
        description="Held-out loss and accuracy (MLM for BERT runs, next-token for GPT runs) of each run "
        "against the tokens it trained on and against minutes of training, one line per run labelled "
        "by its folder name.",
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="pretraining run folders")
    p.add_argument("--out", type=Path, required=True, help="FILE.png")
    p.set_defaults(handler=run_plot)


def number_list(text: str) -> list[int]:
    """'1,3-4' -> [1, 3, 4]: numbers from 1, single or as ranges."""
    numbers = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            if int(last or first) < int(first):
                raise argparse.ArgumentTypeError(
                    f"{text!r}: the range {part} runs backwards; write {last}-{first}"
                )
            numbers += range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers such as 1,2 or 3-4") from None
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: layers and heads count from 1")
    return numbers


def check_png(out: Path) -> None:
    if out.is_dir():
        raise BertforgeError(f"--out {out} is a folder; give a file name ending in .png")
    if out.suffix.lower() != ".png":
        raise BertforgeError(f"--out {out} must end in .png")


def chosen(numbers: list[int] | None, count: int, what: str) -> list[int]:
    """0-based indices of the 1-based `numbers` (all when None), refusing one the model lacks."""
    if numbers is None:
        return list(range(count))
    if max(numbers) > count:
        raise BertforgeError(f"the model has {count} {what}s; --{what}s {max(numbers)} does not exist")
    return [n - 1 for n in dict.fromkeys(numbers)]


def load_model_for_views(path: Path, device: str):
    """(model, tokenizer) of a model folder, BERT or GPT, pretrained or fine-tuned, on `device`."""
    from bertforge.folders import open_any_model
    from bertforge.runtime import resolve_device

    model, tokenizer = open_any_model(path)
    return model.to(resolve_device(device)), tokenizer


def run_attention(args) -> int:
    from bertforge.attention_view import attention_maps
    from bertforge.plots import attention_figure, save_png

    if args.out is None and not args.json:
        raise BertforgeError("give --out FILE.png, --json, or both")
    if args.out is not None:
        check_png(args.out)
    if args.pair is not None and args.pair_option is not None:
        raise BertforgeError("give the second text once: as an argument or with --pair")
    pair = args.pair if args.pair is not None else args.pair_option
    if pair is not None and not pair.strip():
        raise BertforgeError("the second text is empty; give one with words in it, or leave it out")
    model, tokenizer = load_model_for_views(args.model, args.device)
    maps = attention_maps(model, tokenizer, args.text, pair)
    layer_count, head_count = maps.weights.shape[:2]
    layers = chosen(args.layers, layer_count, "layer")
    heads = chosen(args.heads, head_count, "head")
    weights = maps.weights.numpy()
    if args.json:
        selected = weights[layers][:, heads].astype("float64").round(6).tolist()  # float32 prints noise
        numbers = {"layers": [n + 1 for n in layers], "heads": [n + 1 for n in heads]}
        print(json.dumps({"tokens": maps.tokens, **numbers, "causal": maps.causal, "weights": selected}))
    if args.out is not None:
        save_png(lambda: attention_figure(maps.tokens, weights, layers, heads), args.out, dpi=100)
    if args.out is not None and not args.json:  # with --json, stdout holds the JSON only
        kind = "causal (GPT)" if maps.causal else "bidirectional (BERT)"
        print(
            f"attention: {len(layers)} x {len(heads)} panels (layers x heads), {len(maps.tokens)} tokens, "
            f"{kind}, written to {args.out}"
        )
    return 0


def run_plot(args) -> int:
    from bertforge.plots import plot_runs

    check_png(args.out)
    curves = plot_runs(args.runs, args.out)
    for run in curves:
        note = (
            "  (tokens and minutes estimated: no token counts in its metrics.jsonl)" if run.estimated else ""
        )
        print(
            f"{run.label}: {run.objective} loss {run.loss[-1]:.4f}, accuracy {run.accuracy[-1]:.4f} "
            f"after {run.tokens[-1]:,.0f} tokens, {run.minutes[-1]:.1f} min of training "
            f"(evaluation left out){note}"
        )
    print(f"plot: {args.out}")
    return 0

"""Commands for using a model: `fill-mask`, `nsp`, `embed`, `showcase`, `generate`, `export` and
`import-hf`.

Each handler reads and checks its inputs, calls one function of `bertforge.infer`, `bertforge.generate`
or `bertforge.export` (those that read a model open it with `bertforge.folders`), and prints.
`generate` takes a GPT (pretrained with `--objective clm`), the others a BERT: the wrong kind of model
is refused with one line.
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from itertools import islice
from pathlib import Path

from bertforge.commands import add_device_argument, add_model_text_column_argument
from bertforge.config_rules import SEED, TEMPERATURE, Range, check_flags, count, trains_nsp
from bertforge.corpus import FORMATS
from bertforge.errors import BertforgeError
from bertforge.labeled import read_lines

MODEL_HELP = "a run folder, its final/, a checkpoint, an imported or an exported (Hugging Face) folder"
PROGRESS_FROM = 1000  # texts: below this, embed shows no progress bar
GENERATE_PROGRESS_FROM = 200  # new tokens: below this, generate shows no progress bar
WRONG_MODEL = {  # the objective a command needs -> why a model of the other kind is refused
    "mlm": "{model} holds a GPT (pretrained with --objective clm), which predicts the next token; "
    "`{command}` needs a BERT: continue a text with `bertforge generate --model {model} TEXT`",
    "clm": "{model} holds a BERT, which fills masked tokens; `{command}` needs a GPT (pretrained with "
    "--objective clm): ask this one with `bertforge fill-mask`",
}
SHOWCASE_DOCUMENTS = 5000  # documents read from the corpus, at most
NUMBER_FLAGS = {  # the range of each command's number flags, checked before its model loads
    "fill-mask": {"--batch-size": count(), "--top-k": count()},
    "nsp": {"--batch-size": count()},
    "embed": {"--batch-size": count()},
    "showcase": {"--batch-size": count(), "--sentences": count(), "--seed": SEED},
    "generate": {
        "--max-new-tokens": count(0),
        "--temperature": TEMPERATURE,
        "--top-k": count(0),
        "--top-p": Range(0.0, 1.0, low_open=True),
        "--seed": SEED,
    },
}


def register(commands) -> None:
    add_fill_mask_command(commands)
    add_nsp_command(commands)
    add_embed_command(commands)
    add_showcase_command(commands)
    add_generate_command(commands)
    add_export_command(commands)
    add_import_command(commands)


def add_model_arguments(p) -> None:
    p.add_argument("--model", type=Path, required=True, help=MODEL_HELP)
    add_device_argument(p)
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass")


def add_fill_mask_command(commands) -> None:
    p = commands.add_parser(
        "fill-mask",
        help="predict the tokens hidden behind [MASK]",
        description="The most likely tokens for every [MASK] of a text (each mask predicted from the same "
        "input), whole words shown with their ## pieces joined. Texts longer than the model's maximum "
        "length are refused.",
    )
    p.add_argument("text", nargs="?", help='a text with one or more [MASK], e.g. "the [MASK] sat on the mat"')
    p.add_argument("--input", type=Path, help="a file with one text per line, instead of TEXT")
    p.add_argument(
        "--top-k",
        type=int,
        default=5,
        help="predictions per mask (no special token, nor a ## piece where a word starts)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per text")
    add_model_arguments(p)
    p.set_defaults(handler=run_fill_mask)


def add_nsp_command(commands) -> None:
    p = commands.add_parser(
        "nsp",
        help="probability that sentence B follows sentence A",
        description="Next sentence prediction: the probability that B follows A. Pairs longer than the "
        "model's maximum length are refused.",
    )
    p.add_argument("a", nargs="?", help="sentence A")
    p.add_argument("b", nargs="?", help="sentence B")
    p.add_argument("--input", type=Path, help="a TSV file: one pair per line, A<TAB>B, instead of A B")
    p.add_argument("--json", action="store_true", help="one JSON object per pair")
    add_model_arguments(p)
    p.set_defaults(handler=run_nsp)


def add_embed_command(commands) -> None:
    p = commands.add_parser(
        "embed",
        help="one vector per line of a file, saved as .npy",
        description="Embed each line of --input (one text per line) and save a float32 (lines, hidden) "
        "array. Texts longer than the model's maximum length are truncated, with a warning.",
    )
    p.add_argument("--input", type=Path, required=True, help="one text per line")
    p.add_argument("--out", type=Path, required=True, help="FILE.npy")
    p.add_argument(
        "--pooling",
        choices=("cls", "mean"),
        default="cls",
        help="the [CLS] state (default), or the mean over real tokens",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_arguments(p)
    p.set_defaults(handler=run_embed)


def add_showcase_command(commands) -> None:
    p = commands.add_parser(
        "showcase",
        help="show what a model learned on a few sentences of a text",
        description="For a few sentences of a corpus (a seeded choice): one content word masked and the "
        "top-5 predictions beside the true word, and the NSP probability of the true next sentence and "
        "of a random one.",
    )
    p.add_argument("--corpus", type=Path, required=True, help="text to draw sentences from (held-out text)")
    p.add_argument("--format", default="auto", choices=FORMATS)
    add_model_text_column_argument(p)
    p.add_argument("--sentences", type=int, default=5, help="how many sentences")
    p.add_argument("--seed", type=int, default=0)
    add_model_arguments(p)
    p.set_defaults(
        handler=run_showcase, setting_flags={"data.format": "--format", "data.text_column": "--text-column"}
    )


def add_generate_command(commands) -> None:
    p = commands.add_parser(
        "generate",
        help="continue a text with a GPT model (pretrained with --objective clm)",
        description="Continue the prompt one token at a time until [SEP] (the end of a document) or "
        "--max-new-tokens: by default a draw from the softmax after temperature, top-k and top-p "
        "filtering (Hugging Face's order), with --greedy the most likely token (the tokens of "
        "transformers' generate(do_sample=False) on the exported model, as long as the text is within "
        "the length the model was trained on; past it, each token is predicted from the last that many).",
    )
    p.add_argument("prompt", help="the text to continue")
    p.add_argument("--model", type=Path, required=True, help=MODEL_HELP)
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to add at most (default 50)")
    p.add_argument("--greedy", action="store_true", help="always the most likely token (no sampling)")
    p.add_argument("--temperature", type=float, default=1.0, help="below 1: safer, above 1: bolder")
    p.add_argument(
        "--top-k",
        type=int,
        default=50,
        help="draw among the k most likely tokens (default 50, as transformers; 0: all)",
    )
    p.add_argument(
        "--top-p", type=float, default=1.0, help="draw among the most likely tokens holding p (1: all)"
    )
    p.add_argument("--seed", type=int, help="repeat a draw exactly (on the same device)")
    p.add_argument("--json", action="store_true", help="one JSON object: the text and the token ids")
    p.add_argument(
        "--quiet", action="store_true", help=f"no progress bar (shown from {GENERATE_PROGRESS_FROM} tokens)"
    )
    add_device_argument(p)
    p.set_defaults(handler=run_generate)


def add_export_command(commands) -> None:
    p = commands.add_parser(
        "export",
        help="write a model as a Hugging Face folder",
        description="Write a folder that transformers loads with no custom code: config.json, "
        "model.safetensors, tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json; "
        "for bertforge, which reads it back, the run's and the tokenizer's settings (bertforge_config.json, "
        "bertforge_tokenizer.json) and a classifier's labels.json. "
        'A tagger becomes a BertForTokenClassification for pipeline("token-classification"). '
        'A GPT (--objective clm) becomes an OpenAIGPTLMHeadModel for pipeline("text-generation"), a '
        "classifier fine-tuned from one an OpenAIGPTForSequenceClassification. A regression model "
        '(fine-tuned on real-valued labels) has num_labels = 1 and problem_type = "regression".',
    )
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a run folder, its final/, a checkpoint, a classifier or a tagger",
    )
    p.add_argument("--out", type=Path, required=True, help="a new folder")
    p.set_defaults(handler=run_export)


def add_import_command(commands) -> None:
    p = commands.add_parser(
        "import-hf",
        help="turn a local Hugging Face BERT or OpenAIGPT folder into a bertforge model",
        description="Read a local Hugging Face BERT folder (config.json; model.safetensors or "
        "pytorch_model.bin; tokenizer.json or vocab.txt), or an OpenAIGPT one with either weights file and "
        "a WordPiece tokenizer.json (as `bertforge export` writes), and write a bertforge model folder, to "
        "continue pretraining from it with `bertforge pretrain --init`.",
    )
    p.add_argument("--from", dest="source", type=Path, required=True, help="the Hugging Face folder")
    p.add_argument("--out", type=Path, required=True, help="a new folder")
    p.set_defaults(handler=run_import)


HEADS_READ = {"fill-mask": ("mlm",), "nsp": ("nsp",), "showcase": ("mlm",)}  # refused where untrained


def load_on_device(args, objective: str = "mlm"):
    """(model, tokenizer, config) from --model, moved to --device; refused unless its `model.objective`
    is `objective` (a BERT, "mlm", or a GPT, "clm")."""
    from bertforge.folders import open_pretrained
    from bertforge.runtime import resolve_device

    check_flags(args, NUMBER_FLAGS[args.command])
    device = resolve_device(args.device)
    model, tokenizer, config = open_pretrained(args.model, HEADS_READ.get(args.command, ()))
    if config.model.objective != objective:
        raise BertforgeError(WRONG_MODEL[objective].format(model=args.model, command=args.command))
    return model.to(device), tokenizer, config


def texts_from(args, what: str) -> list[str]:
    if (args.input is None) == (args.text is None):
        raise BertforgeError(f"give either a text or --input FILE ({what})")
    return [args.text] if args.input is None else read_lines(args.input, what)


def run_fill_mask(args) -> int:
    from bertforge.infer import fill_mask

    texts = texts_from(args, "one text with [MASK] per line")
    model, tokenizer, _ = load_on_device(args)
    results = fill_mask(model, tokenizer, texts, top_k=args.top_k, batch_size=args.batch_size)
    for text, masks in zip(texts, results, strict=True):
        if args.json:
            print(json.dumps({"text": text, "masks": masks}))
            continue
        print(text)
        for number, predictions in enumerate(masks, 1):
            if len(masks) > 1:
                print(f"  [MASK] {number}:")
            width = max(len(p["word"]) for p in predictions)
            for p in predictions:
                print(f"    {p['score']:.4f}  {p['word']:<{width}}  {p['sequence']}")
    return 0


def run_nsp(args) -> int:
    from bertforge.infer import next_sentence

    pairs = nsp_pairs(args)
    model, tokenizer, config = load_on_device(args)
    if not trains_nsp(config):
        raise BertforgeError(
            f"{args.model} was pretrained without next sentence prediction (data.nsp = false): its NSP head "
            "is untrained; ask a model pretrained with it (data.nsp = true, the default)"
        )
    if not config.data.nsp:
        print(
            f"bertforge: warning: {args.model} trained its NSP head only on the "
            f"{config.data.warmup_seq_length}-token pairs of its sequence-length warmup (data.warmup_nsp); "
            "longer pairs are new to it",
            file=sys.stderr,
        )
    firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
    probabilities = next_sentence(model, tokenizer, firsts, seconds, batch_size=args.batch_size)
    for (a, b), p in zip(pairs, probabilities, strict=True):
        if args.json:
            print(json.dumps({"a": a, "b": b, "is_next": p}))
        else:
            print(f"{p:.4f}  P(B follows A)   A: {a}   B: {b}")
    return 0


def nsp_pairs(args) -> list[tuple[str, str]]:
    if args.input is not None:
        if args.a is not None:
            raise BertforgeError("give either two sentences or --input FILE, not both")
        pairs = []
        for number, line in enumerate(read_lines(args.input, "one A<TAB>B pair per line"), 1):
            parts = line.split("\t")
            if len(parts) != 2:
                raise BertforgeError(
                    f"line {number} of {args.input} has {len(parts) - 1} tabs; write A<TAB>B with one tab"
                )
            pairs.append((parts[0], parts[1]))
        return pairs
    if args.a is None or args.b is None:
        raise BertforgeError('give two sentences, "A" "B", or --input FILE with A<TAB>B lines')
    return [(args.a, args.b)]


def run_embed(args) -> int:
    import numpy as np

    from bertforge.infer import embed
    from bertforge.io import atomic_write_bytes, sole_writer

    if args.out.is_dir():
        raise BertforgeError(f"--out {args.out} is a folder; give a file name ending in .npy")
    if args.out.suffix != ".npy":
        raise BertforgeError(f"--out {args.out} must end in .npy (a NumPy array file)")
    texts = read_lines(args.input, "one text per line")
    with sole_writer(args.out):
        model, tokenizer, _ = load_on_device(args)
        show_progress = not args.quiet and len(texts) >= PROGRESS_FROM
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vectors = embed(
                model, tokenizer, texts, args.pooling, args.batch_size, show_progress=show_progress
            )
        for warning in caught:
            print(f"bertforge: warning: {warning.message}", file=sys.stderr)
        buffer = io.BytesIO()
        np.save(buffer, vectors)
        atomic_write_bytes(args.out, buffer.getvalue())
    print(
        f"embeddings: {vectors.shape[0]} x {vectors.shape[1]} ({args.pooling} pooling) written to {args.out}"
    )
    return 0


def run_showcase(args) -> int:
    from bertforge.corpus import read_documents
    from bertforge.infer import showcase
    from bertforge.progress import plural

    model, tokenizer, config = load_on_device(args)
    column = args.text_column or config.data.text_column
    documents = list(islice(read_documents(args.corpus, args.format, text_column=column), SHOWCASE_DOCUMENTS))
    examples = showcase(
        model, tokenizer, documents, count=args.sentences, seed=args.seed, batch_size=args.batch_size
    )
    sentences = f"{len(examples):,} {plural('sentence', len(examples))}"
    if len(examples) < args.sentences:
        fit = "a next sentence, a content word to mask, within the model's length"
        print(
            f"note: {args.corpus.name} has {sentences} that fit ({fit}) in the documents "
            f"read (at most {SHOWCASE_DOCUMENTS:,}), not {args.sentences:,}\n"
        )
    print(f"fill-mask: one word of each of {sentences} of {args.corpus.name} masked, top-5 predictions")
    hits = 0
    for example in examples:
        hits += example["hit"]
        guesses = ", ".join(f"{p['word']!r} {p['score']:.2f}" for p in example["predictions"])
        print(f"  {example['masked']}")
        print(f"    true: {example['answer']:<14} {'HIT ' if example['hit'] else 'miss'}  top-5: {guesses}")
    print(f"  the true word is in the top 5 for {hits} of {sentences}")
    if "p_next" not in examples[0]:
        never_trained = "nsp" in model.untrained_heads
        why = "the model's NSP head never trained" if never_trained else "the text has one document"
        print(f"\nnext sentence prediction left out: {why}")
    else:
        print("\nnext sentence prediction: P(B follows A), for the true next sentence and a random one")
        for example in examples:
            p_next, p_random, a = example["p_next"], example["p_random"], example["sentence"]
            a = a if len(a) <= 70 else a[:67] + "..."
            print(f"  true next {p_next:.2f}   random {p_random:.2f}   A: {a}")
        above = sum(example["p_next"] > example["p_random"] for example in examples)
        print(f"  the true next sentence scored above the random one for {above} of {sentences}")
    return 0


def run_generate(args) -> int:
    import torch

    from bertforge.generate import generate
    from bertforge.model import reading_length

    if args.temperature == 0:  # a common way to ask for the most likely tokens
        if not args.greedy:
            raise BertforgeError("--temperature must be above 0; for the most likely tokens, give --greedy")
        args.temperature = 1.0  # greedy decoding reads no temperature
    model, tokenizer, config = load_on_device(args, objective="clm")
    prompt = tokenizer.encode_batch([args.prompt])[0]
    if not prompt:
        raise BertforgeError("the prompt is empty (it has no tokens); give some text to continue")
    if unknown := prompt.count(tokenizer.unk_id):
        print(
            f"bertforge: warning: {unknown} of the prompt's {len(prompt)} tokens are unknown to the "
            "tokenizer: the model reads [UNK] in their place",
            file=sys.stderr,
        )
    ids = generate(
        model,
        torch.tensor(prompt, device=next(model.parameters()).device),
        args.max_new_tokens,
        do_sample=not args.greedy,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        eos_token_id=tokenizer.sep_id,
        window=reading_length(model),  # positions past it were never trained
        vocab_size=tokenizer.vocab_size,
        show_progress=not args.quiet and args.max_new_tokens >= GENERATE_PROGRESS_FROM,
    ).tolist()
    # The prompt as typed, then what the model added (as Hugging Face's text-generation pipeline shows it);
    # a prompt that decodes to nothing (all [UNK]) gets a space before the first new word.
    shown_prompt = tokenizer.decode(prompt, skip_special_tokens=True)
    added = tokenizer.decode(ids, skip_special_tokens=True)[len(shown_prompt) :]
    text = args.prompt.rstrip() + (" " if added and not shown_prompt else "") + added
    if args.json:
        print(
            json.dumps(
                {"prompt": args.prompt, "text": text, "token_ids": ids, "new_tokens": len(ids) - len(prompt)}
            )
        )
    else:
        print(text)
    return 0


def run_export(args) -> int:
    from bertforge.export import export_model

    result = export_model(args.model, args.out)
    print(f"exported {result['architecture']} to {args.out}")
    print(f"  transformers: {result['architecture']}.from_pretrained({str(args.out)!r})")
    if result.get("untrained"):
        print(
            f"  untrained heads ({', '.join(result['untrained'])}): their outputs are noise "
            "(untrained_heads.json says so)"
        )
    return 0


def run_import(args) -> int:
    from bertforge.export import import_hf

    result = import_hf(args.source, args.out)
    print(f"imported {args.source} to {args.out}")
    if result["initialised"]:
        print(f"  not in the source, drawn fresh: {', '.join(result['initialised'])}")
    if result["untrained"]:
        print(
            f"  untrained heads ({', '.join(result['untrained'])}): commands that read them refuse the folder"
        )
    if result["dropped"]:
        print(f"  fine-tuning heads left out: {', '.join(result['dropped'])}")
    print(f"  continue pretraining: bertforge pretrain --init {args.out} --corpus TEXT --out RUN")
    return 0

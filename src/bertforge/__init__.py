"""bertforge: pretrain BERT from scratch on your own text."""

__version__ = "0.1.0"


def load(path):
    """`(model, tokenizer)` from a run folder, its `final/`, a checkpoint, an imported model or an
    exported Hugging Face folder (see `bertforge.folders`); the model is a
    `bertforge.model.BertForPreTraining`, for `bertforge.infer` (a GPT's: `bertforge.gpt.GPTLMHeadModel`,
    for `bertforge.generate`), on the CPU in eval mode (move it with `.to("cuda")`).

    >>> model, tokenizer = bertforge.load("runs/mini")
    """
    from bertforge.folders import open_pretrained  # here, so that `import bertforge` stays light

    model, tokenizer, _ = open_pretrained(path)
    return model, tokenizer

"""Token classification's part of fine-tuning: the tagged task's data, its loss and its scores.

`bertforge.finetune` runs a tagged task (`--task ner`, or a file `bertforge.tagged.is_tagged_file`
recognises) through the same job, loop and evaluation as a classification; this module supplies
what differs:
- the data: both files read (`bertforge.tagged`), the tag set learned from the training file,
  every sentence split into pieces and windows with the tag on each word's first piece
  (`bertforge.alignment`);
- the loss: cross-entropy over the labelled pieces (one per word; `NO_LABEL` elsewhere), summed
  and divided by their number, as Hugging Face's `BertForTokenClassification`;
- the scores after every epoch: the windows' predictions put back together into sentences and
  scored by entity (`bertforge.entities`: exact span and type, per type and overall).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bertforge.alignment import encode_words, regroup, sentence_pieces
from bertforge.batches import in_input_order
from bertforge.entities import entity_scores
from bertforge.losses import NO_LABEL, Summary
from bertforge.tagged import TaggedExamples, read_tagged, tag_ids, tag_names
from bertforge.tokenizer import BertTokenizer

LOSS = "tagging_loss"


@dataclass
class TaggedSet:
    """One file's windows (the examples trained on or evaluated, in file order) and, per sentence,
    its words' tag ids."""

    examples: list[dict]
    tags: list[list[int]]

    @property
    def lengths(self) -> list[int]:
        return [len(tags) for tags in self.tags]


def read_tagged_task(
    train: str, valid: str, token_column: str | None, tag_column: str | None
) -> tuple[TaggedExamples, TaggedExamples, list[str]]:
    """Both files, read and checked, and the tag set of the training file (validation tags outside
    it are refused, naming their line)."""
    train_data = read_tagged(train, token_column, tag_column)
    valid_data = read_tagged(valid, token_column, tag_column)
    names = tag_names(train_data)
    tag_ids(valid_data, names)
    return train_data, valid_data, names


def encode_tagged(
    tokenizer: BertTokenizer, data: TaggedExamples, names: list[str], max_length: int
) -> TaggedSet:
    """Every sentence of `data` as windows of at most `max_length` tokens, tags on first pieces."""
    ids = tag_ids(data, names)
    examples = []
    for words, tags in zip(sentence_pieces(tokenizer, data.sentences), ids, strict=True):
        examples += encode_words(tokenizer, words, max_length, tags)
    return TaggedSet(examples, ids)


def tagging_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(
        batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch.get("attention_mask")
    ).float()  # (B, T, K)
    labels = batch["labels"]  # (B, T), NO_LABEL but at first pieces
    labelled = labels != NO_LABEL
    loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=NO_LABEL, reduction="sum")
    count = labelled.sum()
    sums = {
        "loss_sum": loss_sum.detach(),
        "correct": ((logits.argmax(-1) == labels) & labelled).sum(),
        "count": count,
    }
    return loss_sum / count.clamp(min=1), sums


def summarize_tagging(totals: dict[str, float]) -> Summary:
    """Accumulated `tagging_loss` sums -> the mean cross-entropy per word, and it with the words'
    tag accuracy."""
    count = max(totals["count"], 1.0)
    loss = totals["loss_sum"] / count
    return Summary(loss, {LOSS: loss, "accuracy": totals["correct"] / count})


@torch.inference_mode()
def score_tagging(
    outputs: Iterable[tuple[torch.Tensor, torch.Tensor]],
    order: Sequence[int],
    truth: list[list[int]],
    names: list[str],
) -> tuple[dict[str, float], dict, list[list[int]]]:
    """From a model's (logits (B, T, K), labels (B, T)) over a set's windows, batched in `order`
    (the file index of each window as the rows come): the loss, entity precision, recall and F1 and
    word accuracy; the scores per entity type; and each sentence's predicted tag ids (read at its
    words' first pieces, the labelled positions)."""
    loss_sum, count, windows = 0.0, 0, []
    for logits, labels in outputs:
        labelled = labels != NO_LABEL
        loss_sum += float(F.cross_entropy(logits[labelled], labels[labelled], reduction="sum"))
        count += int(labelled.sum())
        predicted, labelled = logits.argmax(-1).cpu(), labelled.cpu()  # one copy, not one per row
        windows += [row[at].tolist() for row, at in zip(predicted, labelled, strict=True)]
    flat = [tag for window in in_input_order(windows, order) for tag in window]
    sentences = regroup(flat, [len(tags) for tags in truth])
    scores = entity_scores(
        [[names[i] for i in tags] for tags in truth], [[names[i] for i in tags] for tags in sentences]
    )
    per_type = scores.pop("per_type")
    return {LOSS: loss_sum / max(count, 1), **scores}, per_type, sentences

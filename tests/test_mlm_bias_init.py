"""`train.mlm_bias_init = "unigram"`: the MLM output bias starts at the corpus's log token frequencies."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import HF_TINY_SIZES, metrics_lines, tiny_config

from bertforge.config import ModelConfig
from bertforge.model import BertForPreTraining
from bertforge.pretrain import init_mlm_bias, pretrain


def test_bias_holds_the_smoothed_log_frequencies():
    model = BertForPreTraining(ModelConfig(**HF_TINY_SIZES))  # 99 tokens, ids 0-4 special
    tokens = np.array([5] * 60 + [6] * 30 + [7] * 9 + [2, 3], dtype=np.uint16)
    shards = SimpleNamespace(tokens=tokens, num_tokens=len(tokens), vocab_size=99)
    init_mlm_bias(model, shards, (0, 1, 2, 3, 4))
    bias = model.cls.predictions.bias.detach().double()
    total = 99 + 0.5 * 99  # 99 non-special occurrences, plus half a count for each of the 99 ids
    assert bias[5].item() == pytest.approx(math.log(60.5 / total))
    assert bias[7].item() == pytest.approx(math.log(9.5 / total))
    assert bias[2].item() == bias[50].item() == pytest.approx(math.log(0.5 / total))  # special = unseen
    assert torch.softmax(bias, 0).sum().item() == pytest.approx(1.0)
    # The decoder shares the bias, so the logits of a zero hidden state are the prior itself.
    assert torch.equal(model.cls.predictions.decoder.bias, model.cls.predictions.bias)


def test_a_run_starts_from_the_unigram_loss_not_from_log_vocabulary(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir
):
    losses = {}
    for init in ("zero", "unigram"):
        config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=1, eval_every=1)
        config.train.mlm_bias_init = init
        pretrain(config, tmp_path / init, tokenizer_dir=small_tokenizer_dir, show_progress=False)
        first = metrics_lines(tmp_path / init)[0]
        assert first["step"] == 0 and first["split"] == "valid"
        losses[init] = first["mlm_loss"]
    assert losses["zero"] == pytest.approx(math.log(2000), abs=0.1)  # uniform over the vocabulary
    assert losses["unigram"] < losses["zero"] - 1.0  # the frequencies alone are worth more than a nat

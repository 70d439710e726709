"""Dynamic MLM masking and padding: rates, 80/10/10, specials, caps, whole words, reproducibility,
frequency-weighted choice of what to mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.batches import pad_batch
from bertforge.config import RunConfig, apply_objective, validate
from bertforge.errors import BertforgeError
from bertforge.masking import MaskingCollator, subsampling_weights

VOCAB = 1000
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = [PAD, UNK, CLS, SEP, MASK]
FIRST_CONTINUATION = 600  # ids 600.. are '##' pieces in the whole-word tests
CONTINUATION = np.arange(VOCAB) >= FIRST_CONTINUATION


def make_examples(count=600, max_len=128, seed=0, words=False) -> list[dict]:
    """[CLS] A [SEP] B [SEP] examples of various lengths, with a few [UNK]s inside."""
    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(count):
        length = int(rng.integers(8, max_len + 1))
        body = length - 3
        if words:  # heads below FIRST_CONTINUATION followed by 0-3 '##' pieces
            pieces: list[int] = []
            while len(pieces) < body:
                pieces.append(int(rng.integers(5, FIRST_CONTINUATION)))
                pieces.extend(rng.integers(FIRST_CONTINUATION, VOCAB, int(rng.integers(0, 4))).tolist())
            ids = np.array(pieces[:body])
        else:
            ids = rng.integers(5, VOCAB, body)
        ids[rng.random(body) < 0.02] = UNK
        len_a = int(rng.integers(1, body))
        input_ids = np.concatenate([[CLS], ids[:len_a], [SEP], ids[len_a:], [SEP]]).astype(np.int64)
        types = np.concatenate([np.zeros(len_a + 2), np.ones(body - len_a + 1)]).astype(np.int64)
        examples.append(
            {"input_ids": input_ids, "token_type_ids": types, "nsp_label": int(rng.integers(0, 2))}
        )
    return examples


def collator(**kwargs) -> MaskingCollator:
    return MaskingCollator(VOCAB, pad_id=PAD, mask_id=MASK, special_ids=SPECIALS, **kwargs)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def original_batch(examples: list[dict]) -> dict[str, torch.Tensor]:
    return pad_batch(examples, PAD)


def candidate_mask(original: dict[str, torch.Tensor]) -> torch.Tensor:
    ids = original["input_ids"]
    is_special = torch.isin(ids, torch.tensor(SPECIALS))
    return original["attention_mask"].bool() & ~is_special  # (B, T)


@pytest.fixture(scope="module")
def examples() -> list[dict]:
    return make_examples()


def test_padding_and_attention_mask(examples):
    batch = collator()(examples[:5], generator=seeded(0))
    lengths = [len(e["input_ids"]) for e in examples[:5]]
    assert batch["input_ids"].shape == (5, max(lengths))
    for name in ("input_ids", "token_type_ids", "attention_mask", "nsp_labels", "masked_positions"):
        assert batch[name].dtype == torch.long
    for row, length in enumerate(lengths):
        assert (batch["attention_mask"][row, :length] == 1).all()
        assert (batch["attention_mask"][row, length:] == 0).all()
        assert (batch["input_ids"][row, length:] == PAD).all()
        assert (batch["token_type_ids"][row, length:] == 0).all()
        types = torch.from_numpy(examples[row]["token_type_ids"])
        assert (batch["token_type_ids"][row, :length] == types).all()
    assert batch["nsp_labels"].tolist() == [e["nsp_label"] for e in examples[:5]]
    plain = collator()([{"input_ids": np.array([CLS, 7, SEP])}], generator=seeded(0))
    assert plain["nsp_labels"].tolist() == [-1] and plain["token_type_ids"].tolist() == [[0, 0, 0]]


@pytest.mark.parametrize("probability", [0.15, 0.3])
def test_rates_and_80_10_10(examples, probability):
    original = original_batch(examples)
    batch = collator(mlm_probability=probability, max_predictions=64)(examples, generator=seeded(1))
    candidates = candidate_mask(original)
    positions, labels = batch["masked_positions"], batch["masked_labels"]
    assert (positions[1:] > positions[:-1]).all()  # sorted, no repeats
    flat_original = original["input_ids"].view(-1)
    assert (labels == flat_original[positions]).all()
    assert candidates.view(-1)[positions].all()  # never a special token or padding
    assert abs(positions.numel() / candidates.sum().item() - probability) <= 0.01
    # Per sequence exactly k = min(cap, max(1, round(p * n))) positions.
    per_row = torch.bincount(positions // original["input_ids"].shape[1], minlength=len(examples))
    n = candidates.sum(1)
    expected = torch.tensor([min(64, max(1, round(probability * int(c)))) for c in n])
    assert (per_row == expected).all()
    new = batch["input_ids"].view(-1)[positions]
    is_mask = new == MASK
    unchanged = new == labels
    is_random = ~is_mask & ~unchanged
    assert abs(is_mask.float().mean().item() - 0.8) <= 0.02
    assert abs(unchanged.float().mean().item() - 0.1) <= 0.02
    assert abs(is_random.float().mean().item() - 0.1) <= 0.02
    assert not torch.isin(new[is_random], torch.tensor(SPECIALS)).any()  # random ids are ordinary
    # Every position that was not chosen keeps its id.
    untouched = torch.ones_like(flat_original, dtype=torch.bool)
    untouched[positions] = False
    assert (batch["input_ids"].view(-1)[untouched] == flat_original[untouched]).all()
    assert (batch["attention_mask"] == original["attention_mask"]).all()


def test_cap_on_predictions(examples):
    original = original_batch(examples)
    batch = collator(max_predictions=5)(examples, generator=seeded(2))
    rows = batch["masked_positions"] // original["input_ids"].shape[1]
    per_row = torch.bincount(rows, minlength=len(examples))
    assert per_row.max().item() == 5 and per_row.min().item() >= 1


def test_positions_are_uniform_over_candidates():
    example = make_examples(count=1, max_len=40, seed=3)[0]
    original = original_batch([example] * 4000)
    batch = collator()([example] * 4000, generator=seeded(3))
    width = original["input_ids"].shape[1]
    counts = torch.bincount(batch["masked_positions"] % width, minlength=width).float()  # (T,)
    rates = counts[candidate_mask(original)[0]] / 4000
    assert (rates - rates.mean()).abs().max() < 0.03


def test_same_seed_same_batch_different_seed_differs(examples):
    masker = collator()
    first = masker(examples[:64], generator=seeded(11))
    again = masker(examples[:64], generator=seeded(11))
    other = masker(examples[:64], generator=seeded(12))
    for name in first:
        assert torch.equal(first[name], again[name])
    assert not torch.equal(first["masked_positions"], other["masked_positions"])
    # The collator does not modify its inputs.
    assert (examples[0]["input_ids"] == make_examples()[0]["input_ids"]).all()


def test_whole_word_masking_masks_whole_words_within_the_cap():
    examples = make_examples(count=400, seed=4, words=True)
    # An orphan '##' piece right after [SEP] is a word of its own.
    examples[0]["input_ids"][examples[0]["input_ids"].tolist().index(SEP) + 1] = FIRST_CONTINUATION + 1
    original = original_batch(examples)
    cap = 20
    masker = collator(whole_word_mask=True, continuation_mask=CONTINUATION, max_predictions=cap)
    batch = masker(examples, generator=seeded(5))
    width = original["input_ids"].shape[1]
    masked = torch.zeros(len(examples) * width, dtype=torch.bool)
    masked[batch["masked_positions"]] = True
    masked = masked.view(len(examples), width).numpy()
    candidates = candidate_mask(original).numpy()
    ids = original["input_ids"].numpy()
    total_masked = total_k = 0
    for row in range(len(examples)):
        words, current = [], None
        for t in range(width):
            if not candidates[row, t]:
                current = None
                continue
            if current is None or ids[row, t] < FIRST_CONTINUATION:
                current = []
                words.append(current)
            current.append(t)
        k = min(cap, max(1, round(0.15 * int(candidates[row].sum()))))
        chosen = sum(len(w) for w in words if masked[row, w].all())
        assert all(masked[row, w].all() or not masked[row, w].any() for w in words)  # whole words only
        assert masked[row].sum() == chosen <= k
        # Google's walk skips only words that no longer fit: every word left out is too long.
        assert all(len(w) > k - chosen for w in words if not masked[row, w].any())
        total_masked, total_k = total_masked + chosen, total_k + k
    assert total_masked / total_k > 0.95
    assert (batch["masked_labels"] == original["input_ids"].view(-1)[batch["masked_positions"]]).all()
    assert candidates.reshape(-1)[batch["masked_positions"].numpy()].all()
    multi_token = batch["masked_labels"] >= FIRST_CONTINUATION
    assert multi_token.any()


def test_whole_word_masking_needs_the_continuation_mask():
    with pytest.raises(BertforgeError, match="continuation"):
        collator(whole_word_mask=True)
    with pytest.raises(BertforgeError, match="continuation_mask"):
        collator(whole_word_mask=True, continuation_mask=np.zeros(10, dtype=bool))


def test_sequence_without_candidates_masks_nothing():
    batch = collator()([{"input_ids": np.array([CLS, SEP, SEP])}, {"input_ids": np.array([CLS, 9, SEP])}])
    assert batch["masked_positions"].tolist() == [4]  # row 1, position 1 (B*T flat index)
    assert batch["masked_labels"].tolist() == [9]


def test_invalid_settings_are_refused_by_the_config():
    config = RunConfig()
    config.data.mlm_probability = 0.0
    with pytest.raises(BertforgeError, match="mlm_probability"):
        validate(config)
    config = RunConfig()
    config.data.mask_subsampling = 1.0
    with pytest.raises(BertforgeError, match="mask_subsampling"):
        validate(config)
    config.data.mask_subsampling = 1e-4
    validate(config)
    apply_objective(config, "clm")
    with pytest.raises(BertforgeError, match="masks nothing"):
        validate(config)
    with pytest.raises(AssertionError):  # the collator trusts a validated config
        collator(mlm_probability=0.0)
    with pytest.raises(AssertionError):
        collator(max_predictions=0)


def test_subsampling_weights_follow_word2vec():
    counts = np.array([0, 500, 300, 150, 40, 10], dtype=np.int64)  # frequencies 0, .5, .3, .15, .04, .01
    weights = subsampling_weights(counts, 0.05)
    expected = [1.0, np.sqrt(0.05 / 0.5), np.sqrt(0.05 / 0.3), np.sqrt(0.05 / 0.15), 1.0, 1.0]
    assert np.allclose(weights, expected)


def test_weighted_masking_draws_in_proportion_to_the_weights():
    # Each row: 30 copies of a frequent token (weight 0.05) and 30 distinct ones (weight 1); k = 18.
    frequent, rare = 7, np.arange(100, 130)
    row = np.concatenate([[CLS], np.full(30, frequent), rare, [SEP]]).astype(np.int64)
    rows = [{"input_ids": row, "nsp_label": 0}] * 3000
    weights = np.ones(VOCAB)
    weights[frequent] = 0.05
    batch = collator(mlm_probability=0.3, max_predictions=60, token_weights=weights)(rows, seeded(8))
    per_row = torch.bincount(batch["masked_positions"] // len(row), minlength=len(rows))
    assert (per_row == 18).all()  # the weights choose what, not how many
    share = (batch["masked_labels"] == frequent).double().mean().item()
    # The same draw without replacement by numpy's successive sampling: 18 of 60, p proportional to w.
    rng = np.random.default_rng(0)
    p = np.concatenate([np.full(30, 0.05), np.ones(30)])
    expected = np.mean([(rng.choice(60, 18, replace=False, p=p / p.sum()) < 30).mean() for _ in range(3000)])
    assert 0.03 < expected < 0.15  # far from the 0.5 of uniform masking
    assert abs(share - expected) < 0.01
    unweighted = collator(mlm_probability=0.3, max_predictions=60)(rows, seeded(8))
    assert abs((unweighted["masked_labels"] == frequent).double().mean().item() - 0.5) < 0.02


def test_weighted_whole_word_masking_weighs_a_word_by_its_head():
    examples = make_examples(count=400, seed=6, words=True)
    weights = np.ones(VOCAB)
    weights[5:300] = 0.01  # words whose head is below 300 are rarely chosen
    masker = collator(whole_word_mask=True, continuation_mask=CONTINUATION, token_weights=weights)
    batch = masker(examples, generator=seeded(7))
    heads = batch["masked_labels"][batch["masked_labels"] < FIRST_CONTINUATION]
    assert (heads < 300).double().mean().item() < 0.1  # uniform: about half
    # A masked '##' piece comes with its word: the candidate before it (its head or a piece) is masked too.
    original = original_batch(examples)
    ids, candidates = original["input_ids"].view(-1), candidate_mask(original).view(-1)
    masked = set(batch["masked_positions"].tolist())
    for position in masked:
        if ids[position] >= FIRST_CONTINUATION and candidates[position - 1]:
            assert position - 1 in masked


def test_token_weights_must_match_the_vocabulary():
    with pytest.raises(BertforgeError, match="token_weights"):
        collator(token_weights=np.ones(10))
    with pytest.raises(BertforgeError, match="positive"):
        collator(token_weights=np.zeros(VOCAB))

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


def word_row(lengths: list[int]) -> tuple[np.ndarray, list[list[int]]]:
    """[CLS] words [SEP], each word a distinct head and `length - 1` distinct '##' pieces; the row and
    each word's token positions."""
    ids, words, head, piece = [CLS], [], 5, FIRST_CONTINUATION
    for length in lengths:
        words.append(list(range(len(ids), len(ids) + length)))
        ids += [head] + list(range(piece, piece + length - 1))
        head, piece = head + 1, piece + length - 1
    return np.array([*ids, SEP], dtype=np.int64), words


def google_walk(lengths: list[int], k: int, draws: int, seed: int) -> np.ndarray:
    """How often each word is chosen by Google's whole-word walk (`create_masked_lm_predictions`):
    the words in a uniformly random order, each taken unless it would pass k tokens. (draws,) runs."""
    rng, chosen = np.random.default_rng(seed), np.zeros(len(lengths))
    for _ in range(draws):
        budget = k
        for word in rng.permutation(len(lengths)):
            if lengths[word] <= budget:
                chosen[word] += 1
                budget -= lengths[word]
    return chosen / draws


def word_choices(lengths: list[int], rows: int, seed: int, **settings) -> tuple[dict, np.ndarray]:
    """Whole-word masking of `rows` copies of one row of words of `lengths`: the batch, and a
    (rows, words) bool array of the words chosen, each of which is checked to be masked whole."""
    row, words = word_row(lengths)
    masker = collator(whole_word_mask=True, continuation_mask=CONTINUATION, **settings)
    batch = masker([{"input_ids": row}] * rows, generator=seeded(seed))
    masked = torch.zeros(rows * len(row), dtype=torch.bool)
    masked[batch["masked_positions"]] = True
    masked = masked.view(rows, len(row)).numpy()
    whole = np.stack([masked[:, word].all(1) for word in words], axis=1)  # (rows, words)
    partly = np.stack([masked[:, word].any(1) for word in words], axis=1)
    assert (whole == partly).all(), "a word was masked in part"
    return batch, whole


def assert_binomial(counts: np.ndarray, draws: int, probability: np.ndarray, sigmas: float = 5.0) -> None:
    """Each count within `sigmas` standard deviations of Binomial(draws, probability); over 20 words
    at five sigmas a correct sampler fails one time in about 10^5."""
    sd = np.sqrt(draws * probability * (1 - probability))
    z = (counts - draws * probability) / sd
    assert np.abs(z).max() < sigmas, f"z-scores {np.round(z, 2).tolist()}"


def test_whole_word_masking_chooses_every_word_alike():
    """20 three-token words, k = round(0.15 * 60) = 9: three words a row, each with probability
    3 / 20 wherever it stands; over 4,000 rows each word's count is Binomial(4000, 0.15) and the
    counts together pass a chi-square test of uniformity at p = 10^-6."""
    rows, lengths = 4000, [3] * 20
    _, chosen = word_choices(lengths, rows, seed=21)
    assert (chosen.sum(1) == 3).all()
    counts = chosen.sum(0)
    assert_binomial(counts, rows, np.full(20, 3 / 20))
    expected = rows * 3 / 20
    statistic = ((counts - expected) ** 2 / expected).sum()
    assert statistic < 62.0  # chi-square, 19 degrees of freedom: P(> 62) is about 10^-6


def test_whole_word_masking_follows_googles_walk_for_words_of_several_lengths():
    """Words of 1, 2 and 3 tokens, k = round(0.25 * 36) = 9: Google's walk skips a word that no
    longer fits, so a longer word is chosen less often, and words of one length alike wherever they
    stand. Each word's count over 6,000 rows against the probability of its length in 20,000 runs
    of a direct implementation of the walk (pooled over the words of that length)."""
    rows, lengths = 6000, [1, 2, 3] * 6
    _, chosen = word_choices(lengths, rows, seed=22, mlm_probability=0.25)
    reference = google_walk(lengths, k=9, draws=20_000, seed=0)
    by_length = {length: reference[np.array(lengths) == length].mean() for length in (1, 2, 3)}
    assert by_length[1] > by_length[2] > by_length[3]  # the walk's skip favours short words
    probability = np.array([by_length[length] for length in lengths])
    assert_binomial(chosen.sum(0), rows, probability, sigmas=5.5)  # the reference's own error included


def test_whole_word_masking_keeps_the_80_10_10_split_in_every_word_position():
    """Of the masked tokens, heads and '##' pieces alike, 80% become [MASK], 10% a random ordinary
    token (the original one again with chance 1 / 995) and 10% stay: each share within five binomial
    standard deviations."""
    rows, lengths = 3000, [1, 2, 3, 4] * 5
    batch, _ = word_choices(lengths, rows, seed=23)
    row, _ = word_row(lengths)
    labels, new = batch["masked_labels"], batch["input_ids"].view(-1)[batch["masked_positions"]]
    ordinary = VOCAB - len(SPECIALS)
    shares = {"mask": 0.8, "random": 0.1 * (1 - 1 / ordinary), "unchanged": 0.1 + 0.1 / ordinary}
    for piece in (labels < FIRST_CONTINUATION, labels >= FIRST_CONTINUATION):  # heads, then pieces
        count = int(piece.sum())
        assert count > 5000
        kinds = {
            "mask": new[piece] == MASK,
            "random": (new[piece] != MASK) & (new[piece] != labels[piece]),
            "unchanged": new[piece] == labels[piece],
        }
        for kind, share in shares.items():
            observed = kinds[kind].double().mean().item()
            assert abs(observed - share) < 5 * np.sqrt(share * (1 - share) / count), (kind, observed)
        assert not torch.isin(new[piece][kinds["random"]], torch.tensor(SPECIALS)).any()
    assert set(np.unique(labels.numpy())) <= set(row.tolist())


def split_words(batch: dict, continuation: np.ndarray, special: np.ndarray) -> tuple[int, int]:
    """In a training batch: the masked '##' pieces, and the neighbours within a word (a piece and the
    token before it) of which one is masked and the other not."""
    ids = batch["input_ids"].clone()
    width = ids.shape[1]
    original = ids.view(-1)
    original[batch["masked_positions"]] = batch["masked_labels"]
    masked = torch.zeros_like(original, dtype=torch.bool)
    masked[batch["masked_positions"]] = True
    original, masked = original.numpy(), masked.numpy()
    piece = continuation[original] & ~special[original]
    piece[::width] = False  # a row's first token has no token before it in the row
    within_word = piece[1:] & ~special[original[:-1]]  # (B*T - 1,): token i + 1 continues token i's word
    split = within_word & (masked[1:] != masked[:-1])
    return int((piece & masked).sum()), int(split.sum())


@pytest.mark.parametrize("how", ["--set", "--config", "default"])
def test_whole_word_masking_set_in_the_config_reaches_the_training_batches(
    tmp_path, monkeypatch, how, wiki_slice, small_tokenizer_dir
):
    from test_faults import cli_pretrain

    import bertforge.pretrain
    from bertforge.checkpoint import read_config
    from bertforge.cli import main
    from bertforge.tokenizer import load_tokenizer

    batches = []
    real_loss = bertforge.pretrain.masked_lm_and_nsp_loss

    def recording_loss(model, batch, vocab_size):
        batches.append({key: value.clone() for key, value in batch.items()})
        return real_loss(model, batch, vocab_size)

    monkeypatch.setattr(bertforge.pretrain, "masked_lm_and_nsp_loss", recording_loss)
    toml = tmp_path / "wwm.toml"
    toml.write_text("[data]\nwhole_word_masking = true\n", encoding="utf-8")
    setting = {"--set": ["--set", "data.whole_word_masking=true"], "--config": ["--config", str(toml)]}
    run = tmp_path / "run"
    argv = cli_pretrain(wiki_slice, small_tokenizer_dir, run, "--max-steps", "3", *setting.get(how, []))
    assert main(argv) == 0
    assert read_config(run).data.whole_word_masking == (how != "default")

    tokenizer = load_tokenizer(small_tokenizer_dir)
    special = np.zeros(tokenizer.vocab_size, dtype=bool)
    special[list(tokenizer.special_ids)] = True
    counts = [split_words(batch, tokenizer.continuation_mask(), special) for batch in batches]
    pieces, split = (sum(column) for column in zip(*counts, strict=True))
    assert len(batches) == 3 and pieces >= 10  # enough '##' pieces masked to tell
    if how == "default":
        assert split > pieces / 2  # token masking: most masked pieces leave their neighbours unmasked
    else:
        assert split == 0  # whole words: a word's tokens are masked together or not at all

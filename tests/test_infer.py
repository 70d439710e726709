"""bertforge.infer and bertforge.load: a model trained here fills its masks, NSP is a probability,
batches equal one-by-one answers, and every bad input gets its message."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

import bertforge
from bertforge.checkpoint import save_model_folder
from bertforge.config import ModelConfig, TokenizerConfig
from bertforge.errors import BertforgeError
from bertforge.infer import embed, fill_mask, next_sentence, showcase
from bertforge.model import BertForPreTraining
from bertforge.tokenizer import load_tokenizer, train_tokenizer

DOCUMENTS = [
    ["The cat sat on the mat.", "It purred all afternoon.", "Then the cat slept in the sun."],
    ["The old ship sailed to the north.", "Its captain loved the cold sea.", "The crew caught many fish."],
    ["My sister plays the violin.", "She practices every morning.", "Her teacher lives in Vienna."],
    ["The river floods every spring.", "Farmers plant rice near the water.", "The harvest comes in autumn."],
]
SENTENCES = [s for document in DOCUMENTS for s in document]


def training_batch(tokenizer) -> dict[str, torch.Tensor]:
    """Every sentence alone and in pairs: true pairs (NSP label 0), cross-document ones (label 1)."""
    pairs = [(a, b, 0) for doc in DOCUMENTS for a, b in zip(doc, doc[1:], strict=False)]
    pairs += [
        (a, DOCUMENTS[(d + 1) % 4][i], 1) for d, doc in enumerate(DOCUMENTS) for i, a in enumerate(doc[:-1])
    ]
    rows = [(*tokenizer.encode_pair(a, b), label) for a, b, label in pairs]
    rows += [(*tokenizer.encode_pair(s), -100) for s in SENTENCES]  # -100: no NSP label
    width = max(len(ids) for ids, _, _ in rows)
    ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows])  # (B, T)
    return {
        "input_ids": ids,
        "token_type_ids": torch.tensor([r[1] + [0] * (width - len(r[1])) for r in rows]),  # (B, T)
        "attention_mask": (ids != tokenizer.pad_id).long(),  # (B, T)
        "nsp_labels": torch.tensor([r[2] for r in rows]),  # (B,)
    }


def memorise(tokenizer, steps: int = 400) -> BertForPreTraining:
    """A tiny BERT that knows DOCUMENTS by heart (MLM at 20% with at least one mask per row, plus
    NSP). About 5 s on one core."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    model = BertForPreTraining(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = training_batch(tokenizer)
    ids = batch["input_ids"]
    special = ids < len(tokenizer.special_ids)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: on a busy machine, threads only wait for each other
    try:
        for _ in range(steps):
            draw = torch.rand(ids.shape).masked_fill(special, 2.0)
            masked = (draw < 0.2) | (draw == draw.min(1, keepdim=True).values)  # (B, T)
            positions = masked.flatten().nonzero().squeeze(1)
            mlm, nsp = model(
                ids.masked_fill(masked, tokenizer.mask_id),
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                masked_positions=positions,
            )
            loss = F.cross_entropy(mlm, ids.flatten()[positions]) + F.cross_entropy(nsp, batch["nsp_labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model, tokenizer) memorised on DOCUMENTS, saved as a model folder and loaded by bertforge.load."""
    root = tmp_path_factory.mktemp("memorised")
    (root / "corpus.txt").write_text("\n\n".join(" ".join(doc) for doc in DOCUMENTS) + "\n")
    tokenizer = train_tokenizer(
        [root / "corpus.txt"],
        TokenizerConfig(vocab_size=500, min_frequency=1),
        root / "tok",
        show_progress=False,
    )
    model = memorise(tokenizer)
    config = tiny_config()
    config.model = model.config
    save_model_folder(root / "final", model, tokenizer, config)
    return bertforge.load(root / "final")


@pytest.fixture(scope="module")
def random_model(small_tokenizer_dir):
    """A randomly initialised tiny model (max length 64) with the 2,000-token WikiText tokenizer."""
    tokenizer = load_tokenizer(small_tokenizer_dir)
    config = tiny_config().model
    config.vocab_size = tokenizer.vocab_size
    config.initializer_range = 0.2  # spread-out logits, so top-k orders are not near-ties
    torch.manual_seed(0)
    return BertForPreTraining(config).eval(), tokenizer


def masked_variants(sentence: str):
    """(text with one word of 3+ letters masked, that word lower-cased) for every such word."""
    words = sentence.split()
    for i, word in enumerate(words):
        bare = word.rstrip(".")
        if len(bare) >= 3:
            masked = "[MASK]" + word[len(bare) :]
            yield " ".join(words[:i] + [masked] + words[i + 1 :]), bare.lower()


def test_fill_mask_finds_the_trained_word_in_the_top_5(trained):
    model, tokenizer = trained
    cases = [case for sentence in SENTENCES for case in masked_variants(sentence)]
    results = fill_mask(model, tokenizer, [text for text, _ in cases])
    misses = [
        (text, answer)
        for (text, answer), masks in zip(cases, results, strict=True)
        if answer not in [p["word"] for p in masks[0]]
    ]
    assert not misses
    first = fill_mask(model, tokenizer, "The cat sat on the [MASK].")
    assert len(first) == 1 and len(first[0]) == 5
    assert first[0][0]["word"] == "mat" and first[0][0]["sequence"] == "the cat sat on the mat."
    scores = [p["score"] for p in first[0]]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6


def test_several_masks_in_one_text(trained):
    model, tokenizer = trained
    masks = fill_mask(model, tokenizer, "My [MASK] plays the [MASK].", top_k=3)
    assert len(masks) == 2 and all(len(m) == 3 for m in masks)
    first, second = masks
    assert "sister" in [p["word"] for p in first] and "violin" in [p["word"] for p in second]
    sister = next(p for p in first if p["word"] == "sister")
    assert sister["sequence"] == "my sister plays the [MASK]."  # each mask predicted on its own


def test_next_sentence_tells_true_pairs_from_random_ones(trained):
    model, tokenizer = trained
    firsts = [doc[0] for doc in DOCUMENTS]
    true_next = next_sentence(model, tokenizer, firsts, [doc[1] for doc in DOCUMENTS])
    random_next = next_sentence(model, tokenizer, firsts, [DOCUMENTS[(d + 1) % 4][0] for d in range(4)])
    assert min(true_next) > 0.5 > max(random_next)
    single = next_sentence(model, tokenizer, firsts[0], DOCUMENTS[0][1])
    assert isinstance(single, float) and single == pytest.approx(true_next[0], abs=1e-6)


def test_nsp_probabilities_are_a_distribution(random_model):
    model, tokenizer = random_model
    a = ["the game was released in japan .", "he was born in 1900 ."]
    b = ["it sold well .", "the river is long ."]
    probabilities = next_sentence(model, tokenizer, a, b)
    for first, second, p in zip(a, b, probabilities, strict=True):
        ids, types = tokenizer.encode_pair(first, second)
        with torch.no_grad():
            _, logits = model(torch.tensor([ids]), token_type_ids=torch.tensor([types]))
        is_next, not_next = logits.softmax(-1)[0].tolist()
        assert 0.0 <= p <= 1.0
        assert p == pytest.approx(is_next, abs=1e-6)
        assert p + not_next == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_batch_embeddings_equal_one_by_one(random_model, pooling):
    model, tokenizer = random_model
    texts = [
        "a short one .",
        "a much longer text about the history of the game in japan and europe .",
        "x",
        "two words",
    ]
    batch = embed(model, tokenizer, texts, pooling=pooling, batch_size=3)
    assert batch.shape == (4, model.config.hidden_size) and batch.dtype == np.float32
    for text, row in zip(texts, batch, strict=True):
        np.testing.assert_allclose(embed(model, tokenizer, text, pooling=pooling), row, atol=1e-5)


def test_mean_pooling_is_the_mean_of_real_tokens(random_model):
    model, tokenizer = random_model
    ids, _ = tokenizer.encode_pair("the game was released in japan .")
    with torch.no_grad():
        hidden, _ = model.bert(torch.tensor([ids]))
    np.testing.assert_allclose(
        embed(model, tokenizer, "the game was released in japan .", "mean"), hidden[0].mean(0), atol=1e-6
    )
    np.testing.assert_allclose(
        embed(model, tokenizer, "the game was released in japan .", "cls"), hidden[0, 0], atol=1e-6
    )


def test_batched_fill_mask_and_nsp_equal_one_by_one(random_model):
    model, tokenizer = random_model
    texts = ["the [MASK] was released .", "in [MASK] , the river of the [MASK] city was long and wide ."]
    together = fill_mask(model, tokenizer, texts, batch_size=2)
    for text, masks in zip(texts, together, strict=True):
        alone = fill_mask(model, tokenizer, text)
        assert [[p["token_id"] for p in m] for m in alone] == [[p["token_id"] for p in m] for m in masks]
        for m_alone, m_batch in zip(alone, masks, strict=True):
            np.testing.assert_allclose(
                [p["score"] for p in m_alone], [p["score"] for p in m_batch], atol=1e-6
            )


def test_inference_restores_train_mode_and_is_deterministic(random_model):
    model, tokenizer = random_model
    model.train()
    try:
        first = embed(model, tokenizer, ["some text"])
        second = embed(model, tokenizer, ["some text"])
        assert model.training
    finally:
        model.eval()
    np.testing.assert_array_equal(first, second)  # dropout was off


def test_word_pieces_are_joined_into_words(random_model):
    model, tokenizer = random_model
    vocab = tokenizer.backend.get_vocab()
    piece = next(token for token in sorted(vocab) if token.startswith("##") and len(token) > 3)
    masks = fill_mask(model, tokenizer, "the game[MASK] was good", top_k=tokenizer.vocab_size)
    option = next(p for p in masks[0] if p["token"] == piece)
    assert option["word"] == "game" + piece[2:]
    assert option["sequence"] == f"the game{piece[2:]} was good"


def test_a_mask_that_starts_a_word_is_offered_no_word_pieces(random_model):
    model, tokenizer = random_model
    pieces = int(tokenizer.continuation_mask().sum())
    everything = tokenizer.vocab_size
    text = "[MASK] game ([MASK] 中[MASK] was[MASK]"
    first, second, ideograph, third = fill_mask(model, tokenizer, text, top_k=everything)
    for starts_a_word in (first, second, ideograph):  # at the start, after punctuation, after 中 (a word)
        assert not any(p["token"].startswith("##") for p in starts_a_word)
        assert len(starts_a_word) == everything - pieces - len(tokenizer.special_ids)
    assert sum(p["token"].startswith("##") for p in third) == pieces  # right after a word: all offered
    special = set(tokenizer.special_ids)  # [PAD], [UNK], [CLS], [SEP], [MASK]: never a word
    assert not any(p["token_id"] in special for found in (first, second, ideograph, third) for p in found)
    # The scores stay the model's probabilities: the pieces' share is left out, not spread.
    assert sum(p["score"] for p in first) < 1.0
    top = fill_mask(model, tokenizer, "the [MASK] was good", top_k=5)[0]
    assert len(top) == 5 and not any(p["token"].startswith("##") for p in top)


def test_too_long_text_is_refused_by_fill_mask_and_nsp_and_truncated_by_embed(random_model):
    model, tokenizer = random_model
    long_text = " ".join(["word"] * 100)
    with pytest.raises(BertforgeError, match="more than the model's maximum of 64"):
        fill_mask(model, tokenizer, "[MASK] " + long_text)
    with pytest.raises(BertforgeError, match="more than the model's maximum of 64"):
        next_sentence(model, tokenizer, long_text, "short .")
    with pytest.warns(UserWarning, match="1 of 2 texts are longer than the model's maximum of 64"):
        vectors = embed(model, tokenizer, [long_text, "short ."])
    np.testing.assert_allclose(vectors[0], embed(model, tokenizer, " ".join(["word"] * 62)), atol=1e-5)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, t: fill_mask(m, t, "no mask here"), "has no [MASK]"),
        (lambda m, t: fill_mask(m, t, "lower-case [mask] is text"), "has no [MASK]"),
        (lambda m, t: fill_mask(m, t, ""), "is empty"),
        (lambda m, t: fill_mask(m, t, ["the [MASK] .", "   "]), "text 2"),
        (lambda m, t: fill_mask(m, t, []), "no text given"),
        (lambda m, t: fill_mask(m, t, "the [MASK] .", top_k=0), "top_k"),
        (lambda m, t: next_sentence(m, t, "", "b"), "is empty"),
        (lambda m, t: next_sentence(m, t, ["a", "b"], ["c"]), "2 first sentences but 1"),
        (lambda m, t: embed(m, t, ["fine", ""]), "text 2 ('') is empty"),
        (lambda m, t: embed(m, t, "text", pooling="max"), "pooling"),
        (lambda m, t: embed(m, t, "text", batch_size=0), "batch_size"),
    ],
)
def test_bad_inputs_get_their_message(random_model, call, message):
    with pytest.raises(BertforgeError) as error:
        call(*random_model)
    assert message in str(error.value)


def test_showcase_masks_content_words_and_scores_pairs(trained):
    model, tokenizer = trained
    examples = showcase(model, tokenizer, DOCUMENTS, count=4, seed=1)
    assert len(examples) == 4
    for example in examples:
        assert example["masked"].count("[MASK]") == 1
        assert example["masked"].replace("[MASK]", example["answer"]) == example["sentence"]
        assert len(example["predictions"]) == 5 and example["hit"]
        assert example["p_next"] > 0.5 and 0.0 <= example["p_random"] <= 1.0  # (random pairs: unseen ones)
    again = showcase(model, tokenizer, DOCUMENTS, count=4, seed=1)
    assert [e["masked"] for e in again] == [e["masked"] for e in examples]  # seeded
    with pytest.raises(BertforgeError, match="no sentence"):
        showcase(model, tokenizer, [["One."], ["Two."]])


def test_the_api_refuses_a_gpt_and_a_head_that_never_trained(tmp_path, trained):
    from bertforge.gpt import GPTLMHeadModel

    model, tokenizer = trained
    gpt = GPTLMHeadModel(dataclasses.replace(model.config, objective="clm")).eval()
    for call in (
        lambda m: fill_mask(m, tokenizer, "the [MASK] sat"),
        lambda m: next_sentence(m, tokenizer, "a b", "c d"),
        lambda m: embed(m, tokenizer, "a b"),
        lambda m: showcase(m, tokenizer, DOCUMENTS),
    ):
        with pytest.raises(BertforgeError, match="needs a BERT, and this model is a GPT"):
            call(gpt)
    config = tiny_config()
    config.model, config.data.nsp = model.config, False  # pretrained with MLM alone
    save_model_folder(tmp_path / "mlm" / "final", model, tokenizer, config)
    mlm_alone, _ = bertforge.load(tmp_path / "mlm")
    assert mlm_alone.untrained_heads == ["nsp"]
    with pytest.raises(BertforgeError, match="next-sentence head never trained"):
        next_sentence(mlm_alone, tokenizer, "a b", "c d")
    examples = showcase(mlm_alone, tokenizer, DOCUMENTS, count=2, seed=1)  # the fill-mask part alone
    assert len(examples) == 2 and not any("p_next" in example for example in examples)
    assert "p_next" in showcase(model, tokenizer, DOCUMENTS, count=2, seed=1)[0]


def test_load_accepts_a_run_folder_final_and_checkpoint(tmp_path, random_model):
    model, tokenizer = random_model
    config = tiny_config()
    config.model = model.config
    save_model_folder(tmp_path / "run" / "final", model, tokenizer, config)
    save_model_folder(tmp_path / "run" / "checkpoints" / "step_000001", model, tokenizer, config)
    for path in (
        tmp_path / "run",
        tmp_path / "run" / "final",
        tmp_path / "run" / "checkpoints" / "step_000001",
    ):
        loaded, loaded_tokenizer = bertforge.load(path)
        assert not loaded.training and loaded_tokenizer.fingerprint == tokenizer.fingerprint
        assert all(
            torch.equal(a, b)
            for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
        )
    with pytest.raises(BertforgeError, match="does not exist"):
        bertforge.load(tmp_path / "nothing")


def test_import_bertforge_stays_light():
    import subprocess
    import sys

    code = "import sys, bertforge; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_gives_the_cpu_answers(random_model):
    model, tokenizer = random_model
    texts = ["the [MASK] was released in japan .", "a [MASK] ."]
    cpu_masks, cpu_vectors = fill_mask(model, tokenizer, texts), embed(model, tokenizer, texts)
    gpu = BertForPreTraining(model.config).cuda().eval()
    gpu.load_state_dict(model.state_dict())
    gpu_masks, gpu_vectors = fill_mask(gpu, tokenizer, texts), embed(gpu, tokenizer, texts)
    np.testing.assert_allclose(cpu_vectors, gpu_vectors, atol=1e-3)
    assert [p["token_id"] for p in cpu_masks[0][0][:2]] == [p["token_id"] for p in gpu_masks[0][0][:2]]

"""bertforge.model: Hugging Face parity both ways, sparse MLM head, tying, padding, init, overfitting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import HF_TINY_SIZES

from bertforge.config import HIDDEN_ACTS, ModelConfig, RunConfig, validate, validate_model
from bertforge.errors import BertforgeError
from bertforge.model import (
    TIED_KEYS,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    init_weights,
    set_activation_checkpointing,
)

transformers = pytest.importorskip("transformers")

TOL = 1e-5
SIZES = HF_TINY_SIZES


def ours_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**SIZES, **overrides})


def hf_model(**overrides):
    config = transformers.BertConfig(**{**SIZES, **overrides}, attn_implementation="eager")
    return transformers.BertForPreTraining(config).eval()


def padded_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three pairs of different lengths, padded to 12, segment ids 0 then 1 on real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 7, 4])
    input_ids = torch.randint(1, SIZES["vocab_size"], (3, 12), generator=g)
    attention_mask = (torch.arange(12) < lengths[:, None]).long()  # (B, T)
    input_ids = input_ids * attention_mask  # pad id 0 on padding
    token_type_ids = ((torch.arange(12) >= (lengths[:, None] // 2)) & attention_mask.bool()).long()
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference, for checks that two outputs differ (agreement is checked
    with `torch.testing.assert_close`)."""
    return (a - b).abs().max().item()


def hf_logits(model, input_ids, token_type_ids, attention_mask):
    out = model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    return out.prediction_logits, out.seq_relationship_logits


def test_state_dict_keys_and_shapes_equal_hugging_face():
    ours = BertForPreTraining(ours_config()).state_dict()
    theirs = hf_model().state_dict()
    assert set(ours) == set(theirs)
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert set(TIED_KEYS) <= set(ours)  # the aliases are reported, as Hugging Face does
    for alias, owner in TIED_KEYS.items():
        assert ours[alias].data_ptr() == ours[owner].data_ptr()


@torch.no_grad()
def test_parity_hugging_face_to_ours():
    torch.manual_seed(1)
    hf = hf_model()
    ours = BertForPreTraining(ours_config()).eval()
    ours.load_state_dict(hf.state_dict())
    batch = padded_batch()
    mlm, nsp = ours(**batch)
    hf_mlm, hf_nsp = hf_logits(hf, **batch)
    assert mlm.shape == hf_mlm.shape == (3, 12, SIZES["vocab_size"])
    assert nsp.shape == hf_nsp.shape == (3, 2)
    # Every position, padding included: both mask keys only.
    torch.testing.assert_close(mlm, hf_mlm, rtol=0, atol=TOL)
    torch.testing.assert_close(nsp, hf_nsp, rtol=0, atol=TOL)
    # The head weights really came from HF (not zeros that would agree trivially).
    assert mlm.std() > 0.01


@torch.no_grad()
def test_parity_ours_to_hugging_face():
    torch.manual_seed(2)
    ours = BertForPreTraining(ours_config()).eval()
    with torch.no_grad():  # make biases and LayerNorms non-trivial so they are exercised
        for name, p in ours.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    hf = hf_model()
    hf.load_state_dict(ours.state_dict())
    assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
    batch = padded_batch(seed=3)
    mlm, nsp = ours(**batch)
    hf_mlm, hf_nsp = hf_logits(hf, **batch)
    torch.testing.assert_close(mlm, hf_mlm, rtol=0, atol=TOL)
    torch.testing.assert_close(nsp, hf_nsp, rtol=0, atol=TOL)


@torch.no_grad()
def test_encoder_parity_and_defaults():
    torch.manual_seed(4)
    hf = hf_model()
    encoder = BertModel(ours_config()).eval()
    encoder.load_state_dict(hf.bert.state_dict())
    batch = padded_batch()
    seq, pooled = encoder(**batch)
    out = hf.bert(**batch)
    assert seq.shape == (3, 12, SIZES["hidden_size"]) and pooled.shape == (3, SIZES["hidden_size"])
    torch.testing.assert_close(seq, out.last_hidden_state, rtol=0, atol=TOL)
    torch.testing.assert_close(pooled, out.pooler_output, rtol=0, atol=TOL)
    # None means "all segment 0" and "all real tokens".
    input_ids = batch["input_ids"]
    default = encoder(input_ids)
    explicit = encoder(
        input_ids,
        token_type_ids=torch.zeros_like(input_ids),
        attention_mask=torch.ones_like(input_ids, dtype=torch.bool),
    )
    torch.testing.assert_close(default[0], explicit[0], rtol=0, atol=TOL)
    torch.testing.assert_close(default[1], explicit[1], rtol=0, atol=TOL)


def test_too_long_sequence_is_a_clear_error():
    model = BertModel(ours_config(max_position_embeddings=8))
    with pytest.raises(BertforgeError, match="max_position_embeddings"):
        model(torch.ones(1, 9, dtype=torch.long))


@torch.no_grad()
def test_masked_positions_equal_dense_logits_gathered():
    torch.manual_seed(5)
    model = BertForPreTraining(ours_config()).eval()
    batch = padded_batch()
    dense_mlm, dense_nsp = model(**batch)
    positions = torch.tensor([0, 3, 11, 12, 15, 26, 25])  # flat indices into B*T = 36, unsorted
    sparse_mlm, sparse_nsp = model(**batch, masked_positions=positions)
    assert sparse_mlm.shape == (len(positions), SIZES["vocab_size"])
    expected = dense_mlm.reshape(-1, SIZES["vocab_size"])[positions]
    torch.testing.assert_close(sparse_mlm, expected, rtol=0, atol=TOL)
    torch.testing.assert_close(sparse_nsp, dense_nsp, rtol=0, atol=TOL)  # its last layer ran on 3 + 7 rows
    empty, nsp_alone = model(**batch, masked_positions=positions[:0])
    assert empty.shape == (0, SIZES["vocab_size"])
    torch.testing.assert_close(nsp_alone, dense_nsp, rtol=0, atol=TOL)


def test_masked_positions_give_the_dense_gradients():
    """The last layer runs past attention on the masked positions and [CLS] only: a loss on those
    has the gradients of the same loss on the dense output, every weight's."""
    torch.manual_seed(7)
    model = BertForPreTraining(ours_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    batch, positions = padded_batch(), torch.tensor([1, 3, 11, 13, 15, 25, 26])
    labels = torch.randint(0, SIZES["vocab_size"], (len(positions),))
    gradients = []
    for sparse in (False, True):
        model.zero_grad()
        mlm, nsp = model(**batch, masked_positions=positions) if sparse else model(**batch)
        if not sparse:
            mlm = mlm.reshape(-1, SIZES["vocab_size"])[positions]
        (F.cross_entropy(mlm, labels) + F.cross_entropy(nsp, torch.tensor([0, 1, 0]))).backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
    dense, sparse = gradients
    for name, gradient in dense.items():
        if not name.endswith("key.bias"):  # softmax ignores what a key bias adds to all of a row's scores
            assert gradient.abs().max() > 1e-6, name
        torch.testing.assert_close(sparse[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


def test_classifier_runs_its_last_layer_for_cls_alone_with_hugging_faces_logits_and_gradients():
    """Only [CLS] goes through the last layer's queries, attention output and feed-forward (its keys
    and values still come from every position): the logits and every gradient stay Hugging Face's."""
    torch.manual_seed(6)
    sizes = {
        **SIZES,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.2,
    }
    ours = BertForSequenceClassification(ModelConfig(**sizes), num_labels=3)
    hf = transformers.BertForSequenceClassification(
        transformers.BertConfig(**sizes, num_labels=3, attn_implementation="eager")
    )
    hf.load_state_dict(ours.state_dict())
    batch, labels = padded_batch(), torch.tensor([0, 2, 1])
    rows = []
    last = ours.bert.encoder.layer[-1]
    last.intermediate.dense.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[:2]))
    logits = {"ours": ours(**batch), "hf": hf(**batch).logits}
    assert rows == [(3, 1)]  # one position per sequence, not 12
    gradients = {}
    for name, model in (("ours", ours), ("hf", hf)):
        F.cross_entropy(logits[name], labels).backward()
        gradients[name] = {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(logits["ours"], logits["hf"], rtol=0, atol=TOL)
    assert gradients["ours"].keys() == gradients["hf"].keys()
    for name, gradient in gradients["hf"].items():
        if not name.endswith("key.bias"):  # softmax ignores what a key bias adds to all of a row's scores
            assert gradient.abs().max() > 1e-4, name  # the last layer's key weights take part too
        torch.testing.assert_close(gradients["ours"][name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_decoder_weight_and_bias_are_tied():
    torch.manual_seed(6)
    model = BertForPreTraining(ours_config())
    embedding = model.bert.embeddings.word_embeddings.weight
    decoder = model.cls.predictions.decoder
    assert decoder.weight is embedding and decoder.weight.data_ptr() == embedding.data_ptr()
    assert decoder.bias is model.cls.predictions.bias
    # Each tied tensor is one optimizer parameter, not two.
    names = [name for name, _ in model.named_parameters()]
    assert not set(TIED_KEYS) & set(names)

    before_weight = embedding.detach().clone()
    before_bias = model.cls.predictions.bias.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    mlm, nsp = model(**padded_batch(), masked_positions=torch.tensor([1, 2, 14]))
    loss = F.cross_entropy(mlm, torch.tensor([5, 6, 7])) + nsp.sum()
    loss.backward()
    optimizer.step()
    assert not torch.equal(embedding, before_weight)
    assert not torch.equal(model.cls.predictions.bias, before_bias)
    assert decoder.weight is embedding and torch.equal(decoder.weight, embedding)
    assert decoder.bias is model.cls.predictions.bias

    # Ties survive an in-place load, a dtype move, and an explicit re-tie after assign=True.
    model.load_state_dict(BertForPreTraining(ours_config()).state_dict())
    assert decoder.weight is model.bert.embeddings.word_embeddings.weight
    model.double()
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight.dtype == torch.float64
    model.load_state_dict(BertForPreTraining(ours_config()).double().state_dict(), assign=True)
    model.tie_weights()
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


@torch.no_grad()
def test_padding_does_not_change_real_positions():
    torch.manual_seed(7)
    model = BertForPreTraining(ours_config()).eval()
    short = torch.tensor([[2, 17, 33, 3, 41, 3]])  # (1, 6)
    short_types = torch.tensor([[0, 0, 0, 0, 1, 1]])
    alone_mlm, alone_nsp = model(short, token_type_ids=short_types)

    long = torch.randint(1, SIZES["vocab_size"], (1, 10))
    input_ids = torch.cat([long, F.pad(short, (0, 4))])  # (2, 10), pad id 0
    token_type_ids = torch.cat([torch.zeros(1, 10, dtype=torch.long), F.pad(short_types, (0, 4))])
    attention_mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
    batch_mlm, batch_nsp = model(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    torch.testing.assert_close(batch_mlm[1, :6], alone_mlm[0], rtol=0, atol=TOL)
    torch.testing.assert_close(batch_nsp[1], alone_nsp[0], rtol=0, atol=TOL)
    # Without the mask the padding leaks in: the test above can fail.
    leaky_mlm, _ = model(input_ids, token_type_ids=token_type_ids)
    assert max_diff(leaky_mlm[1, :6], alone_mlm[0]) > 1e-3


def test_initialisation_matches_hugging_face_statistics():
    torch.manual_seed(8)
    config = ours_config(vocab_size=500, hidden_size=128, intermediate_size=512, pad_token_id=3)
    model = BertForPreTraining(config)
    big = model.bert.encoder.layer[0].intermediate.dense.weight  # 512 x 128
    assert abs(big.std().item() - config.initializer_range) < 0.05 * config.initializer_range
    assert abs(big.mean().item()) < 1e-3
    words = model.bert.embeddings.word_embeddings.weight
    assert torch.all(words[3] == 0)  # pad_token_id row, whatever the id
    assert abs(words[4:].std().item() - config.initializer_range) < 0.05 * config.initializer_range
    for name, param in model.state_dict().items():
        if "LayerNorm.weight" in name:
            assert torch.all(param == 1), name
        elif name.endswith("bias"):
            assert torch.all(param == 0), name
    assert torch.all(model.cls.predictions.bias == 0)

    # Re-initialising a trained model restores the same statistics (tied weight drawn once).
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    init_weights(model, config)
    assert torch.all(words[3] == 0) and torch.all(model.cls.predictions.bias == 0)
    assert abs(big.std().item() - config.initializer_range) < 0.05 * config.initializer_range


@pytest.mark.parametrize("act", HIDDEN_ACTS)
@torch.no_grad()
def test_activation_parity_with_hugging_face(act):
    torch.manual_seed(9)
    hf = hf_model(hidden_act=act)
    ours = BertForPreTraining(ours_config(hidden_act=act)).eval()
    ours.load_state_dict(hf.state_dict())
    batch = padded_batch(seed=10)
    mlm, nsp = ours(**batch)
    hf_mlm, hf_nsp = hf_logits(hf, **batch)
    torch.testing.assert_close(mlm, hf_mlm, rtol=0, atol=TOL)
    torch.testing.assert_close(nsp, hf_nsp, rtol=0, atol=TOL)


@torch.no_grad()
def test_activation_choice_matters():
    torch.manual_seed(11)
    gelu = BertForPreTraining(ours_config()).eval()
    relu = BertForPreTraining(ours_config(hidden_act="relu")).eval()
    relu.load_state_dict(gelu.state_dict())
    batch = padded_batch()
    assert max_diff(gelu(**batch)[0], relu(**batch)[0]) > 1e-4


def test_unknown_activation_and_bad_head_count_are_refused_by_the_config():
    with pytest.raises(BertforgeError, match="hidden_act"):
        validate_model(ours_config(hidden_act="swishy"))
    with pytest.raises(BertforgeError, match="num_attention_heads"):
        validate_model(ours_config(num_attention_heads=5))
    with pytest.raises(AssertionError):  # the model trusts a validated config
        BertModel(ours_config(num_attention_heads=5))


def test_dropout_is_active_in_training_only():
    torch.manual_seed(12)
    model = BertForPreTraining(ours_config(hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3))
    batch = padded_batch()
    model.train()
    assert max_diff(model(**batch)[0], model(**batch)[0]) > 1e-4
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch)[0], model(**batch)[0])


def test_tiny_model_overfits_fixed_batches():
    torch.manual_seed(13)
    config = ours_config(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForPreTraining(config).train()
    g = torch.Generator().manual_seed(14)
    batches = []
    for _ in range(3):
        input_ids = torch.randint(5, config.vocab_size, (8, 16), generator=g)
        token_type_ids = (torch.arange(16) >= 8).long().expand(8, 16)
        masked = torch.rand(8, 16, generator=g) < 0.15
        masked[:, 1] = True  # at least one prediction per row
        positions = masked.flatten().nonzero().squeeze(1)  # (M,)
        labels = input_ids.flatten()[positions]
        inputs = input_ids.clone()
        inputs.view(-1)[positions] = 4  # [MASK]
        nsp_labels = torch.randint(0, 2, (8,), generator=g)
        batches.append((inputs, token_type_ids, positions, labels, nsp_labels))

    def losses(batch):
        inputs, token_type_ids, positions, labels, nsp_labels = batch
        mlm, nsp = model(inputs, token_type_ids=token_type_ids, masked_positions=positions)
        return F.cross_entropy(mlm, labels), F.cross_entropy(nsp, nsp_labels), mlm, nsp

    with torch.no_grad():
        start = sum(sum(losses(b)[:2]).item() for b in batches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(250):
        mlm_loss, nsp_loss, _, _ = losses(batches[step % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        (mlm_loss + nsp_loss).backward()
        optimizer.step()

    model.eval()
    with torch.no_grad():
        end = 0.0
        for batch in batches:
            mlm_loss, nsp_loss, mlm, nsp = losses(batch)
            end += (mlm_loss + nsp_loss).item()
            assert torch.equal(mlm.argmax(-1), batch[3])  # every masked token recovered
            assert torch.equal(nsp.argmax(-1), batch[4])
    assert start / len(batches) > 3.0  # about ln(50) + ln(2) at init
    assert end / len(batches) < 0.25


def test_activation_checkpointing_gives_the_same_gradients():
    """Recomputed layers replay the same dropout masks: loss and gradients are those without it.
    (With variable-length attention on a GPU: tests/test_unpadded.py.)"""
    torch.manual_seed(0)
    model = BertForPreTraining(ours_config(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2))
    batch = padded_batch()
    results = []
    for enabled in (False, True):
        set_activation_checkpointing(model, enabled)
        assert model.bert.encoder.gradient_checkpointing is enabled
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks for both runs
        mlm, nsp = model(**batch)
        loss = mlm[batch["attention_mask"].bool()].logsumexp(-1).mean() + nsp.logsumexp(-1).mean()
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss, gradients), (checkpointed_loss, checkpointed) = results
    torch.testing.assert_close(checkpointed_loss, loss, rtol=0, atol=TOL)
    for name, gradient in gradients.items():
        torch.testing.assert_close(checkpointed[name], gradient, rtol=0, atol=TOL, msg=name)
    torch.manual_seed(2)  # other dropout masks: other gradients, so the comparison above can fail
    mlm, nsp = model(**batch)
    model.zero_grad()
    (mlm[batch["attention_mask"].bool()].logsumexp(-1).mean() + nsp.logsumexp(-1).mean()).backward()
    assert max(max_diff(p.grad, gradients[n]) for n, p in model.named_parameters()) > 1e-3


def test_activation_checkpointing_keeps_fewer_activations():
    """With it on, the backward graph holds a layer's input, not every intermediate of every layer."""
    torch.manual_seed(0)
    model = BertForPreTraining(ours_config(num_hidden_layers=4))
    batch = padded_batch()

    def saved_elements(enabled: bool) -> int:
        set_activation_checkpointing(model, enabled)
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            model(**batch)
        return sum(sizes)

    assert saved_elements(True) < saved_elements(False) / 2


def test_activation_checkpointing_is_for_bert():
    config = RunConfig()
    config.model.objective, config.train.activation_checkpointing = "clm", True
    config.model.hidden_act = "gelu_new"
    with pytest.raises(BertforgeError, match="train.activation_checkpointing"):
        validate(config)
    classifier = BertForSequenceClassification(ours_config(), num_labels=2)
    set_activation_checkpointing(classifier, True)
    assert classifier.bert.encoder.gradient_checkpointing

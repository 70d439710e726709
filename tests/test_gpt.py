"""GPT-1 (`bertforge.gpt`), its Hugging Face bridge (`gpt_convert`) and generation (`generate`).

Parity is against `transformers.OpenAIGPTLMHeadModel` built from tiny configs (nothing downloaded).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.generate import filter_logits, generate
from bertforge.gpt import (
    GPT_TIED_KEYS,
    GPTLMHeadModel,
    causal_attention,
    next_token_loss,
    next_token_sums,
    summarize_clm,
)
from bertforge.gpt_convert import (
    from_hf_state_dict,
    hf_config,
    language_model_from_hf,
    model_config_from_hf,
    save_hf_folder,
    to_hf_state_dict,
)

transformers = pytest.importorskip("transformers")

VOCAB = 99
MAX_POSITIONS = 64
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_act="gelu_new",
    max_position_embeddings=MAX_POSITIONS,
    layer_norm_eps=1e-5,
    initializer_range=0.2,  # large enough that attention is far from uniform and tokens differ
    objective="clm",  # what a GPT's config records (a folder read from Hugging Face says so too)
)


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig(**{**TINY, **changes})


def ours_model(seed: int = 0, **changes) -> GPTLMHeadModel:
    torch.manual_seed(seed)
    return GPTLMHeadModel(tiny_config(**changes)).eval()


def hf_model(config: ModelConfig, seed: int = 0):
    raw = hf_config(config)
    raw = {key: value for key, value in raw.items() if key not in ("architectures", "model_type")}
    torch.manual_seed(seed)
    return transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**raw)).eval()


def hf_from_ours(model: GPTLMHeadModel):
    hf = hf_model(model.config)
    result = hf.load_state_dict(to_hf_state_dict(model.state_dict()), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return hf


def random_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(hf, ids, attention_mask=None) -> torch.Tensor:
    return hf(input_ids=ids, attention_mask=attention_mask).logits


# ------------------------------------------------------------------------------------- the mapping


def test_state_dict_maps_onto_hugging_face_keys_and_shapes_and_back():
    model = ours_model()
    hf = hf_model(model.config)
    mapped = to_hf_state_dict(model.state_dict())
    expected = {name: tensor.shape for name, tensor in hf.state_dict().items()}
    assert {name: tensor.shape for name, tensor in mapped.items()} == expected
    # Conv1D weights are (in, out): c_attn fuses q, k, v along its output axis.
    query = model.gpt.layer[1].attention.self.query.weight
    assert torch.equal(mapped["transformer.h.1.attn.c_attn.weight"][:, :32], query.t())
    back = from_hf_state_dict(mapped)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[name], tensor) for name, tensor in model.state_dict().items())
    # A bare `OpenAIGPTModel` (no "transformer." prefix, no head) and saved causal-mask buffers.
    bare = {name.removeprefix("transformer."): t for name, t in mapped.items() if name != "lm_head.weight"}
    bare["h.0.attn.bias"] = torch.ones(1, 1, MAX_POSITIONS, MAX_POSITIONS).tril()
    assert from_hf_state_dict(bare).keys() == model.state_dict().keys() - set(GPT_TIED_KEYS)
    with pytest.raises(BertforgeError, match="transformer.h.0.attn.rotary.weight"):
        from_hf_state_dict({**mapped, "transformer.h.0.attn.rotary.weight": torch.zeros(1)})
    with pytest.raises(BertforgeError, match="gpt.layer.0.pooler.weight"):
        to_hf_state_dict({**model.state_dict(), "gpt.layer.0.pooler.weight": torch.zeros(1)})


@pytest.mark.parametrize("length", [1, 7, MAX_POSITIONS])
def test_logits_equal_hugging_face_with_our_weights(length):
    model = ours_model()
    hf = hf_from_ours(model)
    ids = random_ids(3, length)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf_logits(hf, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("length", [2, 19, MAX_POSITIONS])
def test_logits_equal_ours_with_hugging_face_weights(length):
    config = tiny_config()
    hf = hf_model(config, seed=5)
    model = GPTLMHeadModel(config).eval()
    model.load_state_dict(from_hf_state_dict(hf.state_dict()))
    assert model.lm_head.weight is model.gpt.embeddings.word_embeddings.weight
    ids = random_ids(2, length, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf_logits(hf, ids), rtol=0, atol=1e-5)


def test_padding_mask_logits_equal_hugging_face():
    model = ours_model()
    hf = hf_from_ours(model)
    ids = random_ids(3, 16)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[0, 11:] = 0  # right padding
    mask[1, :5] = 0  # left padding
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask), hf_logits(hf, ids, mask)
    # Right padding and unpadded rows: every position, pads included.
    torch.testing.assert_close(ours[[0, 2]], theirs[[0, 2]], rtol=0, atol=1e-5)
    # Left padding: the real positions. (A left pad has no real key at or before it: Hugging Face
    # lets it attend to later tokens, ours to itself; neither is ever a prediction that counts.)
    torch.testing.assert_close(ours[1, 5:], theirs[1, 5:], rtol=0, atol=1e-5)
    assert torch.isfinite(ours).all()
    # The mask changes real positions' logits only where pads were visible to them.
    with torch.no_grad():
        unpadded = model(ids)
    torch.testing.assert_close(ours[0, :11], unpadded[0, :11], rtol=0, atol=1e-6)
    assert not torch.allclose(ours[1, 5:], unpadded[1, 5:], atol=1e-3)


def test_hugging_face_folder_round_trip(tmp_path):
    model = ours_model()
    save_hf_folder(model, tmp_path / "ours")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["config.json", "model.safetensors"]
    hf = transformers.OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "ours").eval()
    assert hf.lm_head.weight.data_ptr() == hf.transformer.tokens_embed.weight.data_ptr()
    ids = random_ids(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(hf, ids), model(ids), rtol=0, atol=1e-5)

    hf_model(model.config, seed=7).save_pretrained(tmp_path / "theirs")
    theirs = transformers.OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "theirs").eval()
    raw = json.loads((tmp_path / "theirs" / "config.json").read_text())
    weights = load_file(str(tmp_path / "theirs" / "model.safetensors"))
    loaded, dropped = language_model_from_hf(model_config_from_hf(raw), weights, tmp_path / "theirs")
    assert dropped == []
    assert loaded.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), hf_logits(theirs, ids), rtol=0, atol=1e-5)
    with pytest.raises(BertforgeError, match="already exists"):
        save_hf_folder(model, tmp_path / "ours")


def test_a_double_heads_model_is_read_as_its_language_model(tmp_path):
    config = ours_model().config
    raw = {
        key: value for key, value in hf_config(config).items() if key not in ("architectures", "model_type")
    }
    torch.manual_seed(3)
    double = transformers.OpenAIGPTDoubleHeadsModel(transformers.OpenAIGPTConfig(**raw)).eval()
    double.save_pretrained(tmp_path / "double")
    weights = load_file(str(tmp_path / "double" / "model.safetensors"))
    assert any(name.startswith("multiple_choice_head.") for name in weights)
    raw = json.loads((tmp_path / "double" / "config.json").read_text())
    loaded, dropped = language_model_from_hf(model_config_from_hf(raw), weights, tmp_path / "double")
    assert dropped and all(name.startswith("multiple_choice_head.") for name in dropped)
    ids = random_ids(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), double(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_an_embedding_dropout_of_its_own_is_read_with_a_warning():
    raw = {**hf_config(tiny_config(hidden_dropout_prob=0.1)), "embd_pdrop": 0.0}
    with pytest.warns(UserWarning, match="embd_pdrop"):
        assert model_config_from_hf(raw).hidden_dropout_prob == 0.1


def test_config_round_trip_and_refusals():
    config = tiny_config(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.05, pad_token_id=3)
    raw = hf_config(config, eos_token_id=4)
    assert raw["architectures"] == ["OpenAIGPTLMHeadModel"] and raw["afn"] == "gelu"
    assert (raw["n_embd"], raw["n_layer"], raw["n_head"], raw["n_positions"]) == (32, 2, 4, MAX_POSITIONS)
    assert (raw["resid_pdrop"], raw["embd_pdrop"], raw["attn_pdrop"]) == (0.2, 0.2, 0.05)
    assert raw["eos_token_id"] == 4
    assert model_config_from_hf(raw) == config
    with pytest.raises(BertforgeError, match="hidden_act = 'gelu'"):
        hf_config(tiny_config(hidden_act="gelu"))  # the exact GELU: OpenAIGPT's "gelu" is the tanh one
    with pytest.raises(BertforgeError, match="intermediate_size"):
        hf_config(tiny_config(intermediate_size=100))
    with pytest.raises(BertforgeError, match="not OpenAIGPT"):
        model_config_from_hf({"model_type": "bert"})


@pytest.mark.parametrize("act", ["gelu_new", "relu", "silu"])
def test_activation_parity_with_hugging_face(act):
    model = ours_model(hidden_act=act)
    hf = hf_from_ours(model)
    ids = random_ids(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf_logits(hf, ids), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ the network


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_a_later_token_never_changes_earlier_logits(padded, training):
    model = ours_model(hidden_dropout_prob=0.1 if training else 0.0).train(training)
    ids = random_ids(2, 20)
    mask = torch.ones(2, 20, dtype=torch.long)
    if padded:
        mask[0, 17:] = 0
    for position in (0, 9, 19):
        changed = ids.clone()
        changed[:, position] = (changed[:, position] + 1) % VOCAB
        torch.manual_seed(3)  # the same dropout masks for both passes
        before = model(ids, attention_mask=mask if padded else None)
        torch.manual_seed(3)
        after = model(changed, attention_mask=mask if padded else None)
        assert torch.equal(before[:, :position], after[:, :position])
        assert not torch.allclose(before[:, position:], after[:, position:])


def test_lm_head_is_tied_to_the_token_embeddings():
    model = ours_model()
    embeddings = model.gpt.embeddings.word_embeddings.weight
    assert model.lm_head.weight is embeddings and model.lm_head.bias is None
    assert set(GPT_TIED_KEYS) <= model.state_dict().keys()
    # The logits are the last hidden states times the embedding matrix.
    ids = random_ids(1, 5)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), model.gpt(ids) @ embeddings.t())
    # Loading a state dict keeps the tie, and a gradient reaches the shared tensor from both ends.
    model.load_state_dict(ours_model(seed=9).state_dict())
    assert model.lm_head.weight is model.gpt.embeddings.word_embeddings.weight
    model(ids).sum().backward()
    unseen = torch.ones(VOCAB, dtype=torch.bool)
    unseen[ids.flatten()] = False
    assert embeddings.grad[unseen].abs().sum() > 0  # only the head reaches tokens not in the input


def test_initialisation_follows_the_config():
    model = ours_model(initializer_range=0.02)
    assert model.gpt.embeddings.word_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.1)
    block = model.gpt.layer[0]
    assert torch.equal(block.attention.output.LayerNorm.weight, torch.ones(32))
    assert torch.equal(block.intermediate.dense.bias, torch.zeros(128))


def test_too_long_sequence_is_a_clear_error():
    with pytest.raises(BertforgeError, match="max_position_embeddings"):
        ours_model()(random_ids(1, MAX_POSITIONS + 1))


def test_kv_cache_gives_the_full_forward_logits():
    model = ours_model()
    ids = random_ids(2, 23)
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache()
        pieces = [
            model(ids[:, start:end], cache=cache) for start, end in ((0, 10), (10, 11), (11, 12), (12, 23))
        ]
    assert cache.length == 23
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ the objective


def test_next_token_loss_matches_a_hand_computation():
    torch.manual_seed(4)
    logits = torch.randn(2, 6, VOCAB)
    ids = random_ids(2, 6)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
    losses, hits = [], []
    for row in range(2):
        for t in range(5):  # position t predicts token t + 1
            if mask[row, t] and mask[row, t + 1]:
                log_probs = logits[row, t].log_softmax(-1)
                losses.append(-log_probs[ids[row, t + 1]].item())
                hits.append(int(logits[row, t].argmax() == ids[row, t + 1]))
    assert len(losses) == 7  # 3 in the right-padded row, 4 in the left-padded one
    loss, accuracy = next_token_loss(logits, ids, mask)
    assert loss.item() == pytest.approx(sum(losses) / len(losses), rel=1e-6)
    assert accuracy.item() == pytest.approx(sum(hits) / len(hits))
    sums = {name: value.item() for name, value in next_token_sums(logits, ids, mask).items()}
    assert sums["clm_count"] == 7 and sums["clm_loss_sum"] == pytest.approx(sum(losses), rel=1e-6)
    assert summarize_clm(sums).metrics["perplexity"] == pytest.approx(
        torch.tensor(sum(losses) / 7).exp().item()
    )


def test_next_token_loss_equals_hugging_face_lm_loss():
    model = ours_model()
    hf = hf_from_ours(model)
    ids = random_ids(3, 30)
    with torch.no_grad():
        loss, _ = next_token_loss(model(ids), ids)
        theirs = hf(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(
            loss, F.cross_entropy(model(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        )
    torch.testing.assert_close(loss, theirs, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_equals_transformers(use_cache):
    model = ours_model()
    hf = hf_from_ours(model)
    prompts = random_ids(2, 6)
    assert (
        prompts == 0
    ).any()  # a prompt token equal to the pad id: Hugging Face must not take it for padding
    real = dict(attention_mask=torch.ones_like(prompts), pad_token_id=0)
    ours = generate(model, prompts, 25, use_cache=use_cache)
    theirs = hf.generate(prompts, do_sample=False, max_new_tokens=25, **real)
    assert ours.shape == (2, 31)
    assert torch.equal(ours, theirs)
    assert len(set(ours[0, 6:].tolist())) > 2  # a real continuation, not one repeated token

    # Stopping at an end token: a token the first row produces part-way through.
    eos = ours[0, 15].item()
    stopped = generate(model, prompts, 25, eos_token_id=eos, pad_token_id=0, use_cache=use_cache)
    theirs = hf.generate(prompts, do_sample=False, max_new_tokens=25, eos_token_id=eos, **real)
    assert torch.equal(stopped, theirs)
    first_eos = (stopped[0, 6:] == eos).nonzero()[0, 0].item() + 6
    assert (stopped[0, first_eos + 1 :] == 0).all()


@pytest.mark.parametrize("window", [None, 10])  # the model's positions, or a shorter trained length
def test_greedy_tokens_are_the_argmax_also_past_the_window(window):
    model, length = ours_model(), window or MAX_POSITIONS
    prompt = random_ids(1, length - 4)
    out = generate(model, prompt, 12, window=window)
    assert out.shape == (1, length + 8)
    assert torch.equal(out, generate(model, prompt, 12, use_cache=False, window=window))
    with torch.no_grad():
        for end in range(length - 4, length + 8):
            read = out[:, max(0, end - length) : end]
            assert model(read)[0, -1].argmax().item() == out[0, end].item()


def test_no_padded_output_row_is_ever_chosen():
    """An import may have output rows past its tokenizer's tokens (`pad_to_multiple_of`)."""
    model, tokens = ours_model(), VOCAB - 9
    forward = model.forward

    def padded_row_first(*args, **kwargs):
        logits = forward(*args, **kwargs)
        logits[..., VOCAB - 1] += 100.0  # the largest logit by far, on a row that is no token
        return logits

    model.forward = padded_row_first
    prompt = random_ids(2, 4) % tokens
    assert (generate(model, prompt, 5)[:, 4:] == VOCAB - 1).all()
    for settings in ({}, dict(do_sample=True, temperature=5.0, seed=0)):
        assert generate(model, prompt, 20, vocab_size=tokens, **settings).max() < tokens


def test_the_window_defaults_to_the_length_the_model_was_trained_at():
    """A model opened from a folder carries that length (`max_length`); positions past it never trained."""
    model = ours_model()
    model.max_length = 10
    prompt = random_ids(1, 6)
    out = generate(model, prompt, 12)
    assert torch.equal(out, generate(model, prompt, 12, window=10))
    assert not torch.equal(out, generate(model, prompt, 12, window=MAX_POSITIONS))


def test_sampling_with_a_seed_is_reproducible():
    model = ours_model()
    prompt = random_ids(1, 4)[0]
    settings = dict(do_sample=True, temperature=2.0, top_k=20, top_p=0.95)
    first = generate(model, prompt, 30, seed=11, **settings)
    assert first.shape == (34,) and torch.equal(first[:4], prompt)
    assert torch.equal(first, generate(model, prompt, 30, seed=11, **settings))
    assert torch.equal(first, generate(model, prompt, 30, seed=11, use_cache=False, **settings))
    assert not torch.equal(first, generate(model, prompt, 30, seed=12, **settings))
    assert not torch.equal(first, generate(model, prompt, 30))  # not greedy


def test_sampling_never_leaves_the_top_k():
    model = ours_model()
    prompt = random_ids(4, 3)
    out = generate(model, prompt, 40, do_sample=True, temperature=5.0, top_k=3, seed=0)
    with torch.no_grad():
        logits = model(out[:, :-1])[:, 2:]  # (4, 40, V): the scores each sampled token was drawn from
    top3 = logits.topk(3, dim=-1).indices
    sampled = out[:, 3:]
    assert (top3 == sampled[..., None]).any(-1).all()
    assert (top3[..., 0] != sampled).float().mean() > 0.3  # the flat temperature spreads the draws
    assert torch.equal(
        generate(model, prompt, 10, do_sample=True, top_k=1, seed=5), generate(model, prompt, 10)
    )


def test_sampling_at_a_tiny_temperature_is_greedy_decoding():
    """The softmax of logits / 1e-40 is one-hot on the most likely token, not inf / inf."""
    model = ours_model()
    prompt = random_ids(2, 4)
    greedy = generate(model, prompt, 12)
    for temperature in (1e-40, 1e-300):
        assert torch.equal(
            generate(model, prompt, 12, do_sample=True, temperature=temperature, seed=0), greedy
        )


def test_filter_logits_top_k_and_top_p():
    logits = torch.tensor([[0.5, 0.2, 0.1, 0.15, 0.05]]).log()
    kept = lambda filtered: torch.isfinite(filtered[0]).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [0, 1]
    assert kept(filter_logits(logits, top_p=0.5)) == [0]  # the first token alone holds 0.5
    assert kept(filter_logits(logits, top_p=0.6)) == [0, 1]
    assert kept(filter_logits(logits, top_p=0.85)) == [0, 1, 3]
    assert kept(filter_logits(logits, top_k=2, top_p=0.99)) == [0, 1]
    assert torch.equal(filter_logits(logits, top_k=0, top_p=1.0), logits)
    torch.testing.assert_close(filter_logits(logits, top_k=3)[0, [0, 1, 3]], logits[0, [0, 1, 3]])


def test_generation_settings_are_checked_and_the_mode_restored():
    model = ours_model().train()
    prompt = random_ids(1, 3)
    for bad, match in [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
    ]:
        with pytest.raises(BertforgeError, match=match):
            generate(model, prompt, **{"max_new_tokens": 2, "do_sample": True, **bad})
    with pytest.raises(BertforgeError, match="at least one token"):
        generate(model, prompt[:, :0], 2)
    assert torch.equal(generate(model, prompt, 0), prompt)
    assert model.training  # generation ran in eval mode and put the model back


# ------------------------------------------------------------------ the text-generation pipeline


def test_text_generation_pipeline_loads_an_exported_folder(tmp_path, small_tokenizer_dir):
    from bertforge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(small_tokenizer_dir)
    model = ours_model(vocab_size=tokenizer.vocab_size)
    save_hf_folder(model, tmp_path / "gpt", tokenizer)
    generator = transformers.pipeline("text-generation", model=str(tmp_path / "gpt"))

    prompt = "the album was released in"
    prompt_ids = tokenizer.encode_batch([prompt])[0]
    assert generator.tokenizer(prompt)["input_ids"] == prompt_ids  # no [CLS] / [SEP] around a prompt
    result = generator(prompt, do_sample=False, max_new_tokens=12, return_tensors=True)
    ours = generate(model, torch.tensor(prompt_ids), 12, eos_token_id=tokenizer.sep_id)
    assert result[0]["generated_token_ids"] == ours.tolist()

    text = generator(prompt, do_sample=False, max_new_tokens=12)[0]["generated_text"]
    new_ids = ours[len(prompt_ids) :].tolist()
    assert text == prompt + generator.tokenizer.decode(new_ids, skip_special_tokens=True)

    # Decoding: a word-initial token brings its space, a ## piece joins the word before it.
    hf_tokenizer = generator.tokenizer
    sentence = tokenizer.encode_batch(["the song was released in 2005 , and it sold well ."])[0]
    assert hf_tokenizer.decode(sentence) == " " + tokenizer.decode(sentence)
    pieces = tokenizer.encode_batch(["unreleased"])[0]
    assert len(pieces) > 1 and tokenizer.convert_ids_to_tokens(pieces)[1].startswith("##")
    first = tokenizer.convert_ids_to_tokens(pieces)[0]
    assert hf_tokenizer.decode(pieces) == " unreleased"
    assert hf_tokenizer.decode(pieces[1:]) == "unreleased".removeprefix(first)  # "##": no space, no ##
    assert prompt + hf_tokenizer.decode(sentence) == f"{prompt} {tokenizer.decode(sentence)}"


def test_bf16_causal_attention_on_cpu_runs_unfused_and_agrees_with_sdpa():
    # In bf16 on CPU the unfused path is the faster one (fast_ops docstring), as for BERT's attention.
    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 3, 6, 8, dtype=torch.bfloat16) for _ in range(3))
    got = causal_attention(q, k, v, None, 0.1, training=False)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    scores = ((q * 8**-0.5) @ k.transpose(-2, -1)).masked_fill(~causal, float("-inf"))
    torch.testing.assert_close(got, scores.softmax(-1) @ v, rtol=0, atol=0)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)
    fp32 = [t.float() for t in (q, k, v)]
    torch.testing.assert_close(causal_attention(*fp32, None, 0.1, training=False), expected)

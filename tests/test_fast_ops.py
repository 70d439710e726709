"""fast_ops computes what torch's dropout, attention and cross-entropy compute."""

import pytest
import torch
import torch.nn.functional as F

from bertforge.fast_ops import Dropout, _uniform_int16, attention, cross_entropy_sum, dropout


def test_dropout_drops_p_and_keeps_the_mean():
    torch.manual_seed(0)
    x = torch.ones(1_000_000)
    y = dropout(x, 0.1)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002  # binomial sd over 1e6 draws is 0.0003
    assert abs(y.mean().item() - 1.0) < 0.003  # kept values scaled by the inverse keep rate
    kept = y[y != 0]
    torch.testing.assert_close(
        kept, torch.full_like(kept, 65536 / (65536 - round(0.1 * 65536))), rtol=1e-5, atol=1e-8
    )


def test_dropout_draws_are_uniform_and_independent_of_position():
    torch.manual_seed(1)
    draws = _uniform_int16(torch.Size([400_000])).long() + 32768  # 0..65535
    histogram = torch.bincount(draws // 4096, minlength=16).float()  # 16 bins of 25,000 expected
    assert (histogram - 25_000).abs().max() < 800  # ~5 sd
    lanes = draws.view(-1, 4).float().mean(0)  # the four 16-bit lanes of each 64-bit draw
    assert (lanes - 32767.5).abs().max() < 300


def test_dropout_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 32, requires_grad=True)
    y = dropout(x, 0.25)
    y.backward(torch.ones_like(y))
    kept = y != 0
    assert torch.equal(x.grad != 0, kept)
    torch.testing.assert_close(
        x.grad[kept], torch.full_like(x.grad[kept], 65536 / (65536 - 16384)), rtol=1e-5, atol=1e-8
    )


def test_dropout_is_the_identity_in_eval_and_at_zero_and_seeded_in_training():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    module = Dropout(0.1)
    module.eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x
    module.train()
    torch.manual_seed(3)
    first = module(x)
    torch.manual_seed(3)
    assert torch.equal(module(x), first)
    assert first.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        Dropout(1.5)


def test_attention_without_dropout_is_sdpa_with_the_padding_mask():
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(attention(q, k, v, mask, 0.1, training=False), expected, rtol=1e-5, atol=1e-6)


def test_bf16_attention_without_dropout_runs_unfused_and_agrees_with_sdpa():
    # In bf16 on CPU the unfused path is the faster one (fast_ops docstring), dropout or not.
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    got = attention(q, k, v, mask, 0.1, training=False)
    scores = ((q * 8**-0.5) @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(got, scores.softmax(-1) @ v, rtol=0, atol=0)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)


def test_attention_with_dropout_drops_probabilities_with_the_dropout_mask():
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    torch.manual_seed(6)
    got = attention(q, k, v, mask, 0.2, training=True)
    scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~mask, float("-inf"))
    torch.manual_seed(6)
    expected = dropout(scores.softmax(-1), 0.2) @ v  # the same draws in the same order
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_sum_matches_torch_in_value_and_gradient(dtype):
    torch.manual_seed(7)
    rows, classes = 70, 40_000  # several row chunks (2**20 elements each), the last one partial
    logits = (torch.randn(rows, classes) * 3).to(dtype)
    labels = torch.randint(classes, (rows,))
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = cross_entropy_sum(ours_in, labels)
    ref = F.cross_entropy(ref_in.float(), labels, reduction="sum")
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-8)
    (ours * 0.5).backward()
    (ref * 0.5).backward()
    assert ours_in.grad.dtype == dtype
    torch.testing.assert_close(
        ours_in.grad.float(), ref_in.grad.float(), rtol=1e-5, atol=1e-6 if dtype == torch.float32 else 4e-3
    )


def test_cross_entropy_sum_rounds_a_confident_rows_gradient_once_in_bf16():
    """For a label of probability p near 1 the gradient there is p - 1, small: taken in float32 and
    rounded once to bf16 it keeps its digits, where rounding p first (to 1, say) would lose them."""
    torch.manual_seed(3)
    rows, classes = 64, 1000
    labels = torch.randint(classes, (rows,))
    logits = torch.randn(rows, classes)
    logits[torch.arange(rows), labels] += torch.linspace(8.0, 14.0, rows)  # p from about 0.9 to 0.9999
    logits = logits.bfloat16().requires_grad_()
    cross_entropy_sum(logits, labels).backward()
    reference = torch.autograd.grad(F.cross_entropy(logits.float(), labels, reduction="sum"), logits)[0]
    at_label = torch.arange(rows), labels
    expected = reference.float()[at_label]  # p - 1, in float32
    assert (expected < -1e-4).all()  # confident, not certain: the test would show nothing otherwise
    got = logits.grad.float()[at_label]
    torch.testing.assert_close(got, expected, rtol=2**-7, atol=0)  # a bf16 rounding, and float32 noise


def test_a_dropout_rate_within_a_draw_of_one_drops_everything():
    x = torch.ones(1000)
    out = dropout(x, 1 - 1e-8)  # round(p * 65536) == 65536: no 16-bit draw may keep a value
    assert torch.isfinite(out).all() and (out == 0).float().mean() > 0.99

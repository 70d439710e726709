"""The GPU and multi-GPU paths' logic, tested on CPU with CUDA and the process group mocked.

A machine with a GPU runs the real thing in `test_gpu.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import metrics_lines, tiny_config

from bertforge import compiling, distributed, precision, pretrain, runtime, train
from bertforge.batches import real_tokens, shape_batch
from bertforge.checkpoint import encode_rng, read_config, restore_rng_states, rng_states
from bertforge.config import DataConfig, ModelConfig, RunConfig, RuntimeConfig, apply_overrides, validate
from bertforge.errors import BertforgeError
from bertforge.fast_ops import cross_entropy_sum
from bertforge.finetune import ClassificationCollator, classification_loss, evaluate_classifier
from bertforge.losses import NO_LABEL, Summary, pretraining_sums
from bertforge.masking import pretraining_collator
from bertforge.model import BertForPreTraining, BertForSequenceClassification
from bertforge.tokenizer import load_tokenizer

CUDA0 = torch.device("cuda", 0)


def torchrun_env(monkeypatch, rank: int = 1, world_size: int = 2) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


# 1. Collective timeout, and the cache filled before the process group exists.


def test_the_timeout_reaches_init_process_group(monkeypatch):
    torchrun_env(monkeypatch)
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(distributed.atexit, "register", lambda fn: None)
    distributed.setup(torch.device("cpu"), timeout_minutes=90)
    assert calls == [(("gloo",), {"timeout": timedelta(minutes=90)})]
    assert RuntimeConfig().dist_timeout_minutes >= 30  # generous by default, unlike nccl's 10 minutes
    config = RunConfig()
    apply_overrides(config, ["runtime.dist_timeout_minutes=0"])
    with pytest.raises(BertforgeError, match="dist_timeout_minutes"):
        validate(config)


def test_the_cache_is_filled_before_the_process_group_exists(
    tmp_path, wiki_slice, wiki_valid_slice, small_tokenizer_dir, monkeypatch
):
    events = []

    def spy(name, function):
        def wrapped(*args, **kwargs):
            events.append(name)
            return function(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(pretrain, "cached_shards", spy("cache", pretrain.cached_shards))
    monkeypatch.setattr(pretrain, "run_tokenizer", spy("cache", pretrain.run_tokenizer))
    for collective in ("setup", "barrier", "broadcast_float", "all_reduce_sum", "gather_objects"):
        monkeypatch.setattr(distributed, collective, spy(collective, getattr(distributed, collective)))
    config = tiny_config(wiki_slice, wiki_valid_slice, max_steps=1, eval_every=1)
    pretrain.pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert events.count("cache") == 3  # the tokenizer, the training and the validation shards
    first_collective = next(i for i, name in enumerate(events) if name != "cache")
    assert events[first_collective] == "setup"  # joining the process group comes first of all
    assert "cache" not in events[first_collective:]


# 2. RNG states: only the process's own GPU.


@pytest.fixture
def fake_gpus(monkeypatch):
    """A machine with one GPU: the states set are recorded, not applied, and the all-GPU calls fail
    as they did when a checkpoint held more GPUs than were visible."""
    applied = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state", lambda device="cuda": torch.full((16,), 7, dtype=torch.uint8)
    )
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, device="cuda": applied.append((state, device))
    )

    def every_gpu(*args):
        raise IndexError("device index out of range")  # what the old code met with fewer GPUs visible

    monkeypatch.setattr(torch.cuda, "get_rng_state_all", every_gpu)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", every_gpu)
    return applied


def test_a_checkpoint_with_eight_gpu_states_resumes_with_one_visible(fake_gpus):
    eight = [torch.full((16,), gpu, dtype=torch.uint8) for gpu in range(8)]
    saved = {"torch_cpu": encode_rng(torch.get_rng_state()), "torch_cuda": [encode_rng(s) for s in eight]}
    restore_rng_states(json.loads(json.dumps(saved)), CUDA0)
    assert len(fake_gpus) == 1
    state, device = fake_gpus[0]
    assert torch.equal(state, eight[0]) and device == CUDA0


def test_checkpoints_keep_only_the_own_gpus_state(fake_gpus):
    states = rng_states(torch.device("cuda", 3))
    assert isinstance(states["torch_cuda"], str)  # one state, not one per visible GPU
    restore_rng_states(states, CUDA0)  # resumed on a machine with one GPU
    assert [device for _, device in fake_gpus] == [CUDA0]
    assert torch.equal(fake_gpus[0][0], torch.full((16,), 7, dtype=torch.uint8))
    assert "torch_cuda" not in rng_states(torch.device("cpu"))
    restore_rng_states(states, torch.device("cpu"))  # a GPU checkpoint resumed on CPU
    assert len(fake_gpus) == 1


# 3. `cuda:N` under torchrun.


def test_an_explicit_gpu_under_torchrun_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = distributed.launched()
    assert distributed.local_device(torch.device("cuda", 1), one) == torch.device("cuda", 1)
    torchrun_env(monkeypatch, rank=1)
    world = distributed.launched()
    assert distributed.local_device(torch.device("cuda"), world) == torch.device("cuda", 1)
    with pytest.raises(BertforgeError, match="same GPU.*runtime.device=cuda.*CUDA_VISIBLE_DEVICES"):
        distributed.local_device(torch.device("cuda", 1), world)


def test_pretrain_refuses_cuda_n_under_torchrun_before_any_work(tmp_path, wiki_slice, monkeypatch):
    torchrun_env(monkeypatch, rank=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a machine with cuda:1
    monkeypatch.setattr(pretrain, "cached_shards", lambda *a, **k: pytest.fail("the cache was touched"))
    config = tiny_config(wiki_slice)
    config.runtime.device = "cuda:1"
    with pytest.raises(BertforgeError, match="would put every torchrun process on the same GPU"):
        pretrain.pretrain(config, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()


# 4. No host round trips in the step.


def tiny_model_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


class HostTensors:
    """`torch.tensor(..., device=...)` calls (a host value copied to the device) made while active."""

    def __init__(self) -> None:
        self.made: list = []
        self.active = True


@pytest.fixture
def host_tensors(monkeypatch) -> HostTensors:
    watch, original = HostTensors(), torch.tensor

    def tensor(*args, **kwargs):
        if watch.active and kwargs.get("device") is not None:
            watch.made.append(kwargs["device"])
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    return watch


def test_the_training_step_builds_no_host_tensor(
    tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch, host_tensors
):
    host_tensors.active = False
    step = train.Trainer.accumulate_gradients

    def watched_step(self, model, batches):
        host_tensors.active = True
        try:
            return step(self, model, batches)
        finally:
            host_tensors.active = False

    monkeypatch.setattr(train.Trainer, "accumulate_gradients", watched_step)
    config = tiny_config(wiki_slice, max_steps=2, eval_every=2)
    config.runtime.device = "cpu"  # the logic, on CPU even where a GPU is visible
    config.train.gradient_accumulation_steps = 2
    pretrain.pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    assert [x["step"] for x in metrics_lines(tmp_path / "run", "train")] == [1, 2]
    assert host_tensors.made == []


def test_the_classification_loss_builds_no_host_tensor(host_tensors):
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_model_config(), num_labels=3)
    batch = ClassificationCollator(pad_id=0)(
        [{"input_ids": [2, 7, 9, 3], "label": 1}, {"input_ids": [2, 8, 3], "label": 2}]
    )
    loss, sums = classification_loss(model, batch)
    assert host_tensors.made == []
    assert int(sums["count"]) == 2 and torch.isfinite(loss)


def test_log_lines_take_metrics_in_one_transfer(monkeypatch):
    window = train.Window()
    for _ in range(3):
        window.add({"mlm_loss_sum": torch.tensor(6.0), "mlm_count": torch.tensor(3)}, tokens=10)
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: pytest.fail("one float() per value"))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("one item() per value"))

    def summarize(totals):
        loss = totals["mlm_loss_sum"] / totals["mlm_count"]
        return Summary(loss, {"mlm_loss": loss})

    record, tokens = window.flush(summarize, 1e-3)
    assert record["mlm_loss"] == record["loss"] == 2.0 and tokens == 30


def test_the_clock_is_shared_every_log_every_steps_under_ddp(monkeypatch):
    broadcasts = []
    monkeypatch.setattr(distributed, "broadcast_float", lambda value: broadcasts.append(value) or 42.0)
    trainer = SimpleNamespace(
        world=distributed.World(rank=1, world_size=2),
        schedule=SimpleNamespace(budget_s=600.0),
        train_cfg=SimpleNamespace(log_every=5),
        state=train.TrainState(),
        clock=0.0,
        clock_read=None,
    )
    seen = set()
    for step in range(20):  # the loop reads the clock at the top and again after the step
        trainer.state.step = step
        seen.add(train.Trainer.elapsed(trainer))
        trainer.state.step = step + 1
        seen.add(train.Trainer.elapsed(trainer))
    assert len(broadcasts) == 5  # at the start, then at steps 5, 10, 15 and 20; not 40
    assert seen == {42.0}  # every rank uses rank 0's reading


def test_classifier_evaluation_avoids_bincount(monkeypatch):
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_model_config(), num_labels=3)
    collate = ClassificationCollator(pad_id=0)
    examples = [{"input_ids": [2, 5 + i, 9, 3][: 3 + i % 2], "label": i % 3} for i in range(10)]
    batches = [collate(examples[:6]), collate(examples[6:])]
    monkeypatch.setattr(torch, "bincount", lambda *a, **k: pytest.fail("bincount syncs on CUDA"))
    metrics, confusion, predictions = evaluate_classifier(model, batches, num_labels=3)
    expected = [[0] * 3 for _ in range(3)]
    for example, predicted in zip(examples, predictions, strict=True):
        expected[example["label"]][predicted] += 1
    assert confusion == expected
    assert metrics["accuracy"] == sum(expected[i][i] for i in range(3)) / 10


def test_background_workers_by_default_on_cuda_only():
    assert runtime.data_workers(RuntimeConfig(), torch.device("cuda")) == runtime.CUDA_WORKERS > 0
    assert runtime.data_workers(RuntimeConfig(), torch.device("cpu")) == 0
    assert runtime.data_workers(RuntimeConfig(num_workers=0), torch.device("cuda")) == 0
    assert runtime.data_workers(RuntimeConfig(num_workers=3), torch.device("cpu")) == 3
    config = RunConfig()
    config.runtime.num_workers = -2
    with pytest.raises(BertforgeError, match="num_workers"):
        validate(config)


# 5. TF32 and bf16 against the hardware.


def test_tf32_on_cuda_unless_turned_off(monkeypatch):
    set_to = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", set_to.append)
    runtime.use_tf32(torch.device("cuda"), enabled=True)
    runtime.use_tf32(torch.device("cuda"), enabled=False)
    runtime.use_tf32(torch.device("cpu"), enabled=True)  # CPU matmuls are left alone
    assert set_to == ["high", "highest"]
    assert RuntimeConfig().tf32


@pytest.mark.parametrize(
    ("gpu", "capability", "native"),
    [
        ("Tesla V100", (7, 0), False),
        ("Tesla T4", (7, 5), False),
        ("A100", (8, 0), True),
        ("H100", (9, 0), True),
    ],
)
def test_bf16_is_checked_against_the_gpu(monkeypatch, tmp_path, gpu, capability, native):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    assert precision.native_bf16(CUDA0) is native
    assert precision.choose_precision(ModelConfig(), CUDA0, tmp_path).precision == (
        "bf16" if native else "fp16"
    )
    precision.check_precision(CUDA0, "fp16")
    precision.check_precision(torch.device("cpu"), "bf16")
    if native:
        precision.check_precision(CUDA0, "bf16")
    else:
        with pytest.raises(BertforgeError, match=f"{gpu} .*no native bf16.*runtime.precision=fp16"):
            precision.check_precision(CUDA0, "bf16")


# 6. torch.compile: fixed shapes, one compilation; chunked cross-entropy with ignored rows.


@pytest.fixture
def tokenizer(small_tokenizer_dir):
    return load_tokenizer(small_tokenizer_dir)


def pair(tokenizer, length: int, offset: int = 0) -> dict:
    words = [tokenizer.cls_id] + [100 + (offset + i) % 500 for i in range(length - 2)] + [tokenizer.sep_id]
    return {"input_ids": words, "token_type_ids": [0] * length, "nsp_label": 0}


@torch.no_grad()
def batch_sums(model: BertForPreTraining, batch: dict) -> dict[str, torch.Tensor]:
    mlm_logits, nsp_logits = model(
        batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch.get("attention_mask"),
        masked_positions=batch["masked_positions"],
    )
    vocab_size = model.config.vocab_size
    return pretraining_sums(mlm_logits, batch["masked_labels"], nsp_logits, batch["nsp_labels"], vocab_size)


def test_fixed_shapes_keep_every_batch_alike_and_the_loss_unchanged(tokenizer):
    data = DataConfig(max_seq_length=32)
    eager, fixed = (
        pretraining_collator(tokenizer, data),
        pretraining_collator(tokenizer, data, fixed_shapes=True),
    )
    torch.manual_seed(0)
    sizes = dict(tiny_model_config().__dict__, vocab_size=tokenizer.vocab_size)
    model = BertForPreTraining(ModelConfig(**sizes)).eval()
    shapes = set()
    for lengths in ([12, 20, 7], [32, 5, 9], [14, 14, 14]):
        examples = [pair(tokenizer, n, i) for i, n in enumerate(lengths)]
        a = eager(examples, generator=torch.Generator().manual_seed(1))
        b = fixed(examples, generator=torch.Generator().manual_seed(1))
        shapes.add(tuple((key, tuple(value.shape)) for key, value in sorted(b.items())))
        m = a["masked_positions"].numel()
        assert torch.equal(
            b["input_ids"].view(-1)[b["masked_positions"][:m]], a["input_ids"].view(-1)[a["masked_positions"]]
        )
        assert torch.equal(b["masked_labels"][:m], a["masked_labels"])
        assert (b["masked_labels"][m:] == NO_LABEL).all() and (b["masked_positions"][m:] == 0).all()
        assert real_tokens(a) == real_tokens(b) == sum(lengths)
        sums = [batch_sums(model, x) for x in (a, b)]
        assert int(sums[1]["mlm_count"]) == int(sums[0]["mlm_count"]) == m
        assert int(sums[1]["mlm_correct"]) == int(sums[0]["mlm_correct"])
        assert float(sums[1]["mlm_loss_sum"]) == pytest.approx(float(sums[0]["mlm_loss_sum"]), rel=1e-5)
    assert len(shapes) == 1  # one shape for every batch of three sequences
    assert dict(next(iter(shapes)))["input_ids"] == (3, 32)


def test_cross_entropy_ignores_unlabelled_rows():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, requires_grad=True)
    labels = torch.tensor([3, NO_LABEL, 0, 10, NO_LABEL, 5, 1])
    ours = cross_entropy_sum(logits, labels)
    (grad,) = torch.autograd.grad(ours, logits)
    reference = F.cross_entropy(logits, labels, ignore_index=NO_LABEL, reduction="sum")
    (expected,) = torch.autograd.grad(reference, logits)
    assert float(ours.detach()) == pytest.approx(float(reference.detach()), rel=1e-6)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    assert (grad[labels == NO_LABEL] == 0).all()


def compiled_run(tmp_path, corpus, tokenizer_dir, monkeypatch, backend, dropout: float = 0.1) -> None:
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=backend, **kw))
    torch._dynamo.reset()
    config = tiny_config(corpus, max_steps=20, eval_every=20)
    config.runtime.device = "cpu"  # the logic, on CPU even where a GPU is visible
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = dropout
    config.runtime.compile = True
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch.compile failed")  # it must really compile
        pretrain.pretrain(config, tmp_path / "run", tokenizer_dir=tokenizer_dir, show_progress=False)
    assert [x["step"] for x in metrics_lines(tmp_path / "run", "train")] == list(range(1, 21))


def test_compiled_training_compiles_once(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch):
    """Dynamo's graphs, counted with a backend that runs them as they are (no C++ compiler needed)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled_run(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch, counter)
    assert counter.frame_count == 1  # masked-token counts and lengths vary; the shapes do not


def has_cpp_compiler() -> bool:

    return any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if name)


@pytest.mark.slow
@pytest.mark.skipif(not has_cpp_compiler(), reason="no C++ compiler: inductor cannot compile on CPU")
def test_training_compiled_with_inductor_compiles_once_and_follows_eager_training(
    tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch
):
    from torch._dynamo.utils import counters

    counters.clear()
    compiled_run(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch, "inductor", dropout=0.0)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    config = read_config(tmp_path / "run")
    config.runtime.compile = False
    pretrain.pretrain(config, tmp_path / "eager", tokenizer_dir=small_tokenizer_dir, show_progress=False)
    eager, compiled = (
        [x["loss"] for x in metrics_lines(tmp_path / name, "train")] for name in ("eager", "run")
    )
    assert compiled == pytest.approx(eager, rel=1e-4)


# 7. No attention mask for a batch without padding.


def test_a_batch_without_padding_passes_no_mask(tokenizer):
    collate = pretraining_collator(tokenizer, DataConfig(max_seq_length=32))
    full = collate([pair(tokenizer, 12, i) for i in range(3)], generator=torch.Generator().manual_seed(0))
    padded = collate([pair(tokenizer, n, n) for n in (12, 9)], generator=torch.Generator().manual_seed(0))
    assert "attention_mask" not in full and real_tokens(full) == 36
    assert padded["attention_mask"].sum() == 21
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, input_ids, token_type_ids, attention_mask, masked_positions):
            seen.append(attention_mask)
            return torch.zeros(masked_positions.numel(), 5), torch.zeros(input_ids.shape[0], 2)

    for batch in (full, padded):
        batch = dict(batch, masked_labels=torch.zeros_like(batch["masked_labels"]))
        pretrain.masked_lm_and_nsp_loss(Spy(), batch, vocab_size=5)
    assert seen[0] is None and seen[1] is padded["attention_mask"]
    fixed = pretraining_collator(tokenizer, DataConfig(max_seq_length=32), fixed_shapes=True)
    # compiled: one graph for all batches, so the mask stays even without padding
    assert "attention_mask" in fixed([pair(tokenizer, 32, i) for i in range(2)], generator=torch.Generator())
    classification = ClassificationCollator(pad_id=0)([{"input_ids": [2, 5, 3], "label": 0}] * 2)
    assert "attention_mask" not in classification
    assert "attention_mask" in shape_batch(dict(classification, attention_mask=torch.ones(2, 3)), 0, width=8)


# 8. The compile fall-back: compile errors only, a clean redo, all ranks alike.


class FailsInSecondBackward(torch.nn.Module):
    """A compiled model that works for the first micro-batch and fails to compile in the backward of
    the second, after the heads' gradients have accumulated (a partial backward)."""

    def __init__(self, model, **options):
        super().__init__()
        self._orig_mod = model
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls != 2:
            return self._orig_mod(*args, **kwargs)

        def fail(grad):
            raise torch._dynamo.exc.BackendCompilerFailed(lambda: None, RuntimeError("no C++ compiler"), None)

        hook = self._orig_mod.bert.embeddings.register_forward_hook(
            lambda m, i, out: out.register_hook(fail) and None
        )
        try:
            return self._orig_mod(*args, **kwargs)
        finally:
            hook.remove()


def test_compile_failure_redoes_the_step_cleanly(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch):
    def run(name, compile_as):
        monkeypatch.setattr(torch, "compile", compile_as)
        config = tiny_config(wiki_slice, max_steps=3, eval_every=3)  # with dropout
        config.runtime.device = "cpu"  # the logic, on CPU even where a GPU is visible
        config.train.gradient_accumulation_steps = 2
        config.runtime.compile = True
        pretrain.pretrain(config, tmp_path / name, tokenizer_dir=small_tokenizer_dir, show_progress=False)
        return [x["loss"] for x in metrics_lines(tmp_path / name, "train")]

    eager = run("eager", lambda model, **options: model)  # the same fixed-shape batches, never compiled
    with pytest.warns(UserWarning, match="torch.compile failed .*training in eager mode"):
        redone = run("redone", FailsInSecondBackward)
    assert redone == eager  # no doubled gradients, the same dropout draws


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory"),
        torch.distributed.DistBackendError("NCCL error: unhandled system error"),
        torch._dynamo.exc.BackendCompilerFailed(
            lambda: None, torch.OutOfMemoryError("while autotuning"), None
        ),
        ValueError("a bug"),
    ],
)
def test_only_compile_errors_fall_back(tmp_path, wiki_slice, small_tokenizer_dir, monkeypatch, error):
    class Raises(torch.nn.Module):
        def __init__(self, model, **options):
            super().__init__()
            self._orig_mod = model

        def forward(self, *args, **kwargs):
            raise error

    monkeypatch.setattr(torch, "compile", Raises)
    config = tiny_config(wiki_slice, max_steps=2, eval_every=2)
    config.runtime.device = "cpu"  # the logic, on CPU even where a GPU is visible
    config.runtime.compile = True
    with pytest.raises(type(error)):
        pretrain.pretrain(config, tmp_path / "run", tokenizer_dir=small_tokenizer_dir, show_progress=False)


def test_is_compile_error():
    assert compiling.is_compile_error(
        torch._dynamo.exc.BackendCompilerFailed(lambda: None, RuntimeError("x"), None)
    )
    assert not compiling.is_compile_error(RuntimeError("backend compiler failed"))  # not torch.compile's own


def test_all_ranks_fall_back_when_one_does(monkeypatch):
    class Compiled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self._orig_mod = torch.nn.Linear(1, 1)

    trainer = SimpleNamespace(step_model=Compiled(), compile_unconfirmed=True)
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda values: [1.0])  # another rank is eager
    with pytest.warns(UserWarning, match="another process"):
        train.Trainer.agree_on_compiling(trainer)
    assert isinstance(trainer.step_model, torch.nn.Linear) and not trainer.compile_unconfirmed
    trainer = SimpleNamespace(step_model=Compiled(), compile_unconfirmed=True)
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda values: [0.0])  # every rank compiled
    train.Trainer.agree_on_compiling(trainer)
    assert isinstance(trainer.step_model, Compiled)


# 9. MFU and peak memory in the train records on CUDA; nothing new on CPU.


def test_train_records_on_cuda_carry_mfu_and_peak_memory(monkeypatch, tiny_pretrained_run):
    from bertforge import flops
    from bertforge.metrics_log import DeviceFigures

    resets = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(device))
    config = tiny_model_config()
    figures = DeviceFigures(config, CUDA0, world_size=2)
    window = train.Window()
    for _ in range(4):
        window.add({"mlm_count": torch.tensor(10.0), "nsp_count": torch.tensor(8.0)}, tokens=8 * 64)
    seen = []

    def measured(totals, tokens, seconds):
        seen.append((totals, tokens, seconds))
        return figures(totals, tokens, seconds, seq_len=64)

    record, _ = window.flush(lambda totals: Summary(1.0, {}), 1e-3, measured)
    ((totals, tokens, seconds),) = seen
    assert totals == {"mlm_count": 40.0, "nsp_count": 32.0} and tokens == 4 * 8 * 64 and seconds > 0
    work = flops.training_flops(config, tokens, 64, predicted=40, sequences=32)
    assert record["mfu"] == round(work / seconds / (2 * 989e12), 4)  # both ranks' peak
    assert record["peak_memory_gib"] == 3.0 and resets == [CUDA0]  # the next window starts afresh
    unknown = DeviceFigures(config, CUDA0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert DeviceFigures(config, CUDA0)(totals, tokens, seconds, 64) == {"peak_memory_gib": 3.0}
    assert unknown.peak == 989e12
    assert DeviceFigures(config, torch.device("cpu"))(totals, tokens, seconds, 64) == {}
    on_gpu = torch.cuda.is_available()  # the fixture's run took the device "auto" picks
    for line in metrics_lines(tiny_pretrained_run, "train"):  # a CPU run's records are as they were
        assert ("peak_memory_gib" in line) == on_gpu  # mfu too where the GPU's peak is known
        assert on_gpu or "mfu" not in line

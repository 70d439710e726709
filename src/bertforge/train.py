"""The one training loop, shared by pretraining and fine-tuning.

An `Objective` says what is trained (model, batches per epoch, loss, evaluation); this module owns
how: the optimizer and its schedule over steps or a time budget (`bertforge.optimizer`), the end of
a sequence-length warmup (`Objective.warmup_batches` until its share of the run, then full-length
batches from the next epoch, recorded for resume), a masking rate set per epoch from the run's
progress (also recorded), gradient accumulation and clipping, autocast (fp32 / bf16 / fp16 with a
scaler), optional `torch.compile` (`bertforge.compiling`; a step that fails to compile is redone in
eager mode), periodic evaluation, `metrics.jsonl` (`bertforge.metrics_log`), atomic checkpoints and
exact resume. A checkpoint the disk refuses stops the run with one line, the previous checkpoint
intact; a last line of `metrics.jsonl` torn by a crash is dropped on resume.

A run that diverges stops with one line naming the step: a non-finite training loss, gradient norm
(checked on the clipping norm already computed, without a host sync per step), weights or validation
metric is caught at every log line and before every evaluation and checkpoint, so no non-finite
weights are ever saved and the last good checkpoint stays. `--resume` skips damaged checkpoints
(hash mismatch, unreadable files) with a warning and continues from the newest intact one.

Under torchrun the same loop trains with DistributedDataParallel (see `bertforge.distributed`):
rank r takes micro-batches r, r + W, r + 2W, ... of the same deterministic epoch, gradients are
all-reduced once per optimizer step (`no_sync` on the other micro-batches), logged sums and token
counts are summed over ranks, and only rank 0 evaluates and writes logs and checkpoints.

On a GPU a steady-state step does not make the device wait for the host: values stay on the
device until a log line (one transfer per `log_every` steps), and under DDP with a time budget
rank 0's clock is shared at those lines only, so a run may overshoot its budget by up to
`log_every` steps.

SIGINT (Ctrl-C) and SIGTERM (what schedulers and torchrun send) do not kill the loop: the handler only
records the signal (`bertforge.signals`), and the loop writes a checkpoint at the end of the step and
raises `Interrupted`, which says how to resume (the CLI exits with 128 + the signal's number). A
second signal acts at once.
Under DDP the ranks agree on stopping every `log_every` steps (one all-reduce), so that all of them
stop after the same step.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch.utils.data import Dataset

from bertforge import distributed
from bertforge.batches import batch_seed, real_tokens
from bertforge.cache import default_cache_dir
from bertforge.checkpoint import (
    DamagedCheckpoint,
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from bertforge.compiling import compile_model, for_batch, is_compile_error, is_compiled, warn_eager
from bertforge.config import RunConfig
from bertforge.errors import BertforgeError, Interrupted
from bertforge.io import WriteError
from bertforge.loader import EpochBatches, micro_batches
from bertforge.losses import Summary
from bertforge.metrics_log import DeviceFigures, MetricsLog, nonfinite
from bertforge.model import set_activation_checkpointing
from bertforge.optimizer import Schedule, build_optimizer
from bertforge.precision import agree_on_precision, check_precision, resolve_precision
from bertforge.progress import Progress, metrics_text, progress_bar, reader_left
from bertforge.runtime import autocast, data_workers, resolve_device, to_device, to_host, use_tf32
from bertforge.signals import StopSignals, stop_signals_held


@dataclass
class Objective:
    """What a run trains. `loss` returns a micro-batch's loss to minimise and named sums for logging;
    `summarize` turns the sums accumulated over a log window into its loss and reported metrics.

    Micro-batches hold `distributed.batch_plan(config.train).micro_batch` sequences (with one
    process: batch_size / gradient_accumulation_steps).
    """

    model: torch.nn.Module
    # epoch (and, with `masking_rate`, the epoch's rate) -> dataset whose item b is micro-batch b
    batches: Callable[..., Dataset]
    loss: Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    evaluate: Callable[[torch.nn.Module], dict[str, float]]
    summarize: Callable[[dict[str, float]], Summary]
    # A sequence-length warmup: the batches of the run's first `warmup_fraction` (of its progress,
    # `Schedule.progress`), after which the epoch under way is cut short and `batches` take over.
    warmup_batches: Callable[..., Dataset] | None = None
    warmup_fraction: float = 0.0
    # `evaluate` measures at the full length, which the warmup does not train on: this measures at the
    # warmup's length too while it lasts (split "valid_short" of `metrics.jsonl`). The two lengths
    # name the warmup's records and its end (split "warmup_end", at the first full-length step).
    warmup_evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None
    warmup_seq_len: int = 0
    seq_len: int = 0
    # A masking rate that changes over the run: progress -> rate. Each epoch takes the rate of the
    # progress where it starts, and its batches are then `batches(epoch, rate)` (and the warmup's).
    masking_rate: Callable[[float], float] | None = None
    # Told the step a resumed run restored (the newest intact checkpoint's), before its first step.
    restored: Callable[[int], None] | None = None


@dataclass
class TrainState:
    """Where a run stands: what every checkpoint's `state.json` holds besides the RNG states and file
    hashes that `checkpoint.save_checkpoint` adds, in this order, and what `--resume` restores."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # the data position: the epoch, and the micro-batches of it that all ranks took
    batch: int = 0
    elapsed_s: float = 0.0  # seconds of training, written at each checkpoint
    tokens: int = 0  # real tokens trained on, counted at each log line
    last_valid: dict[str, float] = field(default_factory=dict)  # the last evaluation's metrics
    valid_step: int | None = None  # the step of that evaluation (None in checkpoints that lack it)
    micro_batch: int = 0  # sequences per micro-batch: a resumed run must keep it
    world_size: int = 1  # the processes that trained the run
    warmup_end_epoch: int | None = None  # the first epoch after a sequence-length warmup, once it ended
    masking_epoch: int | None = None  # with `Objective.masking_rate`: the last epoch started, and its rate
    masking_rate: float | None = None

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, saved: dict) -> None:
        """Take the fields a checkpoint's state holds (a field one lacks stays as it is)."""
        for name in (f.name for f in fields(self)):
            if name in saved:
                setattr(self, name, saved[name])


def train(
    objective: Objective,
    config: RunConfig,
    run_dir: Path,
    resume: bool = False,
    show_progress: bool = True,
    on_resume: Callable[[], None] | None = None,
) -> dict:
    """Run the loop until the step or time budget is spent; return the last validation metrics.

    `on_resume`: called by rank 0 once a resumed run's checkpoint is restored and accepted, before
    its first step (where `pretrain` records the settings the run now continues with); not for a run
    resumed at its end, which trains nothing with them.
    Raises `Interrupted` after checkpointing when SIGINT or SIGTERM arrives meanwhile.
    """
    trainer = Trainer(objective, config, run_dir, resume)
    at_end = trainer.schedule.progress(trainer.state.step, trainer.state.elapsed_s) >= 1.0
    if resume and on_resume is not None and trainer.world.is_main and not at_end:
        on_resume()
    with trainer.signals:
        return trainer.run(show_progress)


class Trainer:
    """State of one run of the loop: model, optimizer, position in the data, clock and logs."""

    def __init__(self, objective: Objective, config: RunConfig, run_dir: Path, resume: bool) -> None:
        self.objective, self.config, self.run_dir = objective, config, run_dir
        self.train_cfg, self.runtime = config.train, config.runtime
        device = resolve_device(self.runtime.device)
        self.world = distributed.setup(device, self.runtime.dist_timeout_minutes)
        self.device = distributed.local_device(device, self.world)
        self.plan = distributed.batch_plan(self.train_cfg, self.world.world_size)
        self.model = objective.model.to(self.device)
        if self.runtime.precision == "auto":  # callers that save a config resolve it first (pretrain)
            resolve_precision(config, self.device, default_cache_dir())
            agree_on_precision(config)
        check_precision(self.device, self.runtime.precision)
        use_tf32(self.device, self.runtime.tf32)
        self.optimizer = build_optimizer(self.model, self.train_cfg, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.runtime.precision == "fp16" else None
        self.schedule = Schedule(self.train_cfg)
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.figures = DeviceFigures(getattr(self.model, "config", None), self.device, self.world.world_size)
        self.checkpoint_every = self.train_cfg.checkpoint_every or self.train_cfg.eval_every
        self.signals = StopSignals()
        self.state = TrainState(micro_batch=self.plan.micro_batch, world_size=self.world.world_size)
        self.resumed_from: Path | None = None  # the checkpoint a resumed run continues from
        if resume:
            self.restore()
        else:
            # The dropout stream (the model was seeded by its builder); each rank draws its own.
            torch.manual_seed(self.runtime.seed + self.world.rank)
        self.clock_read: tuple[int, float] | None = None  # (step, seconds) last agreed under DDP
        self.progress = 0.0  # the run's progress before the step under way (`Schedule.progress`)
        self.checked_step = self.state.step  # the last step whose loss, gradients and weights were finite
        self.saved_step = self.state.step  # the step of the last checkpoint written (or resumed from)
        # False once a step's gradient norm was non-finite (fp16's scaler skips those steps itself).
        self.grads_finite = torch.ones((), dtype=torch.bool, device=self.device)

    def restore(self) -> None:
        checkpoints = list_checkpoints(self.run_dir)
        if not checkpoints:
            raise BertforgeError(
                f"{self.run_dir} has no checkpoint to resume from; start again without `resume=True`"
            )
        path, saved_state = self.load_newest_intact(checkpoints)
        self.resumed_from = path
        self.state.load_state_dict(saved_state)  # a state without micro_batch keeps this run's
        saved = self.state.micro_batch
        if saved != self.plan.micro_batch:
            raise self.other_micro_batch(path, saved)
        if self.train_cfg.max_steps < self.state.step:
            raise BertforgeError(
                f"{path} is at step {self.state.step}, past train.max_steps = {self.train_cfg.max_steps}: "
                f"resume with max_steps of at least {self.state.step}, or train from it with --init"
            )
        self.state.world_size = self.world.world_size
        self.restore_rank_rng(saved_state.get("rank_rng"))
        if self.world.is_main:
            self.log.truncate_after(self.state.step)
        if self.objective.restored is not None:
            self.objective.restored(self.state.step)

    def other_micro_batch(self, path: Path, saved: int) -> BertforgeError:
        """The error for a resume whose micro-batches would differ from the checkpoint's `saved`."""
        train, processes = self.train_cfg, self.state.world_size
        same = (
            f"train.gradient_accumulation_steps={train.batch_size // saved}"
            if train.batch_size % saved == 0
            else ""
        )
        if self.world.world_size == processes:
            settings = f"train.batch_size = {train.batch_size} with train.gradient_accumulation_steps = "
            return BertforgeError(
                f"{path} was trained with micro-batches of {saved} sequences, and {settings}"
                f"{train.gradient_accumulation_steps} makes them {self.plan.micro_batch}: resume with the "
                "run's batch settings (drop --batch-size and --set train.gradient_accumulation_steps)"
                + (f", or with {same}" if same else "")
            )
        return BertforgeError(
            f"{path} was trained with micro-batches of {saved} sequences on {processes} process(es), "
            f"but {self.world.world_size} would use {self.plan.micro_batch}: resume with the number of "
            "processes the run was trained with" + (f", or with {same}" if same else "")
        )

    def load_newest_intact(self, checkpoints: list[Path]) -> tuple[Path, dict]:
        """Load the newest checkpoint that passes its checks into the model and optimizer, warning
        about newer damaged ones (they are overwritten when the run reaches their step again); return
        its path and its state.json."""
        damaged = []
        for path in reversed(checkpoints):
            try:
                saved = load_checkpoint(path, self.model, self.optimizer, self.scaler)
            except DamagedCheckpoint as error:
                damaged.append(str(error))
                continue
            if damaged:
                warnings.warn(f"{'; '.join(damaged)}; resuming from {path.name} instead", stacklevel=4)
            return path, saved
        raise BertforgeError(
            f"no intact checkpoint to resume from: {'; '.join(damaged)}; start a new run in another `out`"
        )

    def restore_rank_rng(self, saved: list | None) -> None:
        """Ranks above 0 continue their own dropout stream (load_checkpoint restored rank 0's)."""
        rank = self.world.rank
        if rank == 0:
            return
        if saved and rank < len(saved):
            restore_rng_states(saved[rank], self.device)
        else:  # the checkpoint came from fewer processes: a fresh stream, still a function of the seed
            torch.manual_seed(batch_seed(self.runtime.seed, self.state.step, rank))

    def elapsed(self) -> float:
        """Seconds of training so far. With a time budget under DDP every rank takes rank 0's clock,
        so all ranks use the same learning rate and stop at the same step; it is read (one broadcast)
        every `log_every` steps, and in between the last reading stands."""
        seconds = time.perf_counter() - self.clock
        if not (self.world.distributed and self.schedule.budget_s):
            return seconds
        step = self.state.step
        if self.clock_read is None or (step != self.clock_read[0] and step % self.train_cfg.log_every == 0):
            self.clock_read = (step, distributed.broadcast_float(seconds))
        return self.clock_read[1]

    def run(self, show_progress: bool) -> dict:
        if self.state.step == 0:  # a new run: the model before training
            self.state.valid_step = 0
            if self.world.is_main:
                if valid := self.objective.evaluate(self.model):  # empty without validation text
                    self.log.append({"step": 0, "split": "valid", "tokens": 0, **valid})
                self.evaluate_at_warmup_length(0)
        if self.resumed_from is not None and show_progress and self.world.is_main:
            print(f"resuming from {self.resumed_from} (step {self.state.step:,})", flush=True)
        stream = self.start()
        bar, first_step = self.progress_bar(show_progress), self.state.step
        # The step that ends the run is the one `after_step` finds at the end, which it logs, evaluates
        # and checkpoints; before the first step, a run resumed at its end.
        done = self.schedule.progress(self.state.step, self.elapsed()) >= 1.0
        while not done:
            now = self.elapsed()
            progress = self.progress = self.schedule.progress(self.state.step, now)
            if self.warming_up() and progress >= self.objective.warmup_fraction:
                stream = self.end_warmup(stream)
            lr = self.schedule.learning_rate(progress)  # at the step's start, as Google's and HF's
            self.optimizer_step(stream, lr)
            stop = self.agreed_stop()
            try:
                done = self.after_step(lr, bar, checkpoint_now=bool(stop))
                self.advance(bar, now)  # after the step's log line: a plain progress line shows its loss
                if stop:
                    bar.close()
            except BrokenPipeError:
                # Ctrl-C reaches the whole foreground job: the reader of `pretrain ... | tee log` is gone
                # too. Its lines are dropped and the step is still saved; without a stop, an error.
                if not (stop and any([reader_left(sys.stdout), reader_left(sys.stderr)])):
                    raise
            if stop:
                step = self.state.step
                if self.saved_step != step:  # its output failed before its checkpoint
                    self.save_checkpoint(step)
                raise Interrupted(stop, step, checkpoint_dir(self.run_dir, step), self.world.is_main)
        if self.state.step == first_step:
            self.evaluate_stop_step(bar)
        self.advance(bar, self.elapsed())  # a time budget's bar ends full
        bar.close()
        return {
            "step": self.state.step,
            "steps_run": self.state.step - first_step,  # by this call: 0 when resumed at the end
            "elapsed_s": time.perf_counter() - self.clock,
            "tokens": self.state.tokens,
            **self.state.last_valid,
        }

    def evaluate_stop_step(self, bar: Progress) -> None:
        """A run resumed at its end that stopped between evaluations (its step limit lowered to the
        step of a signal's checkpoint) evaluates that step and saves it again, so that its result and
        final model's figures are its own, not those of an earlier step."""
        step = self.state.step
        if self.state.valid_step in (None, step):  # evaluated there, or saved before the step was kept
            return
        self.state.valid_step = step
        if self.world.is_main:
            self.evaluate(step, bar)
        self.save_checkpoint(step)

    def start(self) -> Iterator[tuple[int, int, dict]]:
        """Start the clock, wrap (DDP) and compile the model; the stream of micro-batches from the
        run's position."""
        self.clock = time.perf_counter() - self.state.elapsed_s
        self.window = Window()
        set_activation_checkpointing(self.model, self.train_cfg.activation_checkpointing)
        self.step_model = compile_model(
            distributed.wrap(self.model, self.device, self.world), self.runtime.compile
        )
        # Under DDP the ranks confirm after the first step that all of them compiled (`agree_on_compiling`).
        self.compile_unconfirmed = self.world.distributed and self.runtime.compile
        return self.stream()

    def stream(self) -> Iterator[tuple[int, int, dict]]:
        """The micro-batches from the run's position in the data."""
        objective = self.objective
        return micro_batches(
            EpochBatches({"batches": objective.batches, "warmup_batches": objective.warmup_batches}),
            self.epoch_batches,
            self.state.epoch,
            self.state.batch,
            data_workers(self.runtime, self.device),
            self.device.type == "cuda",
            self.world.rank,
            self.world.world_size,
        )

    def epoch_batches(self, epoch: int) -> tuple:
        """The key of an epoch's batches (`loader.EpochBatches`): which objective's batches, and their
        arguments."""
        end = self.state.warmup_end_epoch
        warming_up = self.objective.warmup_batches is not None and (end is None or epoch < end)
        name = "warmup_batches" if warming_up else "batches"
        if self.objective.masking_rate is None:
            return name, epoch
        return name, epoch, self.epoch_masking_rate(epoch)

    def epoch_masking_rate(self, epoch: int) -> float:
        """The masking rate of an epoch: set from the run's progress when the epoch starts, and kept in
        the state, so a run resumed within the epoch masks the rest of it at the same rate."""
        if self.state.masking_epoch != epoch:
            self.state.masking_epoch = epoch
            self.state.masking_rate = self.objective.masking_rate(self.progress)
        return self.state.masking_rate

    def warming_up(self) -> bool:
        return self.objective.warmup_batches is not None and self.state.warmup_end_epoch is None

    def end_warmup(self, stream: Iterator) -> Iterator[tuple[int, int, dict]]:
        """Leave the sequence-length warmup between two steps: the rest of the epoch under way is
        skipped, and the next epoch is the first of full-length batches. Every rank switches at the
        same step, as they agree on the progress."""
        stream.close()  # its DataLoader's workers stop
        if self.state.batch:
            self.state.epoch, self.state.batch = self.state.epoch + 1, 0
        self.state.warmup_end_epoch = self.state.epoch
        if self.world.is_main:  # at the step it applies to, so a resume from before the switch drops it
            step, seq_len = self.state.step + 1, self.objective.seq_len
            self.log.append({"step": step, "split": "warmup_end", "seq_len": seq_len})
        return self.stream()

    def evaluate_at_warmup_length(self, step: int) -> dict[str, float]:
        """During a sequence-length warmup, rank 0 logs the held-out metrics at its length too, and
        returns them (none otherwise)."""
        if self.objective.warmup_evaluate is None or not self.warming_up():
            return {}
        metrics = self.objective.warmup_evaluate(self.model)
        if any(nonfinite(value) for value in metrics.values()):
            raise self.diverged("the validation metrics")
        if metrics:  # empty without validation text
            seq_len, tokens = self.objective.warmup_seq_len, self.state.tokens
            self.log.append(
                {"step": step, "split": "valid_short", "seq_len": seq_len, "tokens": tokens, **metrics}
            )
        return metrics

    def progress_bar(self, show_progress: bool) -> Progress:
        """A bar (or on a log, lines) in steps, or in seconds when a time budget is set, so its ETA is
        the run's own."""
        disable = not show_progress or not self.world.is_main
        if not self.schedule.budget_s:
            total, done = self.train_cfg.max_steps, self.state.step
            return progress_bar(total=total, initial=done, unit="step", disable=disable)
        total = round(self.schedule.budget_s)
        return progress_bar(
            total=total,
            initial=round(self.schedule.progress(self.state.step, self.elapsed()) * total),  # a resumed run's
            unit="s",
            disable=disable,
            bar_format="{l_bar}{bar}| {elapsed}<{remaining} of the time budget{postfix}",
            of_what="of the time budget",
        )

    def advance(self, bar: Progress, elapsed_s: float) -> None:
        """Move the bar to the run's progress: its steps, or with a time budget its share of the budget
        (or of the steps, whichever is further)."""
        if self.schedule.budget_s:
            seconds = round(self.schedule.progress(self.state.step, elapsed_s) * bar.total)
            bar.update(seconds - bar.n)  # a bar redraws at most every mininterval
        else:
            bar.update(self.state.step - bar.n)

    def optimizer_step(self, stream: Iterator, lr: float) -> None:
        """Accumulate gradients over this rank's micro-batches of one step, then clip and update."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # checkpoints saved before layer_decay: none
        self.model.train()
        micro = [next(stream) for _ in range(self.plan.accumulation)]  # (epoch, next position, batch)
        batches = [batch for _, _, batch in micro]
        for sums, batch in zip(self.gradients(batches), batches, strict=True):
            self.window.add(sums, real_tokens(batch))  # counted on the host copy: no device sync
        if self.compile_unconfirmed:
            self.agree_on_compiling()
        self.state.epoch, self.state.batch = micro[-1][0], micro[-1][1]
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.train_cfg.max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.max_grad_norm)
            if not self.scaler:  # stays on the device: checked with the weights, in one sync
                self.grads_finite &= torch.isfinite(norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1

    def gradients(self, batches: list[dict]) -> list[dict[str, torch.Tensor]]:
        """Accumulate the gradients of this rank's micro-batches of one step; return their loss sums.

        When torch.compile fails (its own errors only), the step is redone from its start in eager
        mode with the gradients cleared and dropout's RNG rewound: nothing of the failed attempt,
        such as a partial backward, remains.
        """
        rng = rng_states(self.device) if is_compiled(self.step_model) else None
        try:
            return self.accumulate_gradients(self.step_model, batches)
        except Exception as error:
            if rng is None or not is_compile_error(error):
                raise
            warn_eager(error)
        self.step_model = self.step_model._orig_mod
        self.optimizer.zero_grad(set_to_none=True)
        restore_rng_states(rng, self.device)
        return self.accumulate_gradients(self.step_model, batches)

    def accumulate_gradients(
        self, model: torch.nn.Module, batches: list[dict]
    ) -> list[dict[str, torch.Tensor]]:
        all_sums = []
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            with distributed.no_sync(model, skip=not last):  # all-reduce once, in the last backward
                with autocast(self.device, self.runtime.precision):
                    fitting = for_batch(model, batch, self.plan.micro_batch)
                    loss, sums = self.objective.loss(fitting, to_device(batch, self.device))
                scaled = loss / len(batches)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            all_sums.append(sums)
        return all_sums

    def agree_on_compiling(self) -> None:
        """After the first step under DDP: when any rank fell back to eager mode, all do (one collective)."""
        self.compile_unconfirmed = False
        eager = not is_compiled(self.step_model)
        if distributed.all_reduce_sum([float(eager)])[0] and not eager:
            warnings.warn("torch.compile failed on another process; training in eager mode", stacklevel=3)
            self.step_model = self.step_model._orig_mod

    def agreed_stop(self) -> int:
        """The signal to stop at after this step, 0 to go on. Under DDP the ranks agree every `log_every`
        steps (one all-reduce), so that all stop after the same step whichever rank had the signal."""
        if not self.world.distributed:
            return self.signals.received
        if self.state.step % self.train_cfg.log_every:
            return 0
        return distributed.all_reduce_max(self.signals.received)

    def after_step(self, lr: float, bar: Progress, checkpoint_now: bool = False) -> bool:
        """Log, evaluate and checkpoint on their cadences, and always after the last step; checkpoint
        (and log) also when `checkpoint_now`. Whether this step was the last."""
        step = self.state.step
        done = self.schedule.progress(step, self.elapsed()) >= 1.0
        checkpoint = step % self.checkpoint_every == 0 or done or checkpoint_now
        evaluate = step % self.train_cfg.eval_every == 0 or done
        # a training line at each evaluation too, so that its held-out line counts every step's tokens
        log = step % self.train_cfg.log_every == 0 or checkpoint or evaluate
        if done:
            self.say_budget_spent(step, bar, evaluate)
        self.log_evaluate_checkpoint(step, lr, bar, log, evaluate, checkpoint)
        if log and not done and self.schedule.progress(step, self.elapsed()) >= 1.0:
            # what was logged, evaluated or saved spent the rest of a time budget: this step ends the
            # run, rather than one more at a learning rate of 0
            self.say_budget_spent(step, bar, not evaluate)
            self.log_evaluate_checkpoint(step, lr, bar, False, not evaluate, not checkpoint)
            done = True
        if checkpoint or done or step % self.train_cfg.eval_every == 0:
            self.window.restart()  # evaluation and checkpoint time are not training throughput
        return done

    def say_budget_spent(self, step: int, bar: Progress, evaluating: bool) -> None:
        """When the time budget (not the step limit) ends the run, say that what follows is outside it."""
        if not (self.schedule.budget_s and self.elapsed() >= self.schedule.budget_s and self.world.is_main):
            return
        held_out = evaluating and bool(self.config.data.valid)
        follow = "the last evaluation and checkpoint follow" if held_out else "the last checkpoint follows"
        bar.write(f"step {step}: the time budget is spent; {follow}")

    def log_evaluate_checkpoint(
        self, step: int, lr: float, bar: Progress, log: bool, evaluate: bool, checkpoint: bool
    ) -> None:
        """The training line of the log window ending at `step`, the held-out metrics and a checkpoint,
        those asked for, in that order."""
        # The window also closes at checkpoints so a resumed run logs the same windows.
        if log:
            record, tokens = self.window.flush(self.objective.summarize, lr, self.window_figures)
            if not math.isfinite(record["loss"]):
                raise self.diverged("the training loss")
        if log or evaluate:
            self.check_finite()  # before anything of this step is logged, evaluated or saved
        if log:
            self.state.tokens += tokens
            if self.objective.masking_rate is not None:
                record["mlm_probability"] = self.state.masking_rate
            if self.world.is_main:
                self.log.append({"step": step, "split": "train", **record})
                bar.set_postfix(
                    step=step, loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}"
                )
        if evaluate:
            self.state.valid_step = step
            if self.world.is_main:
                self.evaluate(step, bar)
        if checkpoint:
            self.save_checkpoint(step)

    def window_figures(self, totals: dict[str, float], tokens: float, seconds: float) -> dict:
        """On CUDA, a log window's MFU and peak memory (`metrics_log.DeviceFigures`), at its length."""
        length = self.objective.warmup_seq_len if self.warming_up() else self.objective.seq_len
        return self.figures(totals, tokens, seconds, length or self.config.data.max_seq_length)

    def evaluate(self, step: int, bar: Progress) -> None:
        """Rank 0 logs and shows the held-out metrics, and during a sequence-length warmup those at its
        length too."""
        valid = self.state.last_valid = self.objective.evaluate(self.model)
        if any(nonfinite(value) for value in valid.values()):
            raise self.diverged("the validation metrics")
        if valid:  # empty without validation text
            self.log.append({"step": step, "split": "valid", "tokens": self.state.tokens, **valid})
            bar.write(f"step {step}, held-out: {metrics_text(valid)}")
        if short := self.evaluate_at_warmup_length(step):
            length = self.objective.warmup_seq_len
            bar.write(f"step {step}, held-out at the warmup's {length} tokens: {metrics_text(short)}")

    def check_finite(self) -> None:
        """Raise when a gradient norm since the last check, or a weight now, is non-finite."""
        weights = [torch.isfinite(p).all() for p in self.model.parameters()]
        grads_ok, weights_ok = torch.stack([self.grads_finite, torch.stack(weights).all()]).tolist()
        if not grads_ok:
            raise self.diverged("the gradients")
        if not weights_ok:
            raise self.diverged("the weights")
        self.checked_step = self.state.step

    def diverged(self, what: str) -> BertforgeError:
        step, last = self.state.step, self.checked_step
        when = f"at step {step}" if last >= step - 1 else f"between steps {last + 1} and {step}"
        fp16 = "; with fp16 precision try bf16" if self.runtime.precision == "fp16" else ""
        return BertforgeError(
            f"training diverged {when}: {what} became non-finite (NaN or infinity); the learning rate "
            f"is likely too high (train.learning_rate = {self.train_cfg.learning_rate:g}): lower it{fp16}. "
            f"Nothing non-finite was saved; {self.kept_checkpoints()}"
        )

    def kept_checkpoints(self) -> str:
        checkpoints = list_checkpoints(self.run_dir)
        if not checkpoints:
            return "no checkpoint had been written yet"
        return f"the last good checkpoint, {checkpoints[-1].name}, is kept"

    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the checkpoint, with every rank's RNG state; the others wait for it."""
        self.state.elapsed_s = time.perf_counter() - self.clock
        state = self.state.state_dict()
        if self.world.distributed:
            state["rank_rng"] = distributed.gather_objects(rng_states(self.device))
        if self.world.is_main:
            # A second Ctrl-C acts once the checkpoint is whole: inside torch.save it would become
            # the zip writer's RuntimeError, and the stop a bug that loses the step.
            with stop_signals_held():
                try:
                    save_checkpoint(
                        self.run_dir, step, self.model, self.optimizer, self.scaler, state, self.config
                    )
                except WriteError as error:
                    kept = list_checkpoints(self.run_dir)
                    then = "then continue with `resume=True`" if kept else "start again"
                    raise BertforgeError(f"{error}; {self.kept_checkpoints()}; {then}") from error
                prune_checkpoints(self.run_dir, self.train_cfg.keep_checkpoints, step)
        distributed.barrier()
        self.saved_step = step


class Window:
    """Training statistics since the last log line, kept on the device until flushed."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.new_tokens = 0  # since the last flush, for the run's token count
        self.restart()

    def restart(self) -> None:
        self.tokens = 0  # since the last restart, for throughput
        self.start = time.perf_counter()

    def add(self, sums: dict[str, torch.Tensor], tokens: int) -> None:
        for key, value in sums.items():
            self.sums[key] = self.sums.get(key, 0) + value.detach()
        self.tokens += tokens
        self.new_tokens += tokens

    def flush(
        self, summarize: Callable[[dict[str, float]], Summary], lr: float, figures: Callable | None = None
    ) -> tuple[dict, int]:
        """Synchronise once, sum over ranks, and return the window's metrics and its new tokens;
        `figures(totals, tokens, seconds)` adds its own (the GPU's MFU and memory).

        Sums (not means) are reduced, so masked-token and pair weighting is exact across ranks.
        """
        seconds = max(time.perf_counter() - self.start, 1e-9)
        keys = sorted(self.sums)
        local = (to_host([self.sums[key] for key in keys]) if keys else []) + [self.tokens, self.new_tokens]
        *totals, tokens, new_tokens = distributed.all_reduce_sum([float(value) for value in local])
        by_key = dict(zip(keys, totals, strict=True))
        summary = summarize(by_key)
        record = {"loss": summary.loss, **summary.metrics, "lr": lr, "tokens_per_s": tokens / seconds}
        if figures is not None:
            record |= figures(by_key, tokens, seconds)
        self.sums = {}
        self.new_tokens = 0
        self.restart()
        return record, int(new_tokens)

"""A NaN or infinite loss: stop at once and keep the checkpoints clean, or skip that step's update."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor

from lightspeed.compat.hooks import switch_off
from lightspeed.core.config import ConfigError


class NonFiniteGuard(L.Callback):
    """`action=stop`: the kept losses are read in one sync every `check_every_n_steps` optimizer steps,
    before every checkpoint and at the end, so no checkpoint holds the weights a bad step produced; under DDP
    the ranks reduce the flag and stop together. `action=skip`: a non-finite gradient norm (one sync a step)
    drops the update and puts the buffers back, up to `max_consecutive_skips` in a row; with 16-mixed the
    GradScaler does this itself. docs/resilience.md ("Failures during training") has the rest."""

    def __init__(
        self, action: str = "stop", check_every_n_steps: int = 10, max_consecutive_skips: int = 10
    ) -> None:
        if action not in ("stop", "skip"):
            raise ConfigError(f"callbacks.nonfinite.action={action!r} is invalid: use one of stop, skip")
        self.action = action
        self.check_every_n_steps = check_every_n_steps
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped = 0
        self._consecutive = 0
        self._losses: list[Tensor] | None = None  # stop: the losses since the last check
        self._steps: list[tuple[int, int]] = []  # (step, epoch) of each kept loss
        self._checked_at = -1  # the optimizer step of the last cadence check
        self._saved_buffers: list[Tensor] = []  # skip: the buffers as they were before this step
        # The hooks the other action needs are not called at all (Lightning skips a hook set to None).
        skip_only, stop_only = ("on_train_batch_start", "on_before_optimizer_step"), ("on_train_batch_end",)
        switch_off(self, skip_only if action == "stop" else stop_only)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._losses, self._steps = [], []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # {}: a step that returned None
        if self._losses is None or not isinstance(loss, Tensor):
            return
        # Lightning's outputs hold a detached clone of the loss, made for every step anyway: keeping
        # a reference costs nothing on the device (copying it into a buffer was a kernel a step).
        self._losses.append(loss.detach())
        self._steps.append((trainer.global_step, trainer.current_epoch))
        # At optimizer steps that are multiples of the cadence, as Lightning's logging steps are: with
        # equal cadences the two reads fall on one step, and the second waits for nothing.
        step = trainer.global_step
        if step % self.check_every_n_steps == 0 and step != self._checked_at:
            self._checked_at = step
            self._check(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: Any) -> None:
        """Raising here keeps the file from being written: no checkpoint holds non-finite weights, even
        when the loss stayed finite (gradients that overflowed)."""
        self._check(trainer)
        params = [p.detach() for p in pl_module.parameters()]
        finite = torch.stack([torch.isfinite(p).all() for p in params]).all() if params else torch.tensor(1)
        if trainer.world_size > 1:  # FSDP's ranks each hold a part of the weights: agree on all of them
            flag = finite.to(device=trainer.strategy.root_device, dtype=torch.int32)
            finite = trainer.strategy.reduce(flag, reduce_op="min")
        if not bool(finite):
            from lightspeed.resilience.incidents import weights_not_finite

            raise weights_not_finite(trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        """Read the buffered losses (one sync) and, under DDP, agree on the first bad step (a collective:
        every rank checks at the same steps and saves)."""
        if self._losses is None or (not self._steps and trainer.world_size == 1):
            return
        steps, self._steps = self._steps, []
        losses, self._losses = self._losses, []
        device = trainer.strategy.root_device
        window = torch.stack(losses).float() if losses else torch.zeros(0, device=device)
        if trainer.world_size == 1 and bool(torch.isfinite(window).all()):
            return  # the common case: two kernels, one sync
        from lightspeed.resilience.incidents import loss_not_finite

        failure = loss_not_finite(trainer, steps, torch.isfinite(window).tolist())
        if failure is not None:
            self._losses = None  # said once
            raise failure

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx % trainer.accumulate_grad_batches == 0:
            self._saved_buffers = [b.detach().clone() for b in pl_module.buffers()]

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads or bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))):
            self._consecutive = 0
            return
        from lightspeed.resilience.incidents import skip_update

        skip_update(self, trainer, pl_module, optimizer)

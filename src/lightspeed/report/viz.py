"""`make viz`: intermediate results, as the tutorials teach looking at them. While the Trainer predicts the
test split, a callback keeps (1) what the first convolution layers compute for the first few inputs
(forward hooks on the device, moved to the CPU once, at the end) and (2) the inputs the model got most
wrong (for a module whose predict_step gives `target`, `pred` and `prob`: a classifier's), then draws
`feature_maps.png` and `predictions.png`: images for 2-D inputs, lines for 1-D ones."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lightspeed.report import figures

FEATURE_MAPS_FILE = "feature_maps.png"
GALLERY_FILE = "predictions.png"
CONVS = (torch.nn.Conv1d, torch.nn.Conv2d)


class Intermediates(L.Callback):
    """During `trainer.predict`: the first `layers` convolutions' outputs for the first `inputs` samples, and
    the `shown` worst predictions (confident wrong first, then unsure right); on device until the end."""

    def __init__(self, layers: int = 2, inputs: int = 4, shown: int = 16) -> None:
        self.layers, self.inputs, self.shown = layers, inputs, shown
        self.maps: dict[str, Tensor] = {}
        self.first_inputs: Tensor | None = None
        self.worst: list[tuple[float, Tensor, int, int, float]] = []  # (badness, x, target, pred, prob)
        self._kept: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] = []
        self._hooks: list[Any] = []

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        convs = [(n, m) for n, m in pl_module.named_modules() if isinstance(m, CONVS)][: self.layers]
        self._hooks += [conv.register_forward_hook(partial(self._keep, name)) for name, conv in convs]

    def _keep(self, name: str, module: torch.nn.Module, args: Any, output: Tensor) -> None:
        if name not in self.maps:  # the first batch only
            self.maps[name] = output[: self.inputs].detach()

    def on_predict_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if self.first_inputs is None:
            self.first_inputs = x[: self.inputs].detach()
        if isinstance(outputs, dict) and {"target", "pred", "prob"} <= set(outputs):
            target, pred, prob = outputs["target"], outputs["pred"], outputs["prob"].float()
            badness = torch.where(pred != target, 1 + prob, 1 - prob)  # wrong and sure first
            top = badness.topk(min(self.shown, len(badness))).indices
            self._kept.append((badness[top], x[top].detach(), target[top], pred[top], prob[top]))

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for hook in self._hooks:
            hook.remove()
        self.maps = {k: v.float().cpu() for k, v in self.maps.items()}  # one copy each, at the end
        if self.first_inputs is not None:
            self.first_inputs = self.first_inputs.float().cpu()
        if self._kept:
            badness, x, target, pred, prob = (
                torch.cat(parts).cpu() for parts in zip(*self._kept, strict=True)
            )
            order = badness.argsort(descending=True)[: self.shown].tolist()
            self.worst = [
                (float(badness[i]), x[i].float(), int(target[i]), int(pred[i]), float(prob[i])) for i in order
            ]
        self._kept = []


def _show(ax: Any, sample: Tensor) -> None:
    """An image (C, H, W: one channel in grey, three as colour, scaled to its own range) or a line (L, or
    C, L: one line a channel)."""
    if sample.dim() == 3 and sample.shape[0] in (1, 3):
        image = sample.permute(1, 2, 0)
        image = (image - image.min()) / (image.max() - image.min()).clamp(min=1e-8)
        ax.imshow(image.squeeze(-1).numpy(), cmap="gray" if sample.shape[0] == 1 else None)
        ax.set_xticks([])
        ax.set_yticks([])
    elif sample.dim() == 2 and sample.shape[-1] > 1 and sample.shape[0] < sample.shape[-1]:
        for channel in sample[:8]:
            ax.plot(channel.numpy(), linewidth=0.8)
    else:
        ax.plot(sample.flatten().numpy(), linewidth=0.8)


def feature_maps(found: Intermediates, path: Path, channels: int = 8) -> Path | None:
    """One row an input (the input itself first), then each kept layer's first `channels` channels."""
    if not found.maps or found.first_inputs is None:
        return None
    import matplotlib.pyplot as plt

    layers = list(found.maps.items())
    rows, cols = len(found.first_inputs), 1 + channels * len(layers)
    fig, axes = plt.subplots(rows, cols, figsize=(1.1 * cols, 1.1 * rows + 0.4), squeeze=False)
    for r in range(rows):
        _show(axes[r][0], found.first_inputs[r])
        axes[r][0].set_title("input" if r == 0 else "", fontsize=7)
        for i, (name, maps) in enumerate(layers):
            for c in range(channels):
                ax = axes[r][1 + i * channels + c]
                if c < maps.shape[1]:
                    _show(ax, maps[r, c : c + 1])
                    if r == 0:
                        ax.set_title(f"{name}[{c}]" if c == 0 else str(c), fontsize=6)
                else:
                    ax.axis("off")
    fig.suptitle("feature maps: the first convolution layers, first inputs of the test split", fontsize=8)
    return figures.save(fig, path)


def gallery(found: Intermediates, path: Path, class_names: list[str] | None = None) -> Path | None:
    """The kept predictions, worst first: the input, its true and predicted label and the confidence."""
    if not found.worst:
        return None
    import matplotlib.pyplot as plt

    def label(i: int) -> str:
        return class_names[i] if class_names is not None and 0 <= i < len(class_names) else str(i)

    cols = 4
    rows = (len(found.worst) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.2 * rows), squeeze=False)
    for ax in axes.flatten()[len(found.worst) :]:
        ax.axis("off")
    for ax, (_, x, target, pred, prob) in zip(axes.flatten(), found.worst, strict=False):
        _show(ax, x)
        title = f"true {label(target)}, pred {label(pred)}\n{prob:.0%}"
        ax.set_title(title, fontsize=7, color="red" if pred != target else "black")
    fig.suptitle("test predictions, worst mistakes first", fontsize=9)
    fig.tight_layout()
    return figures.save(fig, path)

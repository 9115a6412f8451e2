"""Batch augmentation on the device: one vectorised op per batch, no per-sample Python."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def random_crop(x: Tensor, padding: int) -> Tensor:
    """Pad by `padding` (reflect) and cut each image back to size at its own random offset.
    (B, C, H, W) -> (B, C, H, W)"""
    b, _, h, w = x.shape
    padded = F.pad(x, (padding,) * 4, mode="reflect")
    dy = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=x.device)
    dx = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=x.device)
    rows = (dy + torch.arange(h, device=x.device).view(1, h, 1)).expand(b, h, w)  # (B, H, W)
    cols = (dx + torch.arange(w, device=x.device).view(1, 1, w)).expand(b, h, w)
    batch = torch.arange(b, device=x.device).view(b, 1, 1).expand(b, h, w)
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


def random_flip(x: Tensor) -> Tensor:
    """Mirror each image left-right with probability 1/2. (B, C, H, W) -> (B, C, H, W)"""
    flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < 0.5
    return torch.where(flip, x.flip(-1), x)


def augment(x: Tensor, crop_padding: int, flip: bool) -> Tensor:
    """A training batch as `data.augment` asks: shifted by up to `crop_padding` pixels, then mirrored."""
    if crop_padding:
        x = random_crop(x, int(crop_padding))
    return random_flip(x) if flip else x

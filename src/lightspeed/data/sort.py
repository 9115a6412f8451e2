"""Sorting digit sequences, as minGPT's demo does: a model reads `length` random digits and writes them in
order, a token at a time. Generated in memory from `data_seed`: no download."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightspeed.core.config import ConfigError
from lightspeed.data.base import IGNORE_INDEX, ArrayDataModule

#: Targets that are not scored (the prompt's positions): torch's cross_entropy skips them by default.
IGNORE = IGNORE_INDEX


class SortDataModule(ArrayDataModule):
    """Inputs: the digits, then the sorted digits but the last (2 * length - 1 tokens); targets: each next
    token, with the prompt's positions but the last IGNOREd, so only the answer is scored. Every sequence
    is distinct, so no test sequence is also a training one."""

    def __init__(
        self, num_samples: int = 10000, length: int = 8, num_digits: int = 4, data_seed: int = 0, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        given = {
            "num_samples": num_samples,
            "length": length,
            "num_digits": num_digits,
            "data_seed": data_seed,
        }
        for key, value in given.items():
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if key == "data_seed" else 1)
            ):
                raise ConfigError(
                    f"data.{key}={value!r} is invalid: a whole number, at least 1 (0 for a seed)"
                )
        self.num_samples, self.length, self.num_digits, self.data_seed = (
            num_samples,
            length,
            num_digits,
            data_seed,
        )
        self.vocab_size = num_digits
        self.block_size = 2 * length - 1

    def model_args(self) -> dict[str, Any]:
        """A next-token model is built from the vocabulary and the sequence length."""
        return {"vocab_size": self.vocab_size, "block_size": self.block_size}

    def load_arrays(self) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(self.data_seed)
        space = self.num_digits**self.length
        if space <= 2**24:  # all of them, shuffled: each a number in base num_digits
            codes = torch.randperm(space, generator=g)
            digits = (
                codes[:, None] // self.num_digits ** torch.arange(self.length) % self.num_digits
            )  # (N, L)
        else:  # too many to list: the distinct ones among twice as many random draws
            drawn = torch.randint(self.num_digits, (2 * self.num_samples, self.length), generator=g)
            digits = drawn.unique(dim=0)
            digits = digits[torch.randperm(len(digits), generator=g)]
        if len(digits) < self.num_samples:
            raise ConfigError(
                f"data.num_samples={self.num_samples} is more than the {len(digits)} distinct sequences of "
                f"data.length={self.length} digits 0..{self.num_digits - 1}: lower it, or raise data.length "
                "or data.num_digits"
            )
        digits = digits[: self.num_samples]
        sequence = torch.cat([digits, digits.sort(dim=1).values], dim=1)  # (N, 2L)
        x, y = sequence[:, :-1].clone(), sequence[:, 1:].clone()
        y[:, : self.length - 1] = IGNORE  # the next digit of the prompt is random: not scored
        return x, y

"""The example tasks against their references, side by side on the same data (the figures their experiment
files cite):

    python scripts/reference_tasks.py [--seeds 0,1,2] [--out DIR]

- Regression (`experiment=diabetes_mlp`, `experiment=diabetes_linear`): scikit-learn's closed-form
  `LinearRegression` and `Ridge` fitted on the very training split the DataModule gives (inputs
  standardised as it standardises them), scored on its test split, beside Lightspeed's runs.
- The transformer (`experiment=sort_gpt`): its exact-match accuracy on the test sequences, beside the
  plain PyTorch loop (`lightspeed.speed.handloop`) training the same module for the same steps: its
  test exact match and final training loss.

Prints a Markdown table per task; each Lightspeed run is a real `train()` under `--out` (default: a
temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from lightspeed.run import build
from lightspeed.run.entry import compose_config
from lightspeed.speed import accel
from lightspeed.train import train

QUIET = [
    "callbacks.rich_progress_bar=null",
    "trainer.enable_progress_bar=false",
    "logger=none",
    "curves=false",
]


def regression(
    out: Path, split_seed: int, experiments: tuple[str, ...] = ("diabetes_linear", "diabetes_mlp")
) -> dict[str, dict[str, float]]:
    """Test R², MSE and MAE of scikit-learn's fits and of each experiment's run, on split `split_seed`."""
    from sklearn.linear_model import LinearRegression, Ridge
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    cfg = compose_config("train", ["experiment=diabetes_mlp", f"data.split_seed={split_seed}"], out / "sk")
    accel.resolve(cfg)  # the loader's autos, as a run resolves them
    dm = build.datamodule(cfg)
    dm.setup("fit")
    (x, y), (xt, yt) = (dm.splits[s].tensors for s in ("train", "test"))
    rows: dict[str, dict[str, float]] = {}
    for name, fit in (
        ("scikit-learn LinearRegression", LinearRegression()),
        ("scikit-learn Ridge(alpha=1)", Ridge(1.0)),
    ):
        pred = fit.fit(x.numpy(), y.numpy()).predict(xt.numpy())
        rows[name] = {
            "test/r2": r2_score(yt, pred),
            "test/mse": mean_squared_error(yt, pred),
            "test/mae": mean_absolute_error(yt, pred),
        }
    for experiment in experiments:
        overrides = [f"experiment={experiment}", f"data.split_seed={split_seed}", *QUIET]
        result = train(compose_config("train", overrides, out / experiment / str(split_seed)))
        rows[f"Lightspeed experiment={experiment}"] = {
            k: result.metrics[k] for k in ("test/r2", "test/mse", "test/mae")
        }
    return rows


def transformer(out: Path) -> dict[str, dict[str, Any]]:
    """experiment=sort_gpt through Lightspeed, and its module trained by the plain loop for as many steps."""
    from lightspeed.speed import handloop

    result = train(compose_config("train", ["experiment=sort_gpt", *QUIET], out / "sort_gpt"))
    steps = result.trainer.global_step
    cfg = compose_config("train", ["experiment=sort_gpt"], out / "hand")
    accel.resolve(cfg)  # the optimizer's kernels as the run's (fused AdamW on a CPU)
    accel.apply_to_torch(cfg)
    torch.manual_seed(cfg.seed)
    dm = build.datamodule(cfg)
    dm.setup("fit")
    module = build.model(cfg, dm)
    settings = handloop.Settings(
        device="cpu",
        batch_size=int(cfg.data.batch_size),
        optimizer=OmegaConf.to_container(cfg.model.optimizer, resolve=True),
        scheduler=OmegaConf.to_container(cfg.model.scheduler, resolve=True),
        schedule_steps=steps,
        steps=steps - 5,
        warmup=5,
        on_device=True,
        seed=int(cfg.seed),
    )
    hand = handloop.train(module, *dm.splits["train"].tensors, settings)
    xt, yt = dm.splits["test"].tensors
    module.eval()
    with torch.inference_mode():
        pred = module(xt).argmax(-1)
    exact = float(((pred == yt) | (yt == -100)).all(-1).float().mean())
    return {
        "Lightspeed experiment=sort_gpt": {
            "steps": steps,
            "test/exact_match": result.metrics["test/exact_match"],
            "train/loss": result.metrics.get("train/loss"),
        },
        "plain PyTorch loop, same module": {
            "steps": steps,
            "test/exact_match": exact,
            "train/loss": hand["final_loss"],
        },
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    columns = list(next(iter(rows.values())))
    lines = ["| | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, row in rows.items():
        cells = [f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seeds", default="0", help="data.split_seed values for the regression, comma-separated"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="lightspeed-reference-"))
    for seed in (int(s) for s in args.seeds.split(",")):
        print(f"\n## Regression, diabetes, data.split_seed={seed}\n\n{table(regression(out, seed))}")
    print(f"\n## Transformer, sorting\n\n{table(transformer(out))}")
    print(f"\nruns: {out}")


if __name__ == "__main__":
    main()

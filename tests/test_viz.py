"""`make viz`: the first layers' feature maps and the worst test predictions, drawn from what the model
computed on the device while the Trainer predicted; pictures differ between checkpoints; lines for 1-D
inputs; one line for a model with nothing to show."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import TINY
from lightspeed.eval import _pictures
from lightspeed.eval import run as evaluate
from lightspeed.report import viz
from lightspeed.run.entry import compose_config
from lightspeed.train import train

PNG = b"\x89PNG\r\n\x1a\n"
VIZ = ["viz=true", "trainer.enable_progress_bar=false", "print_config=false"]


@pytest.mark.slow  # ~9 s on 2 CPU cores: make test stays within 4 minutes (other viz cases: make test)
def test_viz_draws_feature_maps_and_the_worst_predictions_and_they_differ_between_checkpoints(
    tmp_path: Path,
) -> None:
    pictures = []
    for seed in (1, 2):
        logs = tmp_path / str(seed)
        train(compose_config("train", [*TINY, f"seed={seed}"], logs))
        evaluate(compose_config("eval", VIZ, logs))
        run = logs / "eval" / "runs" / "test"
        found = [(run / name).read_bytes() for name in (viz.FEATURE_MAPS_FILE, viz.GALLERY_FILE)]
        assert all(p.startswith(PNG) and len(p) > 15_000 for p in found)
        pictures.append(found)
    assert pictures[0][0] != pictures[1][0] and pictures[0][1] != pictures[1][1]  # other weights, other maps


def test_one_dimensional_inputs_and_their_maps_are_drawn_as_lines(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = viz.Intermediates()
    found.first_inputs = torch.randn(2, 1, 40)  # (C, L) a sample
    found.maps = {"layers.0": torch.randn(2, 8, 40)}
    assert viz.feature_maps(found, tmp_path / "maps.png").read_bytes().startswith(PNG)
    fig, (line, image) = plt.subplots(1, 2)
    viz._show(line, torch.randn(1, 40))
    viz._show(image, torch.randn(1, 8, 8))
    assert len(line.lines) == 1 and not line.images and len(image.images) == 1 and not image.lines
    plt.close(fig)


def test_a_model_with_nothing_to_show_is_one_line(tmp_path: Path, capsys) -> None:
    """A regressor on tabular data: no convolution layers, no class probabilities to rank mistakes by."""
    logs = tmp_path / "logs"
    train(compose_config("train", [*TINY, "experiment=diabetes_mlp"], logs))
    with pytest.raises(SystemExit) as stop:
        evaluate(compose_config("eval", VIZ, logs))
    assert stop.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: viz=true: nothing to show for Regressor: it has no convolution layers")
    )


@pytest.mark.parametrize(
    ("maps", "worst", "said"),
    [
        (True, False, "only feature_maps.png: Net's predict_step gives no target, pred and prob"),
        (False, True, "only predictions.png: Net has no convolution layers"),
    ],
)
def test_one_picture_of_two_says_why_the_other_is_missing(tmp_path: Path, caplog, maps, worst, said) -> None:
    """A module with convolutions but no class probabilities (or the reverse) gets its one picture and a
    line on the other, never silence."""
    found = viz.Intermediates()
    found.first_inputs = torch.randn(2, 1, 8, 8)
    found.maps = {"conv": torch.randn(2, 4, 8, 8)} if maps else {}
    found.worst = [(0.9, torch.randn(1, 8, 8), 1, 2, 0.9)] if worst else []
    with caplog.at_level("INFO"):
        _pictures(found, tmp_path, None, "Net")
    assert said in caplog.text

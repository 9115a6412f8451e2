"""What a run prints: Lightning's messages and Python warnings go through Hydra's logging (the console and
`<run dir>/train.log`); known third-party noise is silenced narrowly, by message and raising module.
Everything else, our own deprecations above all, stays visible (and is an error under pytest)."""

import logging
import warnings


def route_to_run_log() -> None:
    """Call inside a Hydra task, after Hydra configured the root logger: Lightning, imported before any
    logging is configured (always so under Hydra), gives its loggers a console handler and stops propagation,
    so its messages would never reach the run's log file."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
            logger.removeHandler(handler)
        logger.propagate = True
    logging.captureWarnings(True)


KNOWN_LOG_LINES: tuple[str, ...] = (
    # Lightning 2.6 advertises its cloud services (litlogger, litmodels) on every run.
    "💡 Tip: For seamless cloud",
    # Our callbacks group configures ModelSummary on purpose; Lightning says so on every run.
    "Trainer already configured with model summary callbacks",
)


def _drop_known_lines(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(KNOWN_LOG_LINES)


def silence_known_noise() -> None:
    # torch 2.13 deprecated pytree's LeafSpec; lightning 2.6.6 still checks for it on every run.
    warnings.filterwarnings(
        "ignore", r".*LeafSpec.* is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"
    )
    # LitData (data=shards) logs how it reads chunks and sizes its (unused, for local files) cache at INFO
    # on every loader; its warnings stay.
    logging.getLogger("litdata").setLevel(logging.WARNING)
    # torch's ONNX exporter warns, for every export, that torchvision's detection ops are not registered
    # when torchvision is not installed: nothing a model without them needs.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    # addFilter adds a filter once, however often this runs
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_drop_known_lines)

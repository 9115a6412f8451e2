"""Send Lightning's log messages and Python warnings through the logging that Hydra set up, so that
they reach both the console and the run's log file (`<run dir>/train.log`)."""

import logging


def route_to_run_log() -> None:
    """Call inside a Hydra task, after Hydra configured the root logger.

    Lightning gives its loggers a console handler of their own and stops propagation when it is
    imported before any logging is configured, which is always the case under Hydra: its messages
    then never reach the run's log file.
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
            logger.removeHandler(handler)
        logger.propagate = True
    logging.captureWarnings(True)

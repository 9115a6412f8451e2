"""Silence known third-party noise, narrowly: by message and by the module that raises it.

Everything else, our own deprecations above all, stays visible (and is an error under pytest).
"""

import logging
import warnings

# (message regex, category, module regex) of warnings that say nothing a Lightspeed user can act on.
KNOWN_WARNINGS: list[tuple[str, type[Warning], str]] = [
    # torch 2.13 deprecated pytree's LeafSpec; lightning 2.6.6 still checks for it on every run.
    (r".*LeafSpec.* is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
]


KNOWN_LOG_LINES: tuple[str, ...] = (
    # Lightning 2.6 advertises its cloud services (litlogger, litmodels) on every run.
    "💡 Tip: For seamless cloud",
    # Our callbacks group configures ModelSummary on purpose; Lightning says so on every run.
    "Trainer already configured with model summary callbacks",
)


class _DropKnownLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(KNOWN_LOG_LINES)


def silence_known_noise() -> None:
    for message, category, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropKnownLines) for f in rank_zero_logger.filters):
        rank_zero_logger.addFilter(_DropKnownLines())

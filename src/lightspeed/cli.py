"""`lightspeed <command> [overrides]`: the engine's commands under one name, and `lightspeed --version`.

Each command runs its module as `__main__` (`lightspeed train x=1` is `python -m lightspeed.train x=1`,
`__main__.__spec__` included): Lightning starts the other DDP ranks by rerunning `python -m <that module>`
with this process's arguments, which must then be the module's own.
"""

from __future__ import annotations

import runpy
import sys

from lightspeed import __version__

#: command -> (the module it runs as __main__, the overrides it adds, what it does)
COMMANDS: dict[str, tuple[str, list[str], str]] = {
    "train": ("lightspeed.train", [], "train (Hydra overrides: trainer=ddp data.batch_size=128 ...)"),
    "eval": ("lightspeed.eval", [], "test a checkpoint (ckpt_path=..., predict=true)"),
    "viz": ("lightspeed.eval", ["viz=true"], "feature maps and the worst predictions as PNGs"),
    "export": ("lightspeed.export", [], "a checkpoint as ONNX and torch.export"),
    "shards": ("lightspeed.shards", [], "a data set as LitData shards"),
    "compare": ("lightspeed.compare", [], "several runs on one chart and a table"),
    "doctor": ("lightspeed.doctor", [], "what this machine can do"),
    "bench": ("lightspeed.bench", [], "throughput of the presets against a plain PyTorch loop"),
    "tune": ("lightspeed.tune", [], "the fastest settings for this model here -> conf/accel/tuned.yaml"),
}


def usage() -> str:
    rows = "\n".join(f"  {name:<8} {what}" for name, (_, _, what) in COMMANDS.items())
    return f"usage: lightspeed <command> [args]  |  lightspeed --version\n\ncommands:\n{rows}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"lightspeed {__version__}")
        return 0
    if args[0] not in COMMANDS:
        print(f"error: {args[0]} is not a command: use one of {', '.join(COMMANDS)} (lightspeed --help)")
        return 2
    module, added, _ = COMMANDS[args[0]]
    sys.argv = [f"lightspeed {args[0]}", *added, *args[1:]]  # argparse's and Hydra's entries read sys.argv
    runpy.run_module(module, run_name="__main__", alter_sys=True)  # its own exit code is a SystemExit
    return 0


if __name__ == "__main__":
    sys.exit(main())

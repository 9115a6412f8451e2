"""Where the time goes: the `accel` presets and what their `auto`s resolve to, the speed report and
progress bar that keep host-device syncs out of the step, and the plain PyTorch loop that `make bench`
compares with."""

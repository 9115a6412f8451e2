"""Nothing lost: resuming the right checkpoint, writing checkpoints atomically, stopping cleanly on
preemption or a non-finite loss, and carrying every rank's random and metric state across a resume."""

"""The facts every part of a run reads: the validated config, the machine, the ways a run fails, what it
prints and the summary it leaves. Imports nothing else of Lightspeed's."""

#!/usr/bin/env bash
# What a Lightspeed command's exit code means, said before make exits (make itself always exits 2 when
# a recipe fails). Usage: exit_code.sh CODE "COMMAND"; exits with CODE.
code=$1
case $code in
  2) why="a bad setting: the error line above names it and the fix" ;;
  3) why="the run failed: the error line above names the phase and the cause" ;;
  130) why="interrupted (Ctrl-C)" ;;
  138 | 143) why="preempted: a checkpoint was saved, rerun the same command to continue" ;;
  137) why="killed (SIGKILL), most often by the out-of-memory killer (see dmesg) or a job's memory or time limit; rerun the same command (a training run continues from its last checkpoint)" ;;
  *) if [ "$code" -gt 128 ] 2>/dev/null; then why="killed by signal $((code - 128)) ($(kill -l $((code - 128)) 2>/dev/null || echo '?'))"; else why="an unexpected error, see above"; fi ;;
esac
echo "make: $2 exited with $code: $why" >&2
exit "$code"

#!/usr/bin/env bash
# What a Lightspeed command's exit code means, said before make exits (make itself always exits 2 when
# a recipe fails). Usage: exit_code.sh CODE "COMMAND"; exits with CODE.
code=$1
case $code in
  2) why="a bad setting: the error line above names it and the fix" ;;
  3) why="a training failure, explained above" ;;
  130) why="interrupted (Ctrl-C)" ;;
  138 | 143) why="preempted: a checkpoint was saved, rerun the same command to continue" ;;
  *) why="an unexpected error, see above" ;;
esac
echo "make: $2 exited with $code: $why" >&2
exit "$code"

"""Runs a benchmark command and reads the JSON line it prints, with the command's own peak
memory: what compare.py (beside PyTorch) and ../onnx_native.py (ONNX beside native) share."""

import json
import os
import sys


def run(cmd, env, cwd=None):
    """Runs cmd (in cwd, if given); its last JSON line and its own peak RSS in MiB (wait4's
    ru_maxrss, in KiB)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(write, 1)
        os.close(read)
        os.close(write)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        if cwd is not None:
            os.chdir(cwd)
        os.execvpe(cmd[0], cmd, env)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed (status {status}); run it by hand to see why")
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line), usage.ru_maxrss / 1024.0

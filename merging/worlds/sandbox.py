"""Runs model-written Python in a child process with limits, never in the evaluating process.

Nothing in the Python standard library or in lm-eval runs untrusted code with resource limits
(lm-eval's code tasks delegate to the `evaluate` package's code_eval, which execs in forked
workers of the evaluating process); this module does it with `subprocess` and `resource`:
a fresh interpreter in isolated mode without site-packages, in an empty temporary folder,
with a minimal environment, limits on CPU time, address space, file size and open files,
a wall-clock timeout that kills the whole process group, and nothing on stdin.
It refuses to run anything unless the user opted in with HF_ALLOW_CODE_EVAL=1, the switch
lm-eval's own code tasks use.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

OPT_IN = "HF_ALLOW_CODE_EVAL"


@dataclass(frozen=True)
class Limits:
    seconds: float = 5.0  # wall clock; CPU time is limited to the same
    memory_mib: int = 512
    file_kib: int = 1024
    open_files: int = 32


class CodeExecutionNotAllowed(PermissionError):
    pass


def check_opt_in() -> None:
    if os.environ.get(OPT_IN) != "1":
        raise CodeExecutionNotAllowed(
            f"{OPT_IN}: running model-written code needs an explicit opt-in; set {OPT_IN}=1 to allow it "
            "(the code runs in a sandboxed subprocess with a timeout and CPU/memory limits)"
        )


def _limit(limits: Limits):
    def apply() -> None:  # runs in the child between fork and exec
        cpu = max(1, int(limits.seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        memory = limits.memory_mib * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_kib * 1024,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_program(program: str, limits: Limits = Limits()) -> tuple[bool, str]:
    """Run `program` in the sandbox.

    Returns:
        (exited with status 0 within the limits, the last 500 characters of its stderr or the
        reason it was stopped: a timeout or the signal that killed it).
    """
    check_opt_in()
    with tempfile.TemporaryDirectory(prefix="logitcomp-sandbox-") as tmp:
        (Path(tmp) / "program.py").write_text(program)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "program.py"], cwd=tmp, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={"PATH": os.defpath, "HOME": tmp, "TMPDIR": tmp, "PYTHONHASHSEED": "0"},
            preexec_fn=_limit(limits),
        )
        try:
            _, err = proc.communicate(timeout=limits.seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return False, f"timed out after {limits.seconds} s"
    if proc.returncode < 0:  # a signal: SIGXCPU/SIGKILL from the CPU limit leaves stderr empty
        return False, f"killed by {signal.Signals(-proc.returncode).name}"
    return proc.returncode == 0, err[-500:]


def passes_tests(prompt: str, completion: str, tests: list[str], limits: Limits = Limits()) -> bool:
    """Whether the function `prompt + completion` passes every assert line in `tests`."""
    program = prompt + completion + "\n\n\n" + "\n".join(tests) + "\n"
    return run_program(program, limits)[0]

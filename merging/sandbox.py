"""Runs model-written Python in a namespace sandbox, never in the evaluating process.

Nothing in the Python standard library or in lm-eval isolates untrusted code (lm-eval's code tasks
delegate to the `evaluate` package's code_eval, which execs in forked workers of the evaluating
process). Here each program runs under bubblewrap (`bwrap`, Debian's `bubblewrap`; see
docs/SECURITY.md), which gives it:
- private user, PID, network, IPC, UTS and mount namespaces: no network (not even the host's
  127.0.0.1), no other process to see or signal, its own /proc (no evaluator environment to read);
- a read-only root holding only the interpreter (its prefix) and the shared libraries;
- an empty 16 MiB tmpfs as its working folder, gone when it ends: nothing on the host is writable;
- die-with-parent, and the whole namespace dies with its first process (no daemon survives);
- an unprivileged uid with no capabilities, a cleared environment, nothing on stdin;
- rlimits on CPU time, address space, file size and open files; stderr goes to a file capped by
  the file-size limit (no pipe to fill the evaluator's memory), and every wait has a timeout.
Where bwrap is missing or cannot create namespaces, code evaluation is refused with one line: there
is no unsandboxed fall-back. Nothing runs unless the user opted in with HF_ALLOW_CODE_EVAL=1, the
switch lm-eval's own code tasks use.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

OPT_IN = "HF_ALLOW_CODE_EVAL"
WORKDIR = "/sandbox"
GRACE = 5.0  # seconds to reap the sandbox after it was killed
BWRAP_ENV = {"PATH": os.defpath}


@dataclass(frozen=True)
class Limits:
    seconds: float = 5.0  # wall clock; CPU time is limited to the same
    memory_mib: int = 512
    file_kib: int = 1024  # any file, stderr included
    open_files: int = 32
    workdir_mib: int = 16  # the writable tmpfs


class CodeExecutionNotAllowed(PermissionError):
    pass


def check_opt_in() -> None:
    """Raise CodeExecutionNotAllowed (one line) unless the user opted in and the sandbox works here."""
    if os.environ.get(OPT_IN) != "1":
        raise CodeExecutionNotAllowed(
            f"{OPT_IN}: running model-written code needs an explicit opt-in; set {OPT_IN}=1 to allow it "
            "(the code runs in a bubblewrap namespace sandbox with a timeout and CPU/memory limits)"
        )
    problem = _sandbox_problem()
    if problem:
        raise CodeExecutionNotAllowed(f"sandbox: {problem}; model-written code is never run unsandboxed")


@functools.cache
def _sandbox_problem() -> str | None:
    """Why the sandbox cannot run here (None: it can), from one trial run of `python -c pass`."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed; install it (Debian/Ubuntu: apt-get install bubblewrap; `make setup` tries)"
    with tempfile.TemporaryDirectory(prefix="logitcomp-sandbox-") as tmp:
        (Path(tmp) / "program.py").write_text("pass\n")
        try:
            proc = subprocess.run(_command(Path(tmp) / "program.py", Limits()), capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL, env=BWRAP_ENV)
        except subprocess.TimeoutExpired:
            return "bwrap did not finish a trial run in 30 s"
    if proc.returncode != 0:
        return f"bwrap cannot create its namespaces here ({(proc.stderr.strip().splitlines() or ['exit ' + str(proc.returncode)])[-1]})"
    return None


def _command(program: Path, limits: Limits) -> list[str]:
    python = Path(sys._base_executable).resolve()  # the real interpreter, not a venv's link to it
    prefix = Path(sys.base_prefix).resolve()
    binds = ["--ro-bind", "/usr/lib", "/usr/lib", "--ro-bind-try", "/usr/lib64", "/usr/lib64"]
    for top in ("lib", "lib64"):  # merged-/usr systems link /lib to usr/lib; others have real folders
        path = Path("/") / top
        binds += ["--symlink", f"usr/{top}", f"/{top}"] if path.is_symlink() else ["--ro-bind-try", str(path), str(path)]
    if not prefix.is_relative_to("/usr/lib"):
        binds += ["--ro-bind", str(prefix), str(prefix)]
    return [
        shutil.which("bwrap"), "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--disable-userns",
        "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL", "--clearenv",
        "--setenv", "PATH", "/usr/bin", "--setenv", "HOME", WORKDIR, "--setenv", "TMPDIR", WORKDIR,
        "--setenv", "PYTHONHASHSEED", "0",
        *binds, "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.workdir_mib * 2**20), "--tmpfs", WORKDIR,
        "--ro-bind", str(program), f"{WORKDIR}/program.py", "--remount-ro", "/", "--chdir", WORKDIR,
        str(python), "-I", "-S", "program.py",
    ]


def _limit(limits: Limits):
    def apply() -> None:  # runs in bwrap between fork and exec; the program inherits the limits
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

    Raises:
        CodeExecutionNotAllowed: no opt-in, or no working sandbox on this machine.
    """
    check_opt_in()
    with tempfile.TemporaryDirectory(prefix="logitcomp-sandbox-") as tmp:
        (Path(tmp) / "program.py").write_text(program)
        with open(Path(tmp) / "stderr", "wb") as err:
            proc = subprocess.Popen(_command(Path(tmp) / "program.py", limits), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, preexec_fn=_limit(limits),
                                    env=BWRAP_ENV)  # bwrap is pid 1 inside: its /proc/1/environ is readable there
            try:
                proc.wait(timeout=limits.seconds)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap; its namespace and everything in it die with it
                proc.wait(timeout=GRACE)
                return False, f"timed out after {limits.seconds} s"
        with open(Path(tmp) / "stderr", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 2000))
            tail = f.read().decode(errors="replace")[-500:]
    # bwrap exits with 128 + N when the program was killed by signal N (SIGXCPU from the CPU limit, ...)
    if proc.returncode > 128 and proc.returncode - 128 in signal.valid_signals():
        return False, f"killed by {signal.Signals(proc.returncode - 128).name}"
    return proc.returncode == 0, tail


def passes_tests(prompt: str, completion: str, tests: list[str], limits: Limits = Limits()) -> bool:
    """Whether the function `prompt + completion` passes every assert line in `tests`."""
    program = prompt + completion + "\n\n\n" + "\n".join(tests) + "\n"
    return run_program(program, limits)[0]

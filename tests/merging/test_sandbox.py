"""The code sandbox: one test per escape that the rlimit-only sandbox allowed (issue 13), the limits,
and the refusals. Each escape test reads the effect on the host, not only the program's exit status."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from merging import sandbox
from merging.worlds.smol.data import code_tasks
from merging.sandbox import GRACE, OPT_IN, CodeExecutionNotAllowed, Limits, passes_tests, run_program

ROOT = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(os.environ.get(OPT_IN, "1") and sandbox._sandbox_problem() is not None,
                                 reason=f"no working bubblewrap here: {sandbox._sandbox_problem()}")


@pytest.fixture(autouse=True)
def opted_in(monkeypatch):
    monkeypatch.setenv(OPT_IN, "1")


def _evaluator(code: str, **env) -> subprocess.CompletedProcess:
    """`code` in a separate evaluating process (so that an escape that kills the evaluator cannot kill pytest)."""
    env = {**os.environ, OPT_IN: "1", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@needs_bwrap
def test_writes_never_reach_the_host(tmp_path):
    target = tmp_path / "escaped.txt"
    for path in (target, Path("/tmp") / f"escaped-{os.getpid()}.txt"):
        ok, why = run_program(f"open({str(path)!r}, 'w').write('x')\n")
        assert not ok and not path.exists(), why
    ok, why = run_program("open('here.txt', 'w').write('x' * 1000)\nassert open('here.txt').read() == 'x' * 1000\n")
    assert ok, why  # its own working folder is writable


@needs_bwrap
def test_user_files_can_be_neither_listed_nor_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t-value")
    listdir = "print(__import__('os').listdir({!r}))"
    for program, leak in ((f"print(open({str(secret)!r}).read())", "s3cr3t-value"), (listdir.format(str(tmp_path)), "secret.txt"),
                          (listdir.format(str(ROOT)), "Makefile")):
        ok, why = run_program(f"import sys\nsys.stdout = sys.stderr\n{program}\n")
        assert not ok and leak not in why, why


@needs_bwrap
def test_the_evaluators_environment_is_out_of_reach():
    """An evaluator holding a secret in its environment (as a process sees it: /proc/PID/environ)."""
    program = ("import os, sys\nfound = []\n"
               "for pid in [os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
               "    try:\n        found.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))\n"
               "    except OSError:\n        pass\n"
               "print(found, file=sys.stderr)\nassert any('hun' + 'ter2' in f for f in found)\n")
    proc = _evaluator(f"from merging.sandbox import run_program\nprint(run_program({program!r}))\n",
                      LOGITCOMP_TEST_SECRET="hunter2-token")
    assert proc.returncode == 0 and proc.stdout.startswith("(False, ") and "hunter2" not in proc.stdout, proc.stdout + proc.stderr


@needs_bwrap
def test_no_network_not_even_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port, accepted = server.getsockname()[1], []
    thread = threading.Thread(target=lambda: accepted.append(_accept(server)))
    thread.start()
    ok, why = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'escaped')\n")
    thread.join()
    server.close()
    assert not ok and accepted == [None], why


def _accept(server):
    try:
        return server.accept()[0].recv(16)
    except OSError:
        return None


@needs_bwrap
def test_the_evaluating_process_cannot_be_signalled():
    proc = _evaluator(
        "import os\nfrom merging.sandbox import run_program\n"
        "print(run_program(f'import os, signal\\nfor pid in (os.getppid(), {os.getpid()}):\\n"
        "    try:\\n        os.kill(pid, signal.SIGKILL)\\n    except OSError:\\n        pass\\n'.replace('{os.getpid()}', str(os.getpid()))))\n"
        "print('evaluator survived')\n")
    assert proc.returncode == 0 and "evaluator survived" in proc.stdout, proc.stderr[-500:]


def _daemon(marker: str, seconds: int) -> str:
    """A program that leaves a child in a new session (stderr kept open) running `seconds` s, then exits."""
    return ("import os, sys\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep({seconds})', {marker!r}])\n")


def _alive_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@needs_bwrap
def test_no_process_outlives_the_program_and_every_wait_is_bounded():
    marker = f"logitcomp-daemon-{os.getpid()}-{time.time_ns()}"
    start = time.perf_counter()
    try:
        run_program(_daemon(marker, 20), Limits(seconds=2))
        elapsed = time.perf_counter() - start
        time.sleep(0.5)
        survivors = _alive_with(marker)
    finally:
        for pid in _alive_with(marker):  # on a sandbox that does not isolate, do not leave it behind
            os.kill(pid, 9)
    assert elapsed < 2 + GRACE, f"took {elapsed:.1f} s"
    assert not survivors
    start = time.perf_counter()
    ok, why = run_program("import time\ntime.sleep(60)\n", Limits(seconds=1))
    assert not ok and why == "timed out after 1 s" and time.perf_counter() - start < 1 + GRACE


@needs_bwrap
def test_an_stderr_flood_does_not_grow_the_evaluator():
    proc = _evaluator(
        "import resource\nfrom merging.sandbox import Limits, run_program\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "ok, why = run_program('import sys\\nwhile True:\\n    sys.stderr.write(\"x\" * 2**20)\\n', Limits(seconds=3))\n"
        "print(ok, len(why), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    ok, length, grown_mib = proc.stdout.split()
    assert ok == "False" and int(length) <= 500 and int(grown_mib) < 64, proc.stdout


@needs_bwrap
def test_limits_and_a_clean_working_folder():
    ok, why = run_program("while True:\n    pass\n", Limits(seconds=1))
    assert not ok and why in ("timed out after 1 s", "killed by SIGXCPU", "killed by SIGKILL"), why
    ok, why = run_program("x = bytearray(2 * 1024**3)\n", Limits(memory_mib=256))
    assert not ok and "MemoryError" in why
    ok, why = run_program("import os\nassert os.listdir('.') == ['program.py']\nassert 'HF_ALLOW_CODE_EVAL' not in os.environ\n"
                          "assert os.getuid() == 65534\n")
    assert ok, why  # an empty folder, a cleared environment, an unprivileged user
    ok, why = run_program("import os\nfor i in range(100):\n    open(f'f{i}', 'wb').write(os.urandom(2**20))\n")
    assert not ok and "No space left" in why, why  # the writable folder is a small tmpfs


@needs_bwrap
def test_reference_solutions_pass_and_wrong_ones_fail():
    for d in code_tasks("test", 64):
        assert passes_tests(d["prompt"], d["solution"], d["tests"]), d["name"]
    d = code_tasks("test", 1)[0]
    assert not passes_tests(d["prompt"], "    return None\n", d["tests"])
    assert not passes_tests(d["prompt"], "    return (\n", d["tests"])  # syntax error


def test_refused_without_the_opt_in(monkeypatch, tmp_path):
    monkeypatch.delenv(OPT_IN, raising=False)
    marker = tmp_path / "ran"
    with pytest.raises(CodeExecutionNotAllowed, match=OPT_IN):
        run_program(f"open({str(marker)!r}, 'w').write('x')")
    monkeypatch.setenv(OPT_IN, "0")
    with pytest.raises(CodeExecutionNotAllowed):
        passes_tests("def f():\n", "    return 1\n", ["assert f() == 1"])
    assert not marker.exists()


def test_refused_in_one_line_where_bubblewrap_cannot_run(monkeypatch, tmp_path):
    """No silent fall-back to an unsandboxed run."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._sandbox_problem.cache_clear()
    try:
        with pytest.raises(CodeExecutionNotAllowed, match=r"^sandbox: bubblewrap \(bwrap\) is not installed.*never run unsandboxed$"):
            run_program(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')")
    finally:
        sandbox._sandbox_problem.cache_clear()
    assert not (tmp_path / "ran").exists()

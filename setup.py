"""Ships `logitcomp-lm-eval.pth` into site-packages, for regular and editable installs.

Everything else lives in pyproject.toml. setuptools has no declarative way to put a file at
the top of a wheel (data_files land under the install prefix, and editable wheels carry no
build_py output), hence the two small command overrides; the .pth is what lets the plain
`lm_eval --model logitcomp` command find the model (see merging/harness/plugin.py).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "logitcomp-lm-eval.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, str(Path(self.build_lib, PTH)), preserve_mode=0)


class _StrategyWithPth:
    """Wraps setuptools' editable strategy: writes its files, then the .pth."""

    def __init__(self, strategy):
        self._strategy = strategy

    def __enter__(self):
        self._strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self._strategy.__exit__(*exc)

    def __call__(self, wheel, files, mapping):
        self._strategy(wheel, files, mapping)
        wheel.writestr(PTH, Path(PTH).read_bytes())


class editable_wheel_with_pth(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": build_py_with_pth, "editable_wheel": editable_wheel_with_pth})

"""The worlds models are trained in here (toy, SmolLM2, Gemma 3), each a sub-package with its data,
training and build commands; `common` holds what they share, `commands` their shared CLI commands.

`WORLDS` maps a world's name to the function that adds its `logitcomp <world> ...` commands (only
the CLI imports this package). The runner and the lm-eval tasks import no world.
"""

from .gemma.cli import add_commands as _gemma
from .smol.cli import add_commands as _smol
from .toy.cli import add_commands as _toy

WORLDS = {"toy": _toy, "smol": _smol, "gemma": _gemma}

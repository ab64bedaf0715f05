"""The lm-evaluation-harness integration, in one place. Importing this package imports nothing.

    model.py        the `logitcomp` lm-eval model (LogitcompLM over a composition) and InMemoryHFLM
    evaluate.py     one row through lm-eval's `simple_evaluate` (task index, outputs written atomically)
    distributed.py  data parallelism under torchrun / accelerate launch for models passed in memory
    plugin.py       registers `logitcomp` for the plain `lm_eval` command (imported by the installed .pth)
    cli.py          the `logitcomp-lm-eval` console script (lm-eval's CLI with the shipped tasks)
"""

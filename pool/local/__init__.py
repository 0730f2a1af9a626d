"""Local model workers: an inference engine in a supervised child process.

The gateway never imports an engine. :class:`~pool.local.worker.LocalWorker`
is a :class:`~pool.process.ProcessWorker` whose child (``python -m
pool.local``) loads one :class:`~pool.local.engine.Engine` and answers the
worker protocol with :mod:`pool.local.chat`, the engine-independent layer:
chat template, detokenisation, stop strings, tool-call parsing, logprobs.
"""

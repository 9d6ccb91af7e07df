"""The benchmarks, one folder per topic: every module with a ``main`` is a command, run from the
repository root as ``python -m benchmarks.TOPIC.NAME`` (``--help`` for its arguments). Shared helpers are
in ``benchmarks.common``; the layout and what each command measures: docs/benchmarks.md."""

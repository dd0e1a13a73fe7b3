"""vLLM-compatible (OpenAI-compatible) stub upstream for development, demos, tests and benchmarks.

A separate root package: it imports nothing else of the project, so it can run anywhere
the gateway is tested. Entry points: ``stub.cli`` (``gateway stub``) and ``python -m stub``.
"""

"""Adapters for the frameworks teams train with, one module each (``hf``, ``megatron``, ``torchtitan``,
``torchdata``, ``lightning``);
each imports its framework only when used. docs/frameworks.md shows each one's start."""

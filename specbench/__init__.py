"""specbench: benchmark and tune LLM speculative decoding on your own prompts."""

__version__ = "0.1.0"

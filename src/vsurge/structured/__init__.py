"""Structured outputs and tool calling: constraints, grammar matchers, token bitmasks, tool-call parsers."""

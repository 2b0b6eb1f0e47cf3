"""Lab stand-in for a kernel wheel built once per fleet (flash-attn on real hosts)."""

__version__ = "0.1.0"

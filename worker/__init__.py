"""The Chronoshard worker SDK."""

__all__: list[str] = []

"""Test harness for end-to-end and fault tests: real scheduler and worker processes."""

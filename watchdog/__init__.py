"""The Chronoshard watchdog: a separate dead man's switch process. Imports nothing from
``chronoshard.scheduler``."""

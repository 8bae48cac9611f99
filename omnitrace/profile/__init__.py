"""Flame graphs of stage processes (py-spy, pyinstrument)."""

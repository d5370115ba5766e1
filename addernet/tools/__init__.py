"""User tools above the engine: each module is a command, ``python -m addernet.tools.<name>``.

``scripts/<name>.py`` are the same commands under their documented names.
"""

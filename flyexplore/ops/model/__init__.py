"""The ``model`` operator family: one forward step of a whole model, timed per variant."""

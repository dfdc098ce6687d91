"""The tests, one folder per package layer (tests/<layer>/, each a package, so that a layer's own
conftest.py and test modules get unique names: tests.run.conftest, tests.ui.test_widgets).
``pythonpath = ["tests"]`` in pyproject.toml keeps ``from conftest import ROOT`` and
``fault_ops:FAULTS`` importable from every folder."""

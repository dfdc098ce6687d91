"""Sweeps: what a sweep is, every option checked once (spec), one case built, checked and timed
(cases), resume and rows written (sweep), worker processes and Ray (engine, _ray).
"""

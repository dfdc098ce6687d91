"""Sweeps: options checked once (validate), one case built, checked and timed (cases), the plan,
resume and rows written (sweep), worker processes and Ray (engine, _ray).
"""

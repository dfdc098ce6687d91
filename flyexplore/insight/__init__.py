"""Dispatch insight: would FlyDSL be taken and why (explain), what really ran (trace, autotune),
the compile-only kernel X-ray (xray, its worker, isa). Reads the catalogue and the world below it.
"""

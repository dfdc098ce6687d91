"""TopK (M, N, K, largest, sorted, deterministic): operator.py, flydsl.py, xray.py.
"""

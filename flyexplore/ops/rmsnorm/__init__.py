"""RMSNorm (M, N, eps, weight): operator.py, flydsl.py (the eager override's rules), xray.py.
"""

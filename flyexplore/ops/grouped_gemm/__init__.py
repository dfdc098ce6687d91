"""Grouped GEMM (MoE: G, M, N, K, ragged ms=): operator.py, flydsl.py, xray.py.
"""

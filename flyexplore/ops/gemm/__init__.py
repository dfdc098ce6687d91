"""Dense GEMM (M, N, K, layout): operator.py (catalogue, backends, published table),
flydsl.py (Inductor's FLYDSL mm template rules), xray.py (its X-ray builder).
"""

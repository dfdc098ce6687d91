"""Scaled GEMM (MXFP8, MXFP4, FP8 tensor/row-wise): operator.py, flydsl.py, xray.py, and mx.py
(OCP MX quantization: e4m3/e2m1 data, e8m0 scales per 32 elements).
"""

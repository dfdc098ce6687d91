"""SDPA attention: operator.py, flydsl.py (the AOTriton route), sdpa.py (torch's own SDPA
backend checks), aotriton.py (what AOTriton 0.13b / 0.14.2b build).
"""

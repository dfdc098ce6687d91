"""Notebook widgets: the sweep panel, switch panel, dispatch inspector, environment view
(widgets is the entry module), and the walkthroughs' sizes and headless runs (notebooks).
"""

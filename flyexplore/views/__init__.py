"""Views of result sets: figures (plots, plots_compare, aotriton, plot_style), export to
PNG/SVG/PDF/HTML and tables (export), the HTML report (report). Never changes the data.
"""
